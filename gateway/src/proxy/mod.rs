//! The gateway in proxy form (issue #27 part 5): what Kubernetes Pods
//! reach as `HTTP_PROXY` / `HTTPS_PROXY` / `ALL_PROXY`.
//!
//! A Pod has no TUN device the gateway holds, so the gateway cannot see
//! its packets; instead the Pod's NetworkPolicy admits only DNS and this
//! server, and the workload asks it, by name, for each connection:
//!
//! - HTTP `CONNECT host:port` (what `HTTPS_PROXY` clients send), and
//!   absolute-form `GET http://host/...` (what `HTTP_PROXY` clients send
//!   for plain HTTP), authenticated with `Proxy-Authorization: Basic
//!   base64(sandbox-id:credential)`;
//! - SOCKS5 `CONNECT` (`ALL_PROXY=socks5h://...`), authenticated with
//!   RFC 1929 username (sandbox id) and password (credential).
//!
//! The credential names the sandbox; its policy, secrets and meter come
//! from a [`Directory`] the caller provides (the `sandhub egress-proxy`
//! binary reads them from the Kubernetes API). From there the decision is
//! the TUN gateway's, by the same functions: the name rules before
//! anything is resolved ([`SandboxPolicy::lists_allow`], a literal
//! address's ranges), then `stack::connect` (resolve, judge every
//! resolved address again against the closed and private ranges and the
//! deny CIDRs: DNS rebinding stops there, then dial). A secret's host and
//! port is handed to [`crate::broker::Broker::relay`], so brokered
//! secrets work through the proxy too; plain HTTP is never brokered.
//!
//! Bounds: [`ProxyLimits::max_clients`] connections at once in all (an
//! unauthenticated client holds one too), `max_flows` per sandbox (the
//! TUN gateway's [`crate::Limits::max_flows`]), heads of at most
//! [`MAX_HEAD`] bytes and [`MAX_HEADERS`] lines, the whole handshake
//! (auth + request) within [`ProxyLimits::handshake_timeout`], and
//! `idle_timeout` for a carried flow that moves nothing.
//!
//! # Layout
//!
//! ```text
//! mod.rs    Directory, Proxy (accept loop, admit, dial, carry)
//! auth.rs   credentials: Basic parsing, the constant-time comparison
//! http.rs   CONNECT and absolute-form forwarding
//! socks.rs  SOCKS5 (RFC 1928 CONNECT, RFC 1929 auth)
//! carry.rs  the counted, idle-bounded splice (and the broker hand-off)
//! ```

mod auth;
mod carry;
mod http;
mod socks;

use std::{
    collections::HashMap,
    io,
    net::{IpAddr, Ipv4Addr},
    sync::{Arc, Mutex},
    time::Duration,
};

use sandhub_api::network::{is_dns_name, normalize_name};
use tokio::{
    io::BufReader,
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

use crate::{
    broker::Secret,
    meter::Meter,
    policy::{Flow, Proto, SandboxPolicy},
    stack::{self, DialError, LogBudget},
    Config,
};

/// A request head (request line and headers) larger than this is refused.
pub const MAX_HEAD: usize = 16 * 1024;
/// Header lines in one request head.
pub const MAX_HEADERS: usize = 64;

/// What the proxy knows of one sandbox, from its [`Directory`].
#[derive(Clone)]
pub struct ProxySandbox {
    /// The credential its Pod was given (compared in constant time).
    pub credential: String,
    pub policy: Arc<SandboxPolicy>,
    /// Its brokered secrets, values included.
    pub secrets: Arc<Vec<Secret>>,
    /// Its counters and decision log; the same `Arc` on every lookup, so
    /// counts accumulate.
    pub meter: Arc<Meter>,
    /// `egress_mb` in bytes.
    pub cap_bytes: Option<u64>,
}

/// Sandbox id → what the proxy needs of it, read at each new
/// connection (a policy change applies to the next one at once). `None`:
/// no such sandbox (the client gets the same answer as for a wrong
/// credential).
pub trait Directory: Send + Sync + 'static {
    fn lookup(&self, sandbox: &str) -> Option<ProxySandbox>;
}

impl<F> Directory for F
where
    F: Fn(&str) -> Option<ProxySandbox> + Send + Sync + 'static,
{
    fn lookup(&self, sandbox: &str) -> Option<ProxySandbox> {
        self(sandbox)
    }
}

