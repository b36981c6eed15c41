//! Port proxy vs direct: HTTP load (wrk) on a server inside a sandbox,
//! through the hub's `/v1/sandboxes/{id}/ports/{port}/...`, against the
//! same server reached from the sandbox's own network namespace (wrk run
//! under `nsenter --net`, as `ip netns exec` would: no hub in the path).
//! With a `sandhub-router` binary, a third side: the router started in the
//! sandbox's network namespace, pointed by its headers at the same
//! `127.0.0.1:{port}`, and loaded from there (issue #34 §1's reference:
//! the project's own proxy on the same server, in the same run).
//! Rounds rotate which side goes first; medians are reported.
//!
//! Three servers: Python's `http.server` (HTTP/1.1 keep-alive, a small file,
//! buffered writes and TCP_NODELAY so Nagle's 40 ms stalls do not hide
//! everything else; the kind of app server the ports API is for, and the
//! one its tests use)
//! and nginx answering `return 200` (no work at all per request: what the
//! proxy's own cost per request looks like, with nothing to hide it),
//! once as configured by default and once closing each connection after
//! its answer (`keepalive_requests 1`, as an HTTP/1.0 server or one that
//! says `Connection: close` does), so every request makes the proxy dial
//! the sandbox anew: the cost of reaching into its namespace.
//!
//! `http.server`'s requests/s fall as its concurrent connections rise
//! (threads behind one GIL: ~15k/s on one connection, ~8k/s on 16, here),
//! so a proxy that serialises requests can make it look faster than
//! direct, and a cheaper proxy slower. The hub's CPU time per request,
//! measured around each hub round, is the proxy's own cost either way.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context};
use reqwest::Method;
use serde_json::json;

use super::server::Hub;
use crate::wrk::{Load, WrkResult};

pub struct Server {
    pub name: &'static str,
    pub port: u16,
    /// How it is started inside the sandbox (`sh -c`); it must keep
    /// running after the exec returns.
    start: &'static str,
    /// Its process's cmdline contains this (to find its network namespace).
    marker: &'static str,
}

pub const SERVERS: [Server; 3] = [
    Server {
        name: "python http.server",
        port: 8081,
        start: "mkdir -p /tmp/benchpy && echo ok > /tmp/benchpy/index.txt && cd /tmp/benchpy && \
                (setsid python3 -c 'import http.server as h; H = h.SimpleHTTPRequestHandler; \
                H.protocol_version = \"HTTP/1.1\"; H.wbufsize = -1; H.disable_nagle_algorithm = True; \
                H.log_message = lambda *a: None; \
                h.ThreadingHTTPServer((\"127.0.0.1\", 8081), H).serve_forever()' \
                --sandhub-bench-py >/dev/null 2>&1 &)",
        marker: "--sandhub-bench-py",
    },
    Server {
        name: "nginx return 200",
        port: 8082,
        start: "cat > /tmp/sandhub-bench-nginx.conf <<'EOF'\n\
worker_processes 1; pid /tmp/benchng.pid; error_log /tmp/benchng.err;\n\
events { worker_connections 1024; }\n\
http { access_log off; client_body_temp_path /tmp/nb; proxy_temp_path /tmp/np; fastcgi_temp_path /tmp/nf;\n\
  uwsgi_temp_path /tmp/nu; scgi_temp_path /tmp/ns;\n\
  server { listen 127.0.0.1:8082; location / { return 200 \"ok\\n\"; } } }\n\
EOF\n\
nginx -c /tmp/sandhub-bench-nginx.conf",
        marker: "sandhub-bench-nginx.conf",
    },
    Server {
        name: "nginx return 200, closing",
        port: 8083,
        start: "cat > /tmp/sandhub-bench-nginx-closing.conf <<'EOF'\n\
worker_processes 1; pid /tmp/benchnc.pid; error_log /tmp/benchnc.err;\n\
events { worker_connections 1024; }\n\
http { access_log off; keepalive_requests 1; client_body_temp_path /tmp/nb; proxy_temp_path /tmp/np;\n\
  fastcgi_temp_path /tmp/nf; uwsgi_temp_path /tmp/nu; scgi_temp_path /tmp/ns;\n\
  server { listen 127.0.0.1:8083; location / { return 200 \"ok\\n\"; } } }\n\
EOF\n\
nginx -c /tmp/sandhub-bench-nginx-closing.conf",
        marker: "sandhub-bench-nginx-closing.conf",
    },
];

