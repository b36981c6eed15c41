//! A local sandbox's TCP ports, as the hub reaches them: through sockets
//! made inside the sandbox's network namespace (`runtime::NetNs`), so the
//! sandbox keeps its own network and nothing is published on the host.
//! The namespace is opened once per shim and kept (`Namespaces`) until the
//! sandbox stops, sleeps or goes: a dial is then two `setns` and a
//! `socket`, no `/proc` walk.

use std::{
    collections::HashMap,
    io,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use sandhub_api::{error::Code, hub::ListeningPort};
use sandhub_client::{Error, Result};
use tokio::net::{TcpSocket, TcpStream};

use super::{
    runtime::{process_runs, NetNs},
    store::{SandboxRow, Shim},
    LocalBackend,
};

/// How long a connect to a port inside a sandbox may take (it is local:
/// anything slower is a stuck listener).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Past this many kept namespaces, those of shims that are gone are let go
/// (and if none is, the map starts again).
const MAX_NAMESPACES: usize = 4096;

/// The network namespaces of sandboxes whose ports were dialled, by
/// sandbox id, each with the shim it was opened through. The shim (pid and
/// start time) comes from the Ready check of the dial, so a sandbox resumed
/// under a new shim is opened again, never reached through the old one.
pub(super) struct Namespaces {
    by_id: Mutex<HashMap<String, (Shim, Arc<NetNs>)>>,
    cap: usize,
}

impl Default for Namespaces {
    fn default() -> Self {
        Namespaces::with_cap(MAX_NAMESPACES)
    }
}

impl Namespaces {
    fn with_cap(cap: usize) -> Self {
        Namespaces {
            by_id: Mutex::default(),
            cap,
        }
    }

    /// The namespace of sandbox `id`'s `shim`, opened now if it is not
    /// kept yet (outside the lock: `/proc` reads).
    pub(super) fn open(&self, id: &str, shim: Shim) -> io::Result<Arc<NetNs>> {
        self.open_with(id, shim, || NetNs::of_process(shim.pid, shim.start_time))
    }

    /// `open`, with the namespace opened by `of_process` (tests stand a
    /// stop in the race between it and the insert).
    fn open_with(
        &self,
        id: &str,
        shim: Shim,
        of_process: impl FnOnce() -> io::Result<NetNs>,
    ) -> io::Result<Arc<NetNs>> {
        if let Some((kept, ns)) = self.lock().get(id) {
            if *kept == shim {
                return Ok(ns.clone());
            }
        }
        let ns = Arc::new(of_process()?);
        {
            let mut by_id = self.lock();
            if by_id.len() >= self.cap && !by_id.contains_key(id) {
                by_id.retain(|_, (kept, _)| alive(*kept));
                if by_id.len() >= self.cap {
                    by_id.clear();
                }
            }
            by_id.insert(id.to_string(), (shim, ns.clone()));
        }
        // A stop forgets the sandbox after its shim is dead. This open may
        // have raced that stop: then the shim is found dead here, and the
        // entry just made is taken back. A shim alive now dies later, and
        // the stop's forget comes after.
        if !alive(shim) {
            let mut by_id = self.lock();
            if by_id
                .get(id)
                .is_some_and(|(_, kept)| Arc::ptr_eq(kept, &ns))
            {
                by_id.remove(id);
            }
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("sandbox process {} is gone", shim.pid),
            ));
        }
        Ok(ns)
    }

    /// Lets go of sandbox `id`'s namespace.
    pub(super) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Shim, Arc<NetNs>)>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether `shim` still runs (the same pid and start time, not a zombie).
fn alive(shim: Shim) -> bool {
    process_runs(shim.pid, shim.start_time)
}

pub(super) fn ns_error(id: &str, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::Unsupported => Error::new(Code::FailedPrecondition, e.to_string()),
        // Out of descriptors (a burst of connections past what the
        // proxy's caps reckon with): the hub is full for now, not the
        // sandbox broken, so the caller is told to come back, as at a cap.
        _ if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => Error::new(
            Code::ResourceExhausted,
            format!("the hub is out of file descriptors for sandbox {id}'s ports: {e}; try again shortly"),
        ),
        _ => Error::unavailable(format!("sandbox {id}: {e}")),
    }
}

