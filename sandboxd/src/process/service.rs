//! The gRPC faces of [`super`]: `process.v1.ProcessService` over the
//! daemon's process table (Execute, Start, WriteStdin, SendSignal,
//! ResizeTTY, ...), and Sandhub's `keep.v1.KeptProcessService` (Start,
//! List, Attach) over its kept processes. What they run and how is the
//! parent's.

use super::*;

pub struct ProcessService {
    pub daemon: Arc<Daemon>,
}

impl ProcessService {
    fn control(&self, pid: i32) -> Result<Arc<Control>> {
        self.daemon
            .processes
            .lookup(pid)
            .ok_or_else(|| Error::NotFound(format!("process {pid} not found")))
    }

    fn start_process(&self, req: pb::StartRequest) -> Result<ReceiverStream<Event>> {
        let started = self.spawn_started(&req, false)?;
        let (tx, rx) = mpsc::channel(START_QUEUE);
        // A fresh channel has room, so `init` is always the first event.
        let _ = tx.try_send(event(pb::start_response::Event::Init(pb::InitEvent {
            process_id: started.pid,
        })));
        tokio::spawn(drive(
            started,
            Sink::Client(tx),
            self.daemon.config.stream_chunk_size,
        ));
        Ok(ReceiverStream::new(rx))
    }

    /// `keep.v1` Start: as `start_process`, but the process writes to a
    /// kept tail and its stream is one reader of that tail.
    pub(super) fn start_kept(
        &self,
        req: kpb::StartRequest,
    ) -> Result<ReceiverStream<kept::AttachEvent>> {
        let label = kept::label("label", req.label)?;
        let tag = kept::label("tag", req.tag)?;
        let start = req.start.unwrap_or_default();
        self.daemon.processes.kept.admit()?;
        let started = self.spawn_started(&start, req.stdin_closed)?;
        let record = Arc::new(kept::Kept::new(
            started.pid,
            (label, tag),
            start.config.unwrap_or_default(),
            start.pty.is_some(),
        ));
        self.daemon.processes.kept.insert(record.clone());
        tracing::debug!(pid = started.pid, "process kept past its stream");
        tokio::spawn(drive(
            started,
            Sink::Kept(record.clone()),
            self.daemon.config.stream_chunk_size,
        ));
        Ok(self.attach_to(record))
    }

    /// One more reader of a kept process.
    pub(super) fn attach_to(&self, record: Arc<kept::Kept>) -> ReceiverStream<kept::AttachEvent> {
        let (tx, rx) = mpsc::channel(START_QUEUE);
        tokio::spawn(kept::follow(record, tx));
        ReceiverStream::new(rx)
    }

    /// Spawns what a `Start` asks for, registered with its controls. With
    /// `stdin_closed` (and no terminal) the process's stdin pipe is closed
    /// at once, as a `WriteStdin` of `eof` would close it.
    fn spawn_started(&self, req: &pb::StartRequest, stdin_closed: bool) -> Result<Started> {
        let config = req.config.clone().unwrap_or_default();
        let launch = Launch::from(&config);
        let mut cmd = launch.command(&self.daemon)?;
        cmd.stdin(Stdio::Piped);
        let slot = self.daemon.processes.reserve()?;
        let started = Instant::now();
        let (child, pid, input, output) = match &req.pty {
            None => {
                cmd.lead(Lead::Group)
                    .stdout(Stdio::Piped)
                    .stderr(Stdio::Piped);
                let (mut child, pid) = spawn(&mut cmd, &launch)?;
                let stdin = child.stdin.take().filter(|_| !stdin_closed);
                let input = Input::Pipe(Mutex::new(stdin));
                let stdout = child.stdout.take().expect("stdout is piped");
                let stderr = child.stderr.take().expect("stderr is piped");
                (child, pid, input, Output::Pipes(stdout, stderr))
            }
            Some(size) => {
                let (master, slave) = pty::open(size.cols, size.rows)
                    .map_err(|e| Error::Internal(format!("allocating a terminal: {e}")))?;
                let copy = |fd: &std::os::fd::OwnedFd| {
                    fd.try_clone()
                        .map_err(|e| Error::Internal(format!("duplicating the terminal: {e}")))
                };
                // Its own session with the terminal as its controlling one
                // (which makes it a group leader too).
                cmd.stdin(Stdio::Fd(copy(&slave)?))
                    .stdout(Stdio::Fd(copy(&slave)?))
                    .stderr(Stdio::Fd(slave))
                    .lead(Lead::Terminal);
                let (child, pid) = spawn(&mut cmd, &launch)?;
                let master = Arc::new(master);
                (child, pid, Input::Pty(master.clone()), Output::Pty(master))
            }
        };
        // The spawn closed our copies of the terminal's slave end, so EIO
        // marks the end of output.
        let control = Arc::new(Control { pgid: pid, input });
        let reg = Registration::new(self.daemon.clone(), slot, pid, started, Some(control));
        Ok(Started {
            reg,
            child,
            output,
            pid,
        })
    }