pub struct Outcome {
    pub server: &'static str,
    pub direct: Vec<WrkResult>,
    pub hub: Vec<WrkResult>,
    /// Empty without a router binary.
    pub router: Vec<WrkResult>,
    pub command_direct: String,
    pub command_hub: String,
    pub command_router: String,
    /// The hub's CPU time (user + system) per request carried, per hub
    /// round: what the proxy itself costs, whatever else the machine runs.
    pub hub_cpu_us: Vec<f64>,
    /// The same for the router, per router round.
    pub router_cpu_us: Vec<f64>,
}

/// Which side a round runs.
#[derive(Clone, Copy)]
enum Side {
    Direct,
    Hub,
    Router,
}

/// User plus system CPU time of process `pid` so far, in microseconds
/// (`/proc/<pid>/stat`, in clock ticks of 10 ms).
pub(super) fn cpu_us(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').context("no ) in stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, so 12 and
    // 13 after the state (field 3, the first here).
    let ticks: f64 = fields
        .get(11..13)
        .context("short stat")?
        .iter()
        .map(|f| f.parse::<f64>().unwrap_or(0.0))
        .sum();
    let per_s = 100.0; // USER_HZ on Linux
    Ok(ticks / per_s * 1e6)
}

/// The pid of the process whose cmdline holds `marker`.
fn pid_with(marker: &str) -> Option<u32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if String::from_utf8_lossy(&cmdline).contains(marker) {
                return Some(pid);
            }
        }
    }
    None
}

