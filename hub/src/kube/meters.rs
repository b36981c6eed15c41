//! An egress sandbox's counters and decision log on Kubernetes: every
//! `sandhub egress-proxy` replica meters what it carried, so the hub asks
//! each (the `sandhub-egress` Service's EndpointSlices, port `metrics`)
//! on its meter route and merges the answers.
//!
//! The answers are the proxy's, whose image and key the operator runs, but
//! they cross the network and a broken replica must not break a `GET`:
//! each ask has a short timeout and a bounded body, at most
//! [`MAX_ENDPOINTS`] are asked, a replica that fails is left out (the
//! counters are then a lower bound, and the log says so in a line of the
//! hub's log), and what comes back is clamped ([`merge`]).

use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{api::ListParams, Api};
use sandhub_api::{
    hub::{EgressDecision, EgressUsage},
    k8s::egress::{
        MeterReport, MAX_REPORTED_DECISIONS, METER_PATH, METRICS_PORT, METRICS_PORT_NAME,
    },
};

use super::Shared;

/// Replicas asked at most.
pub const MAX_ENDPOINTS: usize = 32;
/// One replica's answer, whole.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// One replica's answer body (256 decisions are ~100 KiB).
const MAX_BODY: usize = 1024 * 1024;
/// A name or reason longer than this is cut (the UI shows them).
const MAX_TEXT: usize = 512;

fn clamp_text(s: &mut String) {
    if s.len() > MAX_TEXT {
        let mut end = MAX_TEXT;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// The replicas' reports as one: counters summed (saturating), decisions
/// of all, oldest first, the last [`MAX_REPORTED_DECISIONS`] kept; each
/// report's own decisions clamped to that many and their texts cut.
pub fn merge(reports: Vec<MeterReport>) -> MeterReport {
    let mut usage = EgressUsage::default();
    let mut decisions: Vec<EgressDecision> = Vec::new();
    for r in reports {
        usage.bytes_out = usage.bytes_out.saturating_add(r.usage.bytes_out);
        usage.bytes_in = usage.bytes_in.saturating_add(r.usage.bytes_in);
        usage.connections_opened = usage
            .connections_opened
            .saturating_add(r.usage.connections_opened);
        usage.connections_refused = usage
            .connections_refused
            .saturating_add(r.usage.connections_refused);
        let skip = r.decisions.len().saturating_sub(MAX_REPORTED_DECISIONS);
        decisions.extend(r.decisions.into_iter().skip(skip).map(|mut d| {
            if let Some(n) = d.name.as_mut() {
                clamp_text(n);
            }
            if let Some(why) = d.reason.as_mut() {
                clamp_text(why);
            }
            clamp_text(&mut d.address);
            clamp_text(&mut d.at);
            d
        }));
    }
    // RFC 3339 in UTC with the same precision: text order is time order.
    decisions.sort_by(|a, b| a.at.cmp(&b.at));
    let skip = decisions.len().saturating_sub(MAX_REPORTED_DECISIONS);
    decisions.drain(..skip);
    MeterReport { usage, decisions }
}

/// `host:port` of each ready replica's metrics port.
fn endpoints(slices: &[EndpointSlice]) -> Vec<String> {
    let mut out = Vec::new();
    for s in slices {
        let port = s
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(METRICS_PORT_NAME))
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(METRICS_PORT);
        for e in &s.endpoints {
            if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            if let Some(a) = e.addresses.first() {
                let host = if a.contains(':') {
                    format!("[{a}]")
                } else {
                    a.clone()
                };
                out.push(format!("{host}:{port}"));
            }
        }
    }
    out.sort();
    out.dedup();
    out.truncate(MAX_ENDPOINTS);
    out
}

/// `GET http://{endpoint}{path}` with the bearer, the whole answer
/// within [`ASK_TIMEOUT`] and at most [`MAX_BODY`] bytes.
async fn ask(endpoint: String, path: String, token: &str) -> Result<MeterReport, String> {
    use http_body_util::BodyExt;
    let work = async {
        let stream = tokio::net::TcpStream::connect(&endpoint)
            .await
            .map_err(|e| format!("{endpoint}: {e}"))?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| format!("{endpoint}: {e}"))?;
        tokio::spawn(conn);
        let req = http::Request::get(&path)
            .header(http::header::HOST, &endpoint)
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| e.to_string())?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| format!("{endpoint}: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("{endpoint}: {}", resp.status()));
        }
        let body = http_body_util::Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| format!("{endpoint}: {e}"))?
            .to_bytes();
        serde_json::from_slice(&body).map_err(|e| format!("{endpoint}: {e}"))
    };
    tokio::time::timeout(ASK_TIMEOUT, work)
        .await
        .map_err(|_| format!("{endpoint}: no answer within {ASK_TIMEOUT:?}"))?
}

