//! The hub and a starting sandbox talk over one `SOCK_SEQPACKET` socket
//! pair handed to stage 1 as its stdin: message boundaries come for free,
//! either side sees EOF when the other dies, and no extra fd has to be
//! made inheritable in the (multi-threaded) hub.
//!
//! ```text
//! hub                                      sandbox
//!  |                                        stage 1 started ahead (a spare,
//!  |                                        see `spare.rs`)
//!  | -- LogFilter(text) ------------------> stage 1 sets up sandboxd's
//!  |                                        logging, then waits
//!  | -- Log(fd) --------------------------> stage 1: the sandbox's log
//!  |                                        becomes its stdout and stderr
//!  | -- Config(json) ---------------------> stage 1
//!  |  (cgroup renamed and limited           unshares user, mount, UTS, IPC,
//!  |   before, see below; then binds        PID, cgroup, net; opens host paths
//!  |   sandboxd's sockets)
//!  | <-------------------------- Unshared -- stage 1
//!  |  (writes uid_map/gid_map)
//!  | -- Mapped(rest fd, grpc fd) ---------> stage 1 becomes root: the shim
//!  | <--------------------------- ShimPid -- the shim (stage 1's pid), then
//!  |                                        it forks PID 1
//!  | <----------------------------- Ready -- sandboxd, once its sockets accept
//!  | <---------------------- Error(text) -- any stage, instead of the above
//! ```
//!
//! On cgroup v1 the first migration of a process into a cgroup after a
//! quiet spell waits for an RCU grace period (5-19 ms measured here), so a
//! spare is moved into a cgroup of its own when it is started, and that
//! cgroup is renamed to the sandbox's and given its limits before `Config`
//! (see `spare.rs`). Where cgroups cannot be renamed (v2), the launch
//! makes the sandbox's cgroup and moves stage 1 into it, also before
//! `Config`. Either way stage 1 is in its cgroup when it unshares, so the
//! cgroup namespace is rooted there and everything it forks starts inside.

use std::{
    collections::BTreeMap,
    io::{self, IoSlice, IoSliceMut},
    mem::MaybeUninit,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::PathBuf,
    time::Duration,
};

