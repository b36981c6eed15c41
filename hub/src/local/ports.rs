//! A local sandbox's TCP ports, as the hub reaches them: through sockets
//! made inside the sandbox's network namespace (`runtime::NetNs`), so the
//! sandbox keeps its own network and nothing is published on the host.

use std::{
    io,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use sandhub_api::{error::Code, hub::ListeningPort};
use sandhub_client::{Error, Result};
use tokio::net::{TcpSocket, TcpStream};

use super::{runtime::NetNs, store::SandboxRow, LocalBackend};

/// How long a connect to a port inside a sandbox may take (it is local:
/// anything slower is a stuck listener).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

fn ns_error(id: &str, e: io::Error) -> Error {
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

async fn netns(row: &SandboxRow) -> Result<NetNs> {
    let launched = LocalBackend::launched(row)?;
    let id = row.id.clone();
    tokio::task::spawn_blocking(move || NetNs::of(&launched).map_err(|e| ns_error(&id, e)))
        .await
        .map_err(|e| Error::internal(format!("netns task failed: {e}")))?
}

/// A TCP connection to `port` on the sandbox's loopback (IPv4, then IPv6
/// for servers bound to `::1` only).
pub async fn connect(row: &SandboxRow, port: u16) -> Result<TcpStream> {
    if port == 0 {
        return Err(Error::invalid("port must be 1 to 65535"));
    }
    let ns = netns(row).await?;
    let id = row.id.clone();
    let sockets = tokio::task::spawn_blocking(move || ns.sockets().map_err(|e| ns_error(&id, e)))
        .await
        .map_err(|e| Error::internal(format!("netns task failed: {e}")))??;
    let attempts = [
        Some((sockets.v4, SocketAddr::from((Ipv4Addr::LOCALHOST, port)))),
        sockets
            .v6
            .map(|s| (s, SocketAddr::from((Ipv6Addr::LOCALHOST, port)))),
    ];
    let mut last = None;
    for (socket, addr) in attempts.into_iter().flatten() {
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
        "nothing accepts connections on port {port} in sandbox {}: {}",
        row.id,
        last.unwrap_or_default()
    )))
}

/// What listens in the sandbox, by port.
pub async fn listening(row: &SandboxRow) -> Result<Vec<ListeningPort>> {
    let ns = netns(row).await?;
    let id = row.id.clone();
    tokio::task::spawn_blocking(move || ns.listening().map_err(|e| ns_error(&id, e)))
        .await
        .map_err(|e| Error::internal(format!("netns task failed: {e}")))?
}