impl Shared {
    /// Sandbox `id`'s report over every proxy replica (zeros when none
    /// answers, or this hub has no key to ask with).
    pub(super) async fn egress_report(&self, id: &str) -> MeterReport {
        let Some(tokens) = &self.proxy_tokens else {
            return MeterReport::default();
        };
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &self.namespace);
        let params = ListParams::default().labels(&format!(
            "kubernetes.io/service-name={}",
            self.egress_service
        ));
        let slices = match api.list(&params).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %e, "egress counters: listing the proxy's EndpointSlices");
                return MeterReport::default();
            }
        };
        let token = tokens.meter_token(&self.namespace);
        let asks = endpoints(&slices)
            .into_iter()
            .map(|ep| ask(ep, format!("{METER_PATH}/{id}"), &token));
        let mut reports = Vec::new();
        for r in join_all(asks).await {
            match r {
                Ok(r) => reports.push(r),
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e, "egress counters: a proxy replica did not answer")
                }
            }
        }
        merge(reports)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    fn decision(at: &str, reason: &str) -> EgressDecision {
        EgressDecision {
            at: at.into(),
            name: Some("a.test".into()),
            address: "0.0.0.0".into(),
            port: 443,
            allowed: reason.is_empty(),
            reason: (!reason.is_empty()).then(|| reason.to_string()),
            bytes_out: 1,
            bytes_in: 2,
            brokered: false,
            udp: false,
        }
    }

    #[test]
    fn replicas_sum_interleave_and_hostile_answers_are_clamped() {
        let a = MeterReport {
            usage: EgressUsage {
                bytes_out: 10,
                bytes_in: u64::MAX,
                connections_opened: 1,
                connections_refused: 0,
            },
            decisions: vec![
                decision("2026-12-04T10:00:01.000Z", ""),
                decision("2026-12-04T10:00:03.000Z", ""),
            ],
        };
        let b = MeterReport {
            usage: EgressUsage {
                bytes_out: 5,
                bytes_in: 7,
                connections_opened: 2,
                connections_refused: 1,
            },
            decisions: vec![decision("2026-12-04T10:00:02.000Z", &"x".repeat(10_000))],
        };
        let m = merge(vec![a, b]);
        assert_eq!(m.usage.bytes_out, 15);
        assert_eq!(m.usage.bytes_in, u64::MAX); // saturated, not wrapped
        assert_eq!(
            (m.usage.connections_opened, m.usage.connections_refused),
            (3, 1)
        );
        let at: Vec<&str> = m.decisions.iter().map(|d| &d.at[17..19]).collect();
        assert_eq!(at, ["01", "02", "03"]);
        assert_eq!(m.decisions[1].reason.as_ref().unwrap().len(), MAX_TEXT);
        // A replica that answers too many decisions is cut to the log's size.
        let flood = MeterReport {
            usage: EgressUsage::default(),
            decisions: (0..10_000)
                .map(|i| {
                    decision(
                        &format!("2026-12-04T10:{:02}:{:02}.000Z", i / 60 % 60, i % 60),
                        "",
                    )
                })
                .collect(),
        };
        assert_eq!(merge(vec![flood]).decisions.len(), MAX_REPORTED_DECISIONS);
    }

    #[test]
    fn ready_endpoints_on_the_metrics_port_are_asked_and_at_most_so_many() {
        let slice = |addrs: Vec<(&str, Option<bool>)>, port: Option<i32>| EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: addrs
                .into_iter()
                .map(|(a, ready)| Endpoint {
                    addresses: vec![a.into()],
                    conditions: Some(EndpointConditions {
                        ready,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ports: Some(vec![
                EndpointPort {
                    name: Some("proxy".into()),
                    port: Some(3128),
                    ..Default::default()
                },
                EndpointPort {
                    name: Some(METRICS_PORT_NAME.into()),
                    port,
                    ..Default::default()
                },
            ]),
            metadata: Default::default(),
        };
        let got = endpoints(&[
            slice(
                vec![
                    ("10.0.0.2", Some(true)),
                    ("10.0.0.3", Some(false)),
                    ("10.0.0.4", None),
                ],
                Some(9999),
            ),
            slice(vec![("fd00::1", None)], None),
        ]);
        assert_eq!(got, ["10.0.0.2:9999", "10.0.0.4:9999", "[fd00::1]:9464"]);
        let many: Vec<(String, Option<bool>)> =
            (0..100).map(|i| (format!("10.1.0.{i}"), None)).collect();
        let many = slice(
            many.iter().map(|(a, r)| (a.as_str(), *r)).collect(),
            Some(1),
        );
        assert_eq!(endpoints(&[many]).len(), MAX_ENDPOINTS);
    }
}
