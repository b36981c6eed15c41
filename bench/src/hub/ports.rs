//! Port proxy vs direct: HTTP load (wrk) on a server inside a sandbox,
//! through the hub's `/v1/sandboxes/{id}/ports/{port}/...`, against the
//! same server reached from the sandbox's own network namespace (wrk run
//! under `nsenter --net`, as `ip netns exec` would: no hub in the path).
//! Rounds alternate direct and hub; medians are reported.
//!
//! Two servers: Python's `http.server` (HTTP/1.1 keep-alive, a small file,
//! buffered writes and TCP_NODELAY so Nagle's 40 ms stalls do not hide
//! everything else; the kind of app server the ports API is for, and the
//! one its tests use)
//! and nginx answering `return 200` (no work at all per request: what the
//! proxy's own cost per request looks like, with nothing to hide it).
//!
//! `http.server`'s requests/s fall as its concurrent connections rise
//! (threads behind one GIL: ~15k/s on one connection, ~8k/s on 16, here),
//! so a proxy that serialises requests can make it look faster than
//! direct, and a cheaper proxy slower. The hub's CPU time per request,
//! measured around each hub round, is the proxy's own cost either way.

use std::{path::PathBuf, time::Duration};

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

pub const SERVERS: [Server; 2] = [
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
];

pub struct Outcome {
    pub server: &'static str,
    pub direct: Vec<WrkResult>,
    pub hub: Vec<WrkResult>,
    pub command_direct: String,
    pub command_hub: String,
    /// The hub's CPU time (user + system) per request carried, per hub
    /// round: what the proxy itself costs, whatever else the machine runs.
    pub hub_cpu_us: Vec<f64>,
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
) -> anyhow::Result<Vec<Outcome>> {
    let wrk = PathBuf::from("wrk");
    let (id, _) = hub.create().await?;
    let mut out = Vec::new();
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
        let direct_url = format!("http://127.0.0.1:{}/index.txt", server.port);
        let load = Load {
            wrk: &wrk,
            threads: 2,
            connections,
            duration,
            headers: &[],
        };
        let mut direct = Vec::new();
        let mut through = Vec::new();
        let mut hub_cpu_us = Vec::new();
        for round in 0..rounds {
            eprintln!("ports: {} round {}/{rounds}", server.name, round + 1);
            direct.push(run_in_netns(pid, &load, &direct_url)?);
            let before = cpu_us(hub.pid())?;
            let result = load.run(&url)?;
            let spent = cpu_us(hub.pid())? - before;
            let requests = result.requests_per_sec * duration.as_secs_f64();
            if requests > 0.0 {
                hub_cpu_us.push(spent / requests);
            }
            through.push(result);
        }
        out.push(Outcome {
            server: server.name,
            direct,
            hub: through,
            command_direct: format!(
                "nsenter --net=/proc/<server pid>/ns/net {}",
                load.command_line(&direct_url)
            ),
            command_hub: load.command_line(&url),
            hub_cpu_us,
        });
    }
    hub.delete(&id).await?;
    Ok(out)
}

/// wrk from the sandbox's network namespace (host cgroup and mounts).
fn run_in_netns(pid: u32, load: &Load<'_>, url: &str) -> anyhow::Result<WrkResult> {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .arg("wrk")
        .arg(format!("-t{}", load.threads))
        .arg(format!("-c{}", load.connections))
        .arg(format!("-d{}s", load.duration.as_secs()))
        .arg("--latency")
        .arg(url)
        .output()
        .context("running nsenter wrk")?;
    if !out.status.success() {
        bail!(
            "nsenter wrk failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    crate::wrk::parse(&text).with_context(|| format!("unexpected wrk output:\n{text}"))
}