use rustix::net::{
    self, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use sandboxd::server::UnixListeners;
use serde::{Deserialize, Serialize};

use super::idmap::IdMap;

/// Everything the inside needs to know, sent as the first message (never
/// on the command line, where every host user could read `env`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct InitConfig {
    pub id: String,
    /// Host path of the sandbox's state dir (see `launch::StateDirs`).
    pub state_dir: PathBuf,
    /// Host paths, topmost first.
    pub lower_layers: Vec<PathBuf>,
    pub root_fs: Option<PathBuf>,
    /// The sanitized copy of the host's `/etc` (unused with `root_fs`).
    pub host_etc: PathBuf,
    pub env: BTreeMap<String, String>,
    /// sandboxd's `--default-cwd`.
    #[serde(default)]
    pub workdir: Option<String>,
    /// sandboxd's `--user`.
    #[serde(default)]
    pub user: Option<String>,
    /// sandboxd's `--entrypoint` (empty: none).
    #[serde(default)]
    pub entrypoint: Vec<String>,
    pub network_host: bool,
    /// The sandbox's memory limit: its tmpfs mounts are sized below it.
    pub memory_mb: Option<u64>,
    /// sandboxd's `--max-upload-bytes`.
    pub max_upload_bytes: u64,
    /// Named volumes to bind (see `volumes.rs`).
    #[serde(default)]
    pub volumes: Vec<super::VolumeBind>,
    pub idmap: IdMap,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Msg {
    /// sandboxd's `tracing` filter: a spare's first message.
    LogFilter(String),
    Config(Vec<u8>),
    Unshared,
    ShimPid(i32),
    Mapped,
    Ready,
    Error(String),
}

const CONFIG: u8 = b'C';
const UNSHARED: u8 = b'U';
const SHIM_PID: u8 = b'P';
const MAPPED: u8 = b'M';
const READY: u8 = b'R';
const ERROR: u8 = b'E';
const LOG_FILTER: u8 = b'F';
/// The messages with fds (SCM_RIGHTS): the sandbox's log, and `Mapped`
/// with sandboxd's two listening sockets.
const LOG: u8 = b'L';

/// Longest message accepted; the config is the only large one.
const MAX_MESSAGE: usize = 4 << 20;

#[derive(Debug)]
pub(crate) struct Channel(pub OwnedFd);

impl Channel {
    /// A connected pair: (hub end, sandbox end). Both close on exec; the
    /// sandbox end reaches stage 1 as its stdin, which the spawn dup2()s.
    pub fn pair() -> io::Result<(Channel, OwnedFd)> {
        let (a, b) = net::socketpair(
            net::AddressFamily::UNIX,
            net::SocketType::SEQPACKET,
            net::SocketFlags::CLOEXEC,
            None,
        )?;
        // Configs with large environments must fit into one datagram.
        let _ = net::sockopt::set_socket_send_buffer_size(&a, MAX_MESSAGE);
        let _ = net::sockopt::set_socket_recv_buffer_size(&b, MAX_MESSAGE);
        Ok((Channel(a), b))
    }

    pub fn send(&self, msg: &Msg) -> io::Result<()> {
        let mut buf = Vec::with_capacity(16);
        match msg {
            Msg::LogFilter(filter) => {
                buf.push(LOG_FILTER);
                buf.extend_from_slice(filter.as_bytes());
            }
            Msg::Config(json) => {
                buf.push(CONFIG);
                buf.extend_from_slice(json);
            }
            Msg::ShimPid(pid) => {
                buf.push(SHIM_PID);
                buf.extend_from_slice(&pid.to_le_bytes());
            }
            Msg::Unshared => buf.push(UNSHARED),
            Msg::Mapped => buf.push(MAPPED),
            Msg::Ready => buf.push(READY),
            Msg::Error(text) => {
                buf.push(ERROR);
                buf.extend_from_slice(text.as_bytes());
            }
        }
        if buf.len() > MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "sandbox config is {} bytes, more than {MAX_MESSAGE}",
                    buf.len()
                ),
            ));
        }
        // MSG_NOSIGNAL: a peer that died must give EPIPE, not kill us.
        let n = net::send(&self.0, &buf, SendFlags::NOSIGNAL)?;
        if n != buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short send on sync socket",
            ));
        }
        Ok(())
    }

    /// Hands stage 1 the sandbox's log (its first message after the log
    /// filter): a spare is started before anyone knows which sandbox it
    /// will be.
    pub fn send_log(&self, log: BorrowedFd<'_>) -> io::Result<()> {
        self.send_fds(LOG, &[log])
    }

    /// Stage 1's side of [`Channel::send_log`]: waits for it without a
    /// timeout (a spare may wait long); `None` at EOF (its hub is gone).
    pub fn recv_log(&self) -> io::Result<Option<OwnedFd>> {
        Ok(self.recv_fds::<1>(LOG, "the log fd")?.map(|[log]| log))
    }

    /// `Mapped` (the id maps are written), with sandboxd's listening
    /// sockets, which the hub bound while stage 1 unshared.
    pub fn send_mapped(&self, listeners: &UnixListeners) -> io::Result<()> {
        self.send_fds(MAPPED, &[listeners.rest.as_fd(), listeners.grpc.as_fd()])
    }

    /// Stage 1's side of [`Channel::send_mapped`]; `None` at EOF.
    pub fn recv_mapped(&self) -> io::Result<Option<UnixListeners>> {
        Ok(self
            .recv_fds::<2>(MAPPED, "Mapped with two sockets")?
            .map(|[rest, grpc]| UnixListeners {
                rest: rest.into(),
                grpc: grpc.into(),
            }))
    }

    /// A message of just `tag`, carrying `fds`.
    fn send_fds(&self, tag: u8, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut ancillary = SendAncillaryBuffer::new(&mut space);
        if !ancillary.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(io::Error::other("no room for the fds"));
        }
        let n = net::sendmsg(
            &self.0,
            &[IoSlice::new(&[tag])],
            &mut ancillary,
            SendFlags::NOSIGNAL,
        )?;
        if n != 1 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short send on sync socket",
            ));
        }
        Ok(())
    }

    /// Waits (without a timeout) for a message of just `tag` carrying
    /// exactly `N` fds; anything else is `InvalidData` naming `what`, and
    /// fds that came with it are closed. `None` at EOF.
    fn recv_fds<const N: usize>(&self, tag: u8, what: &str) -> io::Result<Option<[OwnedFd; N]>> {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut ancillary = RecvAncillaryBuffer::new(&mut space);
        let mut got_tag = [0u8; 1];
        let got = loop {
            match net::recvmsg(
                &self.0,
                &mut [IoSliceMut::new(&mut got_tag)],
                &mut ancillary,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(r) => break r,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        let mut fds = Vec::with_capacity(N);
        for msg in ancillary.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = msg {
                fds.extend(received);
            }
        }
        if got.bytes == 0 {
            return Ok(None);
        }
        let whole = !got
            .flags
            .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC);
        match <[OwnedFd; N]>::try_from(fds) {
            Ok(fds) if whole && got_tag[0] == tag => Ok(Some(fds)),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("expected {what}"),
            )),
        }
    }

    /// The next message; `None` once the peer closed its end. A `timeout`
    /// bounds the wait (`ErrorKind::TimedOut` when it passes).
    pub fn recv(&self, timeout: Option<Duration>) -> io::Result<Option<Msg>> {
        let timeout = timeout.map(|t| t.max(Duration::from_millis(1)));
        net::sockopt::set_socket_timeout(&self.0, net::sockopt::Timeout::Recv, timeout)?;
        // Peek at the length first so one allocation fits the message.
        let mut probe = [0u8; 1];
        let (_, len) = loop {
            match net::recv(&self.0, &mut probe, RecvFlags::PEEK | RecvFlags::TRUNC) {
                Ok(r) => break r,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "timed out waiting on the sandbox",
                    ))
                }
                Err(e) => return Err(e.into()),
            }
        };
        if len == 0 {
            return Ok(None);
        }
        if len > MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "oversized sync message",
            ));
        }
        let mut buf = vec![0u8; len];
        let (got, _) = loop {
            match net::recv(&self.0, &mut buf[..], RecvFlags::empty()) {
                Ok(r) => break r,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        decode(&buf[..got]).map(Some)
    }
}