    async fn write_stdin(&self, req: pb::WriteStdinRequest) -> Result<()> {
        use pb::write_stdin_request::Payload;
        let pid = req.process_id;
        let control = self.control(pid)?;
        let _writing = self.daemon.processes.writing()?;
        let closed = || Error::FailedPrecondition(format!("stdin of process {pid} is closed"));
        match (&control.input, req.payload) {
            (Input::Pipe(stdin), Some(Payload::Eof(()))) => {
                // Dropping the pipe closes it; a second EOF is a no-op, as
                // upstream (the process may have closed it first anyway).
                stdin.lock().await.take();
                Ok(())
            }
            (Input::Pipe(stdin), data) => {
                let data = match data {
                    Some(Payload::Input(d)) => d,
                    _ => Bytes::new(),
                };
                let mut stdin = stdin.lock().await;
                let pipe = stdin.as_mut().ok_or_else(closed)?;
                pipe.write_all(&data).await.map_err(|e| match e.kind() {
                    io::ErrorKind::BrokenPipe => Error::FailedPrecondition(format!(
                        "process {pid} no longer reads its stdin"
                    )),
                    _ => Error::Internal(format!("writing stdin of process {pid}: {e}")),
                })
            }
            (Input::Pty(master), payload) => {
                let written = match payload {
                    Some(Payload::Eof(())) => master.send_eof().await,
                    Some(Payload::Input(d)) => master.write_all(&d).await,
                    None => Ok(()),
                };
                written
                    .map_err(|e| Error::Internal(format!("writing to the terminal of {pid}: {e}")))
            }
        }
    }

    fn send_signal(&self, req: pb::SendSignalRequest) -> Result<()> {
        let control = self.control(req.process_id)?;
        let sig = match pb::Signal::try_from(req.signal) {
            Ok(pb::Signal::Sigint) => Signal::INT,
            Ok(pb::Signal::Sigterm) => Signal::TERM,
            Ok(pb::Signal::Sigkill) => Signal::KILL,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "unsupported or unspecified signal: {}",
                    req.signal
                )))
            }
        };
        signal_group(control.pgid, sig)
            .map_err(|e| Error::Internal(format!("signalling process {}: {e}", req.process_id)))
    }

    fn resize_tty(&self, req: pb::ResizeTtyRequest) -> Result<()> {
        let pid = req.process_id;
        let Input::Pty(master) = &self.control(pid)?.input else {
            return Err(Error::FailedPrecondition(format!(
                "process {pid} has no terminal"
            )));
        };
        master
            .resize(req.cols, req.rows)
            .map_err(|e| Error::FailedPrecondition(format!("resizing the terminal of {pid}: {e}")))
    }
}

#[tonic::async_trait]
impl pb::process_service_server::ProcessService for ProcessService {
    type StartStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::StartResponse, Status>> + Send>>;

    async fn start(
        &self,
        request: Request<pb::StartRequest>,
    ) -> Result<Response<Self::StartStream>, Status> {
        let stream = self.start_process(request.into_inner())?;
        Ok(Response::new(Box::pin(stream)))
    }

    async fn execute(
        &self,
        request: Request<pb::ExecuteRequest>,
    ) -> Result<Response<pb::ExecuteResponse>, Status> {
        let config = request.into_inner().config.unwrap_or_default();
        let done = execute(&self.daemon, &config, None).await?;
        Ok(Response::new(done.into_response()))
    }

    async fn write_stdin(
        &self,
        request: Request<pb::WriteStdinRequest>,
    ) -> Result<Response<pb::WriteStdinResponse>, Status> {
        ProcessService::write_stdin(self, request.into_inner()).await?;
        Ok(Response::new(pb::WriteStdinResponse {}))
    }

    async fn send_signal(
        &self,
        request: Request<pb::SendSignalRequest>,
    ) -> Result<Response<pb::SendSignalResponse>, Status> {
        ProcessService::send_signal(self, request.into_inner())?;
        Ok(Response::new(pb::SendSignalResponse {}))
    }

    async fn resize_tty(
        &self,
        request: Request<pb::ResizeTtyRequest>,
    ) -> Result<Response<pb::ResizeTtyResponse>, Status> {
        ProcessService::resize_tty(self, request.into_inner())?;
        Ok(Response::new(pb::ResizeTtyResponse {}))
    }
}

/// The gRPC face of `super::kept`: `keep.v1.KeptProcessService`, a Sandhub
/// extension. Kept processes are ordinary started processes besides, so
/// `process.v1`'s pid calls (stdin, signals, resize) reach them too.
pub struct KeptProcessService {
    pub daemon: Arc<Daemon>,
}

impl KeptProcessService {
    fn processes(&self) -> ProcessService {
        ProcessService {
            daemon: self.daemon.clone(),
        }
    }
}

type AttachStream = std::pin::Pin<Box<dyn futures::Stream<Item = kept::AttachEvent> + Send>>;

#[tonic::async_trait]
impl kpb::kept_process_service_server::KeptProcessService for KeptProcessService {
    type StartStream = AttachStream;
    type AttachStream = AttachStream;

    async fn start(
        &self,
        request: Request<kpb::StartRequest>,
    ) -> Result<Response<AttachStream>, Status> {
        let stream = self.processes().start_kept(request.into_inner())?;
        Ok(Response::new(Box::pin(stream)))
    }

    async fn list(
        &self,
        request: Request<kpb::ListRequest>,
    ) -> Result<Response<kpb::ListResponse>, Status> {
        let label = kept::label("label", request.into_inner().label)?;
        Ok(Response::new(kpb::ListResponse {
            processes: self.daemon.processes.kept.list(&label),
        }))
    }

    async fn attach(
        &self,
        request: Request<kpb::AttachRequest>,
    ) -> Result<Response<AttachStream>, Status> {
        let req = request.into_inner();
        let label = kept::label("label", req.label)?;
        let record = self.daemon.processes.kept.get(req.process_id, &label)?;
        Ok(Response::new(Box::pin(self.processes().attach_to(record))))
    }
}
