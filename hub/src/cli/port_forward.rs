//! `sandhub port-forward ID LOCAL:REMOTE`: like `kubectl port-forward`,
//! listens on a local TCP port and carries each connection to port REMOTE
//! inside the sandbox, through the hub's `port-forward` tunnel (the
//! sandbox publishes nothing).

use clap::Args;
use sandhub_client::{Error, Result, Sandboxes};
use tokio::net::{TcpListener, TcpStream};

use super::ClientArgs;

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  sandhub port-forward sb-1a2b 8080:8000    localhost:8080 reaches port 8000 inside
  sandhub port-forward sb-1a2b 8000         the same port on both sides
  sandhub port-forward sb-1a2b 0:8000       any free local port (printed)

Prints `Forwarding from ADDRESS:LOCAL -> ID:REMOTE` once listening; runs
until interrupted.")]
pub struct PortForwardArgs {
    /// The sandbox.
    id: String,

    /// LOCAL:REMOTE, or one PORT for both (LOCAL 0 picks a free port).
    ports: String,

    /// The local address to listen on.
    #[arg(
        long,
        env = "SANDHUB_PORT_FORWARD_ADDRESS",
        default_value = "127.0.0.1"
    )]
    address: String,

    #[command(flatten)]
    client: ClientArgs,
}

/// `LOCAL:REMOTE` or `PORT`; REMOTE must not be 0.
fn parse_ports(s: &str) -> Result<(u16, u16)> {
    let bad = || {
        Error::invalid(format!(
            "ports {s:?}: expected LOCAL:REMOTE or PORT (1 to 65535)"
        ))
    };
    let (local, remote) = match s.split_once(':') {
        Some((l, r)) => (l.parse().map_err(|_| bad())?, r.parse().map_err(|_| bad())?),
        None => {
            let p = s.parse().map_err(|_| bad())?;
            (p, p)
        }
    };
    if remote == 0 {
        return Err(bad());
    }
    Ok((local, remote))
}

pub async fn run(args: PortForwardArgs) -> Result<i32> {
    let (local, remote) = parse_ports(&args.ports)?;
    let client = args.client.connect()?;
    // Fail at once on an unknown sandbox, not at the first connection.
    client.get(&args.id).await?;
    let listener = TcpListener::bind((args.address.as_str(), local))
        .await
        .map_err(|e| Error::unavailable(format!("listening on {}:{local}: {e}", args.address)))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::internal(e.to_string()))?;
    println!("Forwarding from {bound} -> {}:{remote}", args.id);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = sandhub_common::signal::terminated() => return Ok(0),
        };
        let (conn, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                eprintln!("accepting a connection: {e}");
                continue;
            }
        };
        let (client, id) = (client.clone(), args.id.clone());
        tokio::spawn(async move {
            if let Err(e) = forward(conn, &client, &id, remote).await {
                eprintln!("connection from {peer}: {e}");
            }
        });
    }
}

async fn forward(
    mut conn: TcpStream,
    client: &sandhub_client::http::HubClient,
    id: &str,
    remote: u16,
) -> Result<()> {
    let mut tunnel = client.port_forward(id, remote).await?;
    let _ = conn.set_nodelay(true);
    tokio::io::copy_bidirectional(&mut conn, &mut tunnel)
        .await
        .map(|_| ())
        .map_err(|e| Error::unavailable(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_remote_or_one_port() {
        assert_eq!(parse_ports("8080:8000").unwrap(), (8080, 8000));
        assert_eq!(parse_ports("8000").unwrap(), (8000, 8000));
        assert_eq!(parse_ports("0:8000").unwrap(), (0, 8000));
        for bad in ["", "x", "1:0", "0", "70000:1", "1:2:3", ":80"] {
            assert!(parse_ports(bad).is_err(), "{bad}");
        }
    }
}
