//! A sandbox's TCP ports through the hub (`/v1/sandboxes/{id}/ports`):
//! the URL that reaches a port, what listens, and waiting for a server to
//! come up. What the SDKs' `sandbox.ports` stands on.

use std::time::{Duration, Instant};

use reqwest::header;
use reqwest::Method;
use sandhub_api::{
    error::Code,
    hub::{ListeningPort, PortList, PORT_FORWARD_UPGRADE},
};

use super::{HubClient, QUICK};
use crate::{paths::encode, Error, Result};

/// First pause between two looks at the listening ports; doubled up to
/// [`POLL_MAX`], so a server that takes seconds costs few requests.
const POLL_FIRST: Duration = Duration::from_millis(50);
const POLL_MAX: Duration = Duration::from_millis(500);

impl HubClient {
    /// The URL that reaches `port` inside sandbox `id` through the hub
    /// (HTTP, SSE and WebSocket; send the hub's API key with it). Ends in
    /// `/`: append the server's path.
    pub fn port_url(&self, id: &str, port: u16) -> String {
        format!("{}/v1/sandboxes/{}/ports/{port}/", self.base, encode(id))
    }

    /// `GET /v1/sandboxes/{id}/ports`: the TCP ports listening inside.
    pub async fn list_ports(&self, id: &str) -> Result<Vec<ListeningPort>> {
        let list: PortList = self
            .call(self.sandbox(Method::GET, id, "/ports").timeout(QUICK))
            .await?;
        Ok(list.ports)
    }

    /// Waits until something listens on `port` inside the sandbox; its
    /// URL ([`Self::port_url`]) then answers. DEADLINE_EXCEEDED after
    /// `timeout`; other errors (an unknown sandbox, one not Ready) at once.
    pub async fn wait_port(&self, id: &str, port: u16, timeout: Duration) -> Result<String> {
        if port == 0 {
            return Err(Error::invalid("port must be 1 to 65535"));
        }
        let deadline = Instant::now() + timeout;
        let mut pause = POLL_FIRST;
        loop {
            if self.list_ports(id).await?.iter().any(|p| p.port == port) {
                return Ok(self.port_url(id, port));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::new(
                    Code::DeadlineExceeded,
                    format!("nothing listened on port {port} in sandbox {id} within {timeout:?}"),
                ));
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    /// A raw TCP connection to `port` inside the sandbox, tunnelled through
    /// the hub (`GET /v1/sandboxes/{id}/port-forward/{port}`, upgraded to
    /// `sandhub-tcp`): what `sandhub port-forward` carries each local
    /// connection over. The stream is tokio's `AsyncRead + AsyncWrite`.
    pub async fn port_forward(&self, id: &str, port: u16) -> Result<reqwest::Upgraded> {
        let request = self
            .sandbox(Method::GET, id, &format!("/port-forward/{port}"))
            .header(header::CONNECTION, "upgrade")
            .header(header::UPGRADE, PORT_FORWARD_UPGRADE);
        // No request timeout: it would also bound the tunnel's life.
        let response = tokio::time::timeout(QUICK, request.send())
            .await
            .map_err(|_| Error::new(Code::DeadlineExceeded, "the hub did not answer in time"))?
            .map_err(super::transport_error)?;
        if response.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
            let status = response.status().as_u16();
            let body = response.bytes().await.unwrap_or_default();
            return Err(Error::from_http(status, &body));
        }
        response.upgrade().await.map_err(super::transport_error)
    }
}
