//! A sandbox's ports on Kubernetes: the Pod's port by its IP (the hub
//! reaches Pods directly), or through `sandhub-router` with the sandbox,
//! the port and a scoped token in headers (HTTP only, then); and what
//! listens, read from the Pod's kernel tables through its sandboxd.

use std::{collections::BTreeMap, time::Duration};

use sandhub_api::hub::{Command, ExecRequest, ListeningPort};
use sandhub_client::{sandboxd::SandboxdClient, Error, Result};

use super::reach::{Reach, Target};
use crate::backend::PortStream;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Between the two tables in one exec's output.
const SPLIT: &str = "--sandhub-tcp6--";

/// A connection toward `port` of the target's Pod (sandbox `id`).
pub async fn connect(
    reach: &Reach,
    target: &Target<'_>,
    id: &str,
    port: u16,
) -> Result<PortStream> {
    let (addr, headers) = reach.port(target, port)?;
    let stream =
        match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(Error::unavailable(format!(
                    "nothing accepts connections on port {port} in sandbox {id}: {e}"
                )))
            }
            Err(_) => {
                return Err(Error::unavailable(format!(
                    "port {port} in sandbox {id}: no answer within {CONNECT_TIMEOUT:?}"
                )))
            }
        };
    let _ = stream.set_nodelay(true);
    Ok(PortStream { stream, headers })
}

/// What listens in the Pod (its network namespace is the sandbox's).
pub async fn listening(client: &SandboxdClient) -> Result<Vec<ListeningPort>> {
    let script = format!("cat /proc/net/tcp; echo {SPLIT}; cat /proc/net/tcp6 2>/dev/null; true");
    let r = client
        .exec(ExecRequest {
            command: Command::Shell(script),
            env: BTreeMap::new(),
            cwd: String::new(),
            timeout_seconds: Some(30.0),
            stdin: String::new(),
            container: None,
        })
        .await?;
    if r.exit_code != 0 {
        return Err(Error::unavailable(format!(
            "reading the Pod's TCP tables failed ({}): {}",
            r.exit_code,
            r.stderr.trim()
        )));
    }
    let (v4, v6) = r.stdout.split_once(SPLIT).unwrap_or((&r.stdout, ""));
    Ok(sandhub_api::proc_net::listening(v4, v6))
}