/// The proxy's own bounds (per-sandbox ones are in [`crate::Limits`]).
#[derive(Debug, Clone)]
pub struct ProxyLimits {
    /// Client connections at once, authenticated or not; more are closed
    /// at accept.
    pub max_clients: usize,
    /// From accept to the request's answer (auth and request included).
    pub handshake_timeout: Duration,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        ProxyLimits {
            max_clients: 4096,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// The proxy server; one per `sandhub egress-proxy`.
pub struct Proxy {
    cfg: Arc<Config>,
    dir: Arc<dyn Directory>,
    limits: ProxyLimits,
    clients: Arc<Semaphore>,
    /// Flows open per sandbox id (entries removed at zero).
    flows: Mutex<HashMap<String, usize>>,
    log: Mutex<LogBudget>,
}

/// Where a client asked to go: a name (resolved by the gateway, never by
/// the client) or a literal address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dest {
    pub name: Option<String>,
    pub ip: Option<IpAddr>,
    pub port: u16,
}

impl Dest {
    /// `host` as a client wrote it (a name, an IPv4 address, or an IPv6
    /// address with or without brackets).
    pub(crate) fn parse(host: &str, port: u16) -> Option<Dest> {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Some(Dest {
                name: None,
                ip: Some(ip),
                port,
            });
        }
        let name = normalize_name(host);
        (port != 0 && is_dns_name(&name)).then_some(Dest {
            name: Some(name),
            ip: None,
            port,
        })
    }

    /// For the decision log: the literal address, or none yet.
    fn address(&self) -> IpAddr {
        self.ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    }
}

/// Why a request was not carried.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The policy, a cap or a limit said no (403 / SOCKS 0x02).
    Policy(String),
    /// The destination could not be resolved or reached (502 / 0x04).
    Unreachable(String),
}

/// An open flow's place in its sandbox's `max_flows`; given back on drop.
pub(crate) struct Slot {
    proxy: Arc<Proxy>,
    sandbox: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut flows = self.proxy.flows.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = flows.get_mut(&self.sandbox) {
            *n -= 1;
            if *n == 0 {
                flows.remove(&self.sandbox);
            }
        }
    }
}

/// An authenticated client's sandbox.
pub(crate) struct Client {
    pub id: String,
    pub sb: ProxySandbox,
}

/// A connection the proxy opened for a client, not yet carrying bytes.
pub(crate) struct Dialed {
    pub upstream: TcpStream,
    pub slot: Slot,
    /// Its decision-log entry.
    pub seq: u64,
    /// The secrets this flow carries (empty: not brokered).
    pub secrets: Vec<Secret>,
}

impl Proxy {
    pub fn new(cfg: Arc<Config>, dir: Arc<dyn Directory>, limits: ProxyLimits) -> Arc<Proxy> {
        Arc::new(Proxy {
            clients: Arc::new(Semaphore::new(limits.max_clients.max(1))),
            cfg,
            dir,
            limits,
            flows: Mutex::new(HashMap::new()),
            log: Mutex::new(LogBudget::new()),
        })
    }