fn decode(buf: &[u8]) -> io::Result<Msg> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed sync message");
    let (&tag, body) = buf.split_first().ok_or_else(bad)?;
    Ok(match tag {
        LOG_FILTER => Msg::LogFilter(String::from_utf8_lossy(body).into_owned()),
        CONFIG => Msg::Config(body.to_vec()),
        SHIM_PID => Msg::ShimPid(i32::from_le_bytes(body.try_into().map_err(|_| bad())?)),
        UNSHARED => Msg::Unshared,
        MAPPED => Msg::Mapped,
        READY => Msg::Ready,
        ERROR => Msg::Error(String::from_utf8_lossy(body).into_owned()),
        _ => return Err(bad()),
    })
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn round_trips_every_message_and_reports_eof() {
        let (hub, other) = Channel::pair().unwrap();
        let other = Channel(other);
        for msg in [
            Msg::LogFilter("sandboxd=debug,warn".into()),
            Msg::Config(b"{\"a\":1}".to_vec()),
            Msg::Unshared,
            Msg::ShimPid(4242),
            Msg::Mapped,
            Msg::Ready,
            Msg::Error("mounting /proc: EPERM".into()),
        ] {
            hub.send(&msg).unwrap();
            assert_eq!(other.recv(Some(Duration::from_secs(1))).unwrap(), Some(msg));
        }
        let err = other.recv(Some(Duration::from_millis(5))).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        // The log fd: the same open file arrives, and a plain message where
        // it is expected is refused.
        let log = tempfile::tempfile().unwrap();
        hub.send_log(log.as_fd()).unwrap();
        let got = std::fs::File::from(other.recv_log().unwrap().unwrap());
        use std::io::{Seek, Write};
        (&got).write_all(b"line").unwrap();
        assert_eq!((&log).stream_position().unwrap(), 4);
        hub.send(&Msg::Mapped).unwrap();
        let err = other.recv_log().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let err = other.recv(Some(Duration::from_millis(5))).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        // Mapped with the two listening sockets: the same sockets arrive
        // (a connection to the path reaches the received one), and a
        // Mapped with one fd only, or the log, is refused.
        let dir = tempfile::tempdir().unwrap();
        let bound = super::super::statedir::bind_listeners(dir.path()).unwrap();
        hub.send_mapped(&bound).unwrap();
        let got = other.recv_mapped().unwrap().unwrap();
        drop(bound);
        for (name, listener) in [
            (sandhub_api::sandboxd::REST_SOCKET, &got.rest),
            (sandhub_api::sandboxd::GRPC_SOCKET, &got.grpc),
        ] {
            let _client = std::os::unix::net::UnixStream::connect(dir.path().join(name)).unwrap();
            listener.set_nonblocking(true).unwrap();
            assert!(listener.accept().is_ok(), "{name} is the bound socket");
        }
        hub.send_fds(MAPPED, &[log.as_fd()]).unwrap();
        assert_eq!(
            other.recv_mapped().unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        hub.send_log(log.as_fd()).unwrap();
        assert_eq!(
            other.recv_mapped().unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        drop(hub);
        assert_eq!(other.recv(Some(Duration::from_secs(1))).unwrap(), None);
        assert!(other.recv_log().unwrap().is_none());
    }
}