/// A TCP connection to `port` on the loopback of sandbox `id`, whose
/// namespace `ns` is (IPv4, then IPv6 for servers bound to `::1` only).
pub async fn connect(ns: &NetNs, id: &str, port: u16) -> Result<TcpStream> {
    if port == 0 {
        return Err(Error::invalid("port must be 1 to 65535"));
    }
    let mut last = None;
    for (family, addr) in [
        (libc::AF_INET, SocketAddr::from((Ipv4Addr::LOCALHOST, port))),
        (
            libc::AF_INET6,
            SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
        ),
    ] {
        // On the calling thread: the namespace round trip is cheaper than
        // any hand-off to another thread on every new connection.
        let socket = match ns.socket(family) {
            Ok(socket) => socket,
            // IPv6 may be disabled; then only IPv4 was tried.
            Err(_) if family == libc::AF_INET6 => break,
            Err(e) => return Err(ns_error(id, e)),
        };
        let socket = TcpSocket::from_std_stream(socket);
        match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last = Some(e.to_string()),
            Err(_) => last = Some(format!("no answer within {CONNECT_TIMEOUT:?}")),
        }
    }
    Err(Error::unavailable(format!(
        "nothing accepts connections on port {port} in sandbox {id}: {}",
        last.unwrap_or_default()
    )))
}

/// What listens in the sandbox, by port.
pub async fn listening(row: &SandboxRow) -> Result<Vec<ListeningPort>> {
    let launched = LocalBackend::launched(row)?;
    let ns = NetNs::of(&launched).map_err(|e| ns_error(&row.id, e))?;
    let id = row.id.clone();
    tokio::task::spawn_blocking(move || ns.listening().map_err(|e| ns_error(&id, e)))
        .await
        .map_err(|e| Error::internal(format!("netns task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process in a network namespace of its own (root: `unshare -n`),
    /// as a sandbox's shim is, and how the store names it.
    fn a_shim() -> (std::process::Child, Shim) {
        let child = std::process::Command::new("unshare")
            .args(["--net", "sleep", "60"])
            .spawn()
            .expect("unshare");
        let pid = i32::try_from(child.id()).unwrap();
        // Until unshare has exec'd sleep, the process is still in the
        // hub's own namespace (refused as `network_host`).
        for _ in 0..200 {
            if NetNs::of_process(pid, start_time(pid)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        (
            child,
            Shim {
                pid,
                start_time: start_time(pid),
            },
        )
    }

    fn start_time(pid: i32) -> u64 {
        crate::local::runtime::process_stat(pid).unwrap().start_time
    }

    #[test]
    fn an_open_that_races_a_stop_keeps_nothing() {
        let kept = Namespaces::default();
        let (mut child, shim) = a_shim();
        // The namespace is opened while the shim runs; the stop (its kill
        // and its forget) completes before the entry is made.
        let e = kept
            .open_with("sb-1", shim, || {
                let ns = NetNs::of_process(shim.pid, shim.start_time);
                child.kill().unwrap();
                child.wait().unwrap();
                kept.forget("sb-1");
                ns
            })
            .err()
            .expect("the shim is gone");
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(kept.lock().is_empty(), "nothing kept for a stopped sandbox");
    }

    #[test]
    fn a_full_map_lets_go_of_gone_shims_first() {
        let kept = Namespaces::with_cap(2);
        let (mut live, live_shim) = a_shim();
        let (mut gone, gone_shim) = a_shim();
        let (mut new, new_shim) = a_shim();
        let first = kept.open("live", live_shim).unwrap();
        kept.open("gone", gone_shim).unwrap();
        // Its stop's forget was missed (the race `open` closes, or a stop
        // that failed): the entry outlives the shim until the map is full.
        gone.kill().unwrap();
        gone.wait().unwrap();
        kept.open("new", new_shim).unwrap();
        let ids = |kept: &Namespaces| {
            let mut ids: Vec<String> = kept.lock().keys().cloned().collect();
            ids.sort();
            ids
        };
        assert_eq!(ids(&kept), ["live", "new"], "the gone shim's entry went");
        assert!(
            Arc::ptr_eq(&first, &kept.open("live", live_shim).unwrap()),
            "a live shim's namespace is kept"
        );
        for child in [&mut live, &mut new] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    #[test]
    fn a_namespace_is_opened_once_per_shim_and_never_reached_for_another() {
        let (mut child, shim) = a_shim();
        let kept = Namespaces::default();
        let first = kept.open("sb-1", shim).unwrap();
        assert!(
            Arc::ptr_eq(&first, &kept.open("sb-1", shim).unwrap()),
            "kept"
        );
        // The same pid with another start time is another process (a reused
        // pid, or a shim the store no longer names): never answered from
        // what was kept, and not found.
        let stranger = Shim {
            start_time: shim.start_time + 1,
            ..shim
        };
        let e = kept.open("sb-1", stranger).err().expect("a stranger");
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        // Forgotten (the sandbox stopped, slept or went), it is opened anew.
        kept.forget("sb-1");
        let again = kept.open("sb-1", shim).unwrap();
        assert!(!Arc::ptr_eq(&first, &again));
        kept.forget("sb-1");
        child.kill().unwrap();
        child.wait().unwrap();
        let e = kept.open("sb-1", shim).err().expect("a gone shim");
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    }
}