    /// Serves clients from `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> io::Result<()> {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(c) => c,
                // EMFILE and friends: the listener is fine, wait a little.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = self.clients.clone().try_acquire_owned() else {
                continue; // over max_clients: closed at once
            };
            let me = self.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let _ = stream.set_nodelay(true);
                me.client(stream).await;
            });
        }
    }

    async fn client(self: Arc<Self>, stream: TcpStream) {
        let mut first = [0u8; 1];
        let peeked =
            tokio::time::timeout(self.limits.handshake_timeout, stream.peek(&mut first)).await;
        if !matches!(peeked, Ok(Ok(1))) {
            return;
        }
        let conn = BufReader::new(stream);
        // SOCKS5 greets with its version byte; an HTTP method is a letter.
        if first[0] == socks::VERSION {
            socks::serve(self, conn).await
        } else {
            http::serve(self, conn).await
        }
    }

    /// The sandbox `user` names, when `pass` is its credential. Unknown
    /// ids compare against a dummy so both paths do the same work.
    pub(crate) fn authenticate(&self, user: &str, pass: &[u8]) -> Option<Client> {
        let sb = self.dir.lookup(user);
        let expected = sb.as_ref().map(|s| s.credential.as_bytes()).unwrap_or(&[]);
        let ok = auth::same(expected, pass) && sb.is_some() && !expected.is_empty();
        if !ok {
            self.note(|| tracing::info!(sandbox = %user, "egress proxy: authentication failed"));
            return None;
        }
        sb.map(|sb| Client {
            id: user.to_string(),
            sb,
        })
    }

    /// Logs within the budget (a client looping on refusals must not fill
    /// the disk).
    fn note(&self, line: impl FnOnce()) {
        if self.log.lock().unwrap_or_else(|p| p.into_inner()).admit() {
            line();
        }
    }

    fn refuse(&self, c: &Client, dest: &Dest, why: Refusal) -> Refusal {
        let text = match &why {
            Refusal::Policy(s) | Refusal::Unreachable(s) => s.clone(),
        };
        c.sb.meter
            .refused(dest.name.as_deref(), dest.address(), dest.port, &text);
        self.note(|| {
            tracing::info!(sandbox = %c.id, name = dest.name.as_deref().unwrap_or(""),
                address = %dest.address(), port = dest.port, why = %text, "egress proxy: refused")
        });
        why
    }

    /// The whole decision and the dial, as the TUN gateway makes them for
    /// a SYN: lists (and a literal's ranges), the byte cap, the rate cap,
    /// `max_flows`,
    /// then resolve + re-check + connect. `tunnel`: the client's bytes go
    /// through as they are (CONNECT, SOCKS), so a secret's host may be
    /// brokered; a forwarded plain-HTTP request never is.
    pub(crate) async fn open(
        self: &Arc<Self>,
        c: &Client,
        dest: &Dest,
        tunnel: bool,
    ) -> Result<Dialed, Refusal> {
        let op = &self.cfg.operator;
        let flow = Flow {
            name: dest.name.as_deref(),
            ip: dest.ip,
            port: dest.port,
            proto: Proto::Tcp,
        };
        let verdict = match dest.ip {
            Some(ip) => op
                .address_open(ip, &[])
                .and_then(|()| c.sb.policy.lists_allow(op, &flow)),
            None => c.sb.policy.lists_allow(op, &flow),
        };
        if let Err(why) = verdict {
            return Err(self.refuse(c, dest, Refusal::Policy(why.to_string())));
        }
        if let Some(cap) = c.sb.cap_bytes {
            let used = c.sb.meter.total_bytes();
            if used >= cap {
                let why = format!(
                    "egress_mb: the sandbox's cap of {} MB is used ({used} payload bytes)",
                    cap / (1024 * 1024)
                );
                return Err(self.refuse(c, dest, Refusal::Policy(why)));
            }
        }
        if let Some(why) = self
            .cfg
            .limits
            .rate_mbit
            .and_then(|cap| c.sb.meter.over_rate(cap))
        {
            return Err(self.refuse(c, dest, Refusal::Policy(why)));
        }
        let slot = {
            let mut flows = self.flows.lock().unwrap_or_else(|p| p.into_inner());
            let n = flows.entry(c.id.clone()).or_insert(0);
            if *n >= self.cfg.limits.max_flows {
                drop(flows);
                let why = format!(
                    "too many connections open at once (--egress-max-flows {})",
                    self.cfg.limits.max_flows
                );
                return Err(self.refuse(c, dest, Refusal::Policy(why)));
            }
            *n += 1;
            Slot {
                proxy: self.clone(),
                sandbox: c.id.clone(),
            }
        };
        let literal = dest.address();
        let upstream = match stack::connect(
            &self.cfg,
            &c.sb.policy,
            dest.name.as_deref(),
            literal,
            dest.port,
        )
        .await
        {
            Ok(s) => s,
            Err(DialError::Refused(why)) => return Err(self.refuse(c, dest, Refusal::Policy(why))),
            Err(DialError::Failed(why)) => {
                return Err(self.refuse(c, dest, Refusal::Unreachable(why)))
            }
        };
        // Brokered: a name flow whose name and port are a secret's host,
        // and a broker to terminate its TLS.
        let secrets: Vec<Secret> = match (&self.cfg.broker, &dest.name) {
            (Some(_), Some(n)) if tunnel => {
                c.sb.secrets
                    .iter()
                    .filter(|s| s.applies(n, dest.port))
                    .cloned()
                    .collect()
            }
            _ => Vec::new(),
        };
        let peer = upstream.peer_addr().map(|a| a.ip()).unwrap_or(literal);
        let seq =
            c.sb.meter
                .opened(dest.name.as_deref(), peer, dest.port, !secrets.is_empty());
        Ok(Dialed {
            upstream,
            slot,
            seq,
            secrets,
        })
    }

    /// Carries bytes of an opened flow until either side ends or it idles.
    pub(crate) async fn carry<S>(&self, c: &Client, dest: &Dest, client: S, d: Dialed)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let broker = match (&self.cfg.broker, &dest.name, d.secrets.is_empty()) {
            (Some(b), Some(n), false) => Some((b.clone(), n.clone())),
            _ => None,
        };
        carry::run(
            client,
            d,
            c.sb.meter.clone(),
            self.cfg.limits.idle_timeout,
            broker,
            &c.id,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_parse_as_names_or_literals_and_junk_is_refused() {
        assert_eq!(
            Dest::parse("PyPI.test.", 443),
            Some(Dest {
                name: Some("pypi.test".into()),
                ip: None,
                port: 443
            })
        );
        assert_eq!(
            Dest::parse("[2001:db8::1]", 22).unwrap().ip,
            Some("2001:db8::1".parse().unwrap())
        );
        assert_eq!(
            Dest::parse("198.18.0.2", 80).unwrap().ip,
            Some("198.18.0.2".parse().unwrap())
        );
        for bad in ["", "a b", "x..y", "-x.test", "a/b", "\u{0}"] {
            assert_eq!(Dest::parse(bad, 80), None, "{bad:?}");
        }
        assert_eq!(Dest::parse("ok.test", 0), None);
    }
}