pub async fn proxy(
    hub: &mut Hub,
    rounds: u32,
    duration: Duration,
    connections: u32,
    router_bin: Option<&Path>,
) -> anyhow::Result<Vec<Outcome>> {
    let wrk = PathBuf::from("wrk");
    let (id, _) = hub.create().await?;
    let mut out = Vec::new();
    let mut router: Option<InNetns> = None;
    for server in &SERVERS {
        let r = hub
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(json!({"command": ["sh", "-c", server.start]})),
            )
            .await?;
        if r["exit_code"] != 0 {
            bail!("starting {}: {r}", server.name);
        }
        let url = format!(
            "{}/v1/sandboxes/{id}/ports/{}/index.txt",
            hub.url, server.port
        );
        let mut up = false;
        for _ in 0..100 {
            if let Ok(r) = hub.http.get(&url).send().await {
                if r.status().is_success() {
                    up = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !up {
            bail!("{} did not answer through the hub", server.name);
        }
        let pid = pid_with(server.marker)
            .with_context(|| format!("finding {}'s process", server.name))?;
        if let (Some(bin), None) = (router_bin, &router) {
            router = Some(InNetns::router(bin, pid)?);
        }
        let direct_url = format!("http://127.0.0.1:{}/index.txt", server.port);
        let load = Load {
            wrk: &wrk,
            threads: 2,
            connections,
            duration,
            headers: &[],
        };
        // The router's routing headers: the sandbox's own loopback and port.
        let router_headers = [
            "X-Sandbox-ID: bench".to_string(),
            "X-Sandbox-Pod-IP: 127.0.0.1".to_string(),
            format!("X-Sandbox-Port: {}", server.port),
        ];
        let router_load = Load {
            headers: &router_headers,
            ..load
        };
        let router_url = router
            .as_ref()
            .map(|r| format!("http://127.0.0.1:{}/index.txt", r.port));
        let sides: &[Side] = if router.is_some() {
            &[Side::Direct, Side::Hub, Side::Router]
        } else {
            &[Side::Direct, Side::Hub]
        };
        let mut o = Outcome {
            server: server.name,
            direct: Vec::new(),
            hub: Vec::new(),
            router: Vec::new(),
            command_direct: format!(
                "nsenter --net=/proc/<server pid>/ns/net {}",
                load.command_line(&direct_url)
            ),
            command_hub: load.command_line(&url),
            command_router: router_url.as_ref().map_or(String::new(), |u| {
                format!(
                    "nsenter --net=/proc/<server pid>/ns/net {}",
                    router_load.command_line(u)
                )
            }),
            hub_cpu_us: Vec::new(),
            router_cpu_us: Vec::new(),
        };
        for round in 0..rounds {
            eprintln!("ports: {} round {}/{rounds}", server.name, round + 1);
            // Which side goes first rotates, so drift hits each alike.
            for k in 0..sides.len() {
                match sides[(k + round as usize) % sides.len()] {
                    Side::Direct => o.direct.push(checked(
                        load.run_in_netns(pid, &direct_url)?,
                        duration,
                        "direct",
                    )?),
                    Side::Hub => {
                        let (result, cpu) = with_cpu(hub.pid(), duration, || load.run(&url))?;
                        o.hub.push(result);
                        o.hub_cpu_us.extend(cpu);
                    }
                    Side::Router => {
                        let (Some(r), Some(u)) = (&router, &router_url) else {
                            continue;
                        };
                        let (result, cpu) =
                            with_cpu(r.proc.pid(), duration, || router_load.run_in_netns(pid, u))?;
                        o.router.push(result);
                        o.router_cpu_us.extend(cpu);
                    }
                }
            }
        }
        out.push(o);
    }
    drop(router);
    hub.delete(&id).await?;
    Ok(out)
}

/// One wrk run, and the CPU time process `pid` spent per request in it.
fn with_cpu(
    pid: u32,
    duration: Duration,
    run: impl FnOnce() -> anyhow::Result<WrkResult>,
) -> anyhow::Result<(WrkResult, Option<f64>)> {
    let before = cpu_us(pid)?;
    let result = checked(run()?, duration, "proxied")?;
    let spent = cpu_us(pid)? - before;
    let requests = result.requests_per_sec * duration.as_secs_f64();
    Ok((result, (requests > 0.0).then(|| spent / requests)))
}

/// A run whose answers were mostly errors measured the errors, not the
/// proxy: refused (over 1%) rather than reported.
fn checked(r: WrkResult, duration: Duration, side: &str) -> anyhow::Result<WrkResult> {
    let requests = r.requests_per_sec * duration.as_secs_f64();
    if r.errors as f64 > requests / 100.0 {
        bail!(
            "the {side} wrk run had {} errors in about {requests:.0} requests",
            r.errors
        );
    }
    Ok(r)
}

/// A process started in the sandbox's network namespace (stopped when dropped).
struct InNetns {
    proc: crate::router::procs::Proc,
    port: u16,
    _dir: tempfile::TempDir,
}

impl InNetns {
    /// sandhub-router on `127.0.0.1:{port}` of the namespace of process
    /// `pid`, routing by header with loopback allowed (as its own suite runs it).
    fn router(bin: &Path, pid: u32) -> anyhow::Result<InNetns> {
        let dir = tempfile::tempdir()?;
        // A port free on the host is as good a guess as any in a namespace
        // holding only the bench's own servers.
        let port = crate::router::procs::free_port()?;
        let mut cmd = std::process::Command::new("nsenter");
        cmd.arg(format!("--net=/proc/{pid}/ns/net"))
            .arg(bin)
            .args(["--http-bind-address", &format!("127.0.0.1:{port}")])
            .args(["--metrics-bind-address", "0"])
            .args(["--health-probe-bind-address", "0"])
            .args(["--allow-loopback-pod-ip", "--access-log=false"])
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1");
        let log = dir.path().join("router.log");
        let proc = crate::router::procs::Proc::spawn("sandhub-router", &mut cmd, &log)?;
        for _ in 0..100 {
            let probe = std::process::Command::new("nsenter")
                .arg(format!("--net=/proc/{pid}/ns/net"))
                .args(["curl", "-s", "-o", "/dev/null"])
                .arg(format!("http://127.0.0.1:{port}/"))
                .status()?;
            if probe.success() {
                return Ok(InNetns {
                    proc,
                    port,
                    _dir: dir,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "sandhub-router did not listen in the sandbox's namespace: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    }
}
