//! The replicas suite (issue #28): 1, 2 and 4 release hubs on the test
//! cluster's real node, behind one loopback address, under `--clients`
//! clients that each create a sandbox from a warm pool, run `true` in it and
//! delete it, over and over for `--secs` seconds.
//!
//! The address is a round-robin TCP balancer in this process. Every request
//! is a new connection, so requests spread over the replicas as a Service
//! spreads connections. A replica that refuses a connection is skipped, as
//! kube-proxy stops sending to an endpoint that went away.
//!
//! Then the failover run: the largest replica count again, with one replica
//! killed (SIGKILL) halfway. A call whose connection the kill cuts is
//! retried once, as a client of a Service would; creates carry the
//! `sandhub.io/idempotency-key` label, so a retried create gets the sandbox
//! the cut call made. Targets: no cycle fails after that retry, and no call
//! started after the kill fails at all.
//!
//! The baseline of each row is the single replica in the same run: the ratio
//! says how throughput and latency move as replicas are added on this
//! machine (two cores run everything here, the node's Pods included).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use sandhub_api::k8s::{SandboxTemplate, SandboxWarmPool};
use tokio::net::{TcpListener, TcpStream};

use crate::controller::{client, repo_root, Controller, RealNodeCluster};
use crate::machine::Machine;
use crate::report::{Report, Row, Unit, Value};
use crate::stats::percentile;

const POOL: &str = "bench-replicas";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Kubeconfig of a running test cluster with the real node. Unset: the
    /// suite starts one (dev/k8s/cluster.sh up-real-node, as root).
    #[arg(long, env = "SANDHUB_BENCH_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Replica counts, in order; the first is the baseline.
    #[arg(
        long,
        env = "SANDHUB_BENCH_REPLICAS",
        value_delimiter = ',',
        default_value = "1,2,4"
    )]
    replicas: Vec<usize>,
    /// Concurrent clients.
    #[arg(long, env = "SANDHUB_BENCH_CLIENTS", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=512))]
    clients: u32,
    /// Warm pool size.
    #[arg(long, env = "SANDHUB_BENCH_POOL", default_value_t = 16)]
    pool: u32,
    /// Seconds each replica count runs.
    #[arg(long, env = "SANDHUB_BENCH_SECS", default_value_t = 30)]
    secs: u64,
    /// Skip the failover run.
    #[arg(long, env = "SANDHUB_BENCH_NO_FAILOVER")]
    no_failover: bool,
    /// Where `sandhub` and `sandhub-controller` are [default: $CARGO_TARGET_DIR/release].
    #[arg(long, env = "SANDHUB_BENCH_BIN_DIR")]
    bin_dir: Option<PathBuf>,
}

impl Args {
    fn bin(&self, name: &str) -> PathBuf {
        let dir = self.bin_dir.clone().unwrap_or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| repo_root().join("target"), PathBuf::from)
                .join("release")
        });
        dir.join(name)
    }
}

/// One `sandhub serve --backend kubernetes` process.
struct Replica {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_addr() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

async fn start_replica(
    hub: &Path,
    kubeconfig: &Path,
    ns: &str,
    key: &Path,
    log: &Path,
) -> Result<Replica> {
    let addr = free_addr()?;
    let child = Command::new(hub)
        .args(["serve", "--backend", "kubernetes", "--connect", "direct"])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--namespace", ns, "--listen", &addr.to_string()])
        .arg("--sandboxd-token-key-file")
        .arg(key)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::options()
                .create(true)
                .append(true)
                .open(log)?,
        )
        .spawn()
        .context("starting sandhub serve")?;
    let replica = Replica { child, addr };
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = http.get(format!("http://{addr}/readyz")).send().await {
            if r.status().is_success() {
                return Ok(replica);
            }
        }
        if Instant::now() > deadline {
            bail!(
                "replica on {addr} not ready after 30 s (log: {})",
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The loopback balancer: a connection goes to the next backend that
/// accepts it.
struct Balancer {
    backends: Mutex<Vec<SocketAddr>>,
    next: AtomicUsize,
}

impl Balancer {
    async fn serve(self: Arc<Self>, listener: TcpListener, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Relaxed) {
            let Ok((inbound, _)) = listener.accept().await else {
                continue;
            };
            let me = self.clone();
            tokio::spawn(async move {
                let backends = me.backends.lock().unwrap().clone();
                let start = me.next.fetch_add(1, Ordering::Relaxed);
                for i in 0..backends.len() {
                    let addr = backends[(start + i) % backends.len()];
                    if let Ok(mut out) = TcpStream::connect(addr).await {
                        let _ = out.set_nodelay(true);
                        let mut inbound = inbound;
                        let _ = inbound.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        return;
                    }
                }
            });
        }
    }
}

/// What the clients saw in one run.
#[derive(Default)]
struct Run {
    cycles: usize,
    create: Vec<Duration>,
    exec: Vec<Duration>,
    /// Calls that failed, and of those, calls started after the kill.
    failed: usize,
    failed_after_kill: usize,
    started_after_kill: usize,
    /// Calls cut in flight (the connection closed) and retried once.
    retried: usize,
    elapsed: Duration,
}

async fn call(req: reqwest::RequestBuilder, want: u16) -> Result<serde_json::Value> {
    let r = req.send().await?;
    let status = r.status().as_u16();
    let body = r.bytes().await?;
    if status != want {
        bail!("{status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null))
}

/// A call retried once when its connection was cut (its replica was
/// killed mid-call): `make` builds the same request again. Creates carry an
/// idempotency label, so a retried create answers the sandbox the cut call
/// made, if it made one; a retried delete that finds it gone is done.
async fn call_retried(
    make: impl Fn() -> reqwest::RequestBuilder,
    want: u16,
    retried: &AtomicUsize,
) -> Result<serde_json::Value> {
    match call(make(), want).await {
        Err(e) if cut(&e) => {
            retried.fetch_add(1, Ordering::Relaxed);
            match call(make(), want).await {
                Err(e) if want == 204 && e.to_string().starts_with("404") => {
                    Ok(serde_json::Value::Null)
                }
                r => r,
            }
        }
        r => r,
    }
}

/// Whether the call failed in transport (no HTTP answer), not by status.
fn cut(e: &anyhow::Error) -> bool {
    e.downcast_ref::<reqwest::Error>()
        .is_some_and(|e| e.is_request() || e.is_connect() || e.is_body())
}

async fn drive(url: String, clients: u32, secs: u64, kill: Option<(Duration, Replica)>) -> Run {
    let run = Arc::new(Mutex::new(Run::default()));
    let killed_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    let retried = Arc::new(AtomicUsize::new(0));
    for client in 0..clients {
        let (url, run, killed_at) = (url.clone(), run.clone(), killed_at.clone());
        let retried = retried.clone();
        tasks.push(tokio::spawn(async move {
            // A new connection per request: the balancer spreads requests.
            let http = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .timeout(Duration::from_secs(120))
                .build()
                .expect("a client");
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let key = format!("c{client}-{n}-{:x}", rand_u128() as u32);
                let began = Instant::now();
                let after_kill = killed_at.lock().unwrap().is_some();
                let outcome: Result<(Duration, Duration)> = async {
                    let t = Instant::now();
                    let body = serde_json::json!({
                        "pool": POOL,
                        "labels": {"sandhub.io/idempotency-key": key},
                    });
                    let created = call_retried(
                        || http.post(format!("{url}/v1/sandboxes")).json(&body),
                        201,
                        &retried,
                    )
                    .await?;
                    let create = t.elapsed();
                    let id = created["id"].as_str().context("no id")?.to_string();
                    let t = Instant::now();
                    call_retried(
                        || {
                            http.post(format!("{url}/v1/sandboxes/{id}/exec"))
                                .json(&serde_json::json!({"command": ["true"]}))
                        },
                        200,
                        &retried,
                    )
                    .await?;
                    let exec = t.elapsed();
                    call_retried(
                        || http.delete(format!("{url}/v1/sandboxes/{id}")),
                        204,
                        &retried,
                    )
                    .await?;
                    Ok((create, exec))
                }
                .await;
                let mut r = run.lock().unwrap();
                if after_kill {
                    r.started_after_kill += 1;
                }
                match outcome {
                    Ok((create, exec)) => {
                        r.cycles += 1;
                        r.create.push(create);
                        r.exec.push(exec);
                    }
                    Err(e) => {
                        r.failed += 1;
                        if after_kill {
                            r.failed_after_kill += 1;
                        }
                        if r.failed <= 5 {
                            eprintln!(
                                "replicas bench: a cycle failed after {:?}: {e:#}",
                                began.elapsed()
                            );
                        }
                    }
                }
            }
        }));
    }
    if let Some((at, mut victim)) = kill {
        tokio::time::sleep(at).await;
        let _ = victim.child.kill();
        let _ = victim.child.wait();
        *killed_at.lock().unwrap() = Some(Instant::now());
        eprintln!("replicas bench: killed the replica on {}", victim.addr);
    }
    for t in tasks {
        let _ = t.await;
    }
    let mut r = std::mem::take(&mut *run.lock().unwrap());
    r.elapsed = t0.elapsed();
    r.retried = retried.load(Ordering::Relaxed);
    r
}

pub async fn run(args: Args) -> Result<Report> {
    let repo = repo_root();
    let _cluster;
    let kubeconfig = match &args.kubeconfig {
        Some(k) => k.clone(),
        None => {
            _cluster = RealNodeCluster::start(&repo)?;
            _cluster.kubeconfig().to_path_buf()
        }
    };
    let client = client(&kubeconfig).await?;
    sandhub_testkit::crds::install_crds(&client, "sandhub-bench").await?;
    let ns = format!("bench-replicas-{}", std::process::id());
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?,
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("sandboxd-token-key");
    std::fs::write(&key, format!("{:064x}\n", rand_u128()))?;
    let log = std::env::temp_dir().join(format!("{ns}.log"));

    let templates: Api<SandboxTemplate> = Api::namespaced(client.clone(), &ns);
    templates
        .create(&PostParams::default(), &serde_json::from_value(template())?)
        .await?;
    let pools: Api<SandboxWarmPool> = Api::namespaced(client.clone(), &ns);
    pools
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                "kind": "SandboxWarmPool",
                "metadata": {"name": POOL},
                "spec": {"replicas": args.pool, "sandboxTemplateRef": {"name": POOL}},
            }))?,
        )
        .await?;
    let controller = Controller::start(
        &args.bin("sandhub-controller"),
        &kubeconfig,
        &ns,
        &[
            "--sandboxd-token-key-file".into(),
            key.display().to_string(),
        ],
        &log,
    )?;

    let result = runs(&args, &kubeconfig, &ns, &key, &log, pools).await;
    drop(controller);
    let _ = nss.delete(&ns, &DeleteParams::background()).await;
    let results = result?;

    let mut report = Report {
        suite: "replicas",
        machine: Machine::probe(&std::env::temp_dir()),
        rows: Vec::new(),
        details: Vec::new(),
    };
    let us = |d: Duration| Value::new(d.as_secs_f64() * 1e6, Unit::Microseconds);
    let rate = |r: &Run| Value::new(r.cycles as f64 / r.elapsed.as_secs_f64(), Unit::PerSecond);
    let sorted = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v
    };
    let (base_n, base) = &results[0];
    let failover = (!args.no_failover).then(|| results.len() - 1);
    for (i, (n, r)) in results.iter().enumerate() {
        let n = if Some(i) == failover {
            format!("failover, {n} replicas with one killed")
        } else {
            format!("{n} replicas")
        };
        report.rows.push(Row::compare(
            format!(
                "{n}: create+exec+delete cycles/s ({} clients)",
                args.clients
            ),
            rate(base),
            rate(r),
            None,
        ));
        for (what, got, was) in [
            ("create", &r.create, &base.create),
            ("exec", &r.exec, &base.exec),
        ] {
            let (got, was) = (sorted(got), sorted(was));
            if got.is_empty() || was.is_empty() {
                continue;
            }
            for p in [50.0, 99.0] {
                report.rows.push(Row::compare(
                    format!("{n}: {what} p{p}"),
                    us(percentile(&was, p)),
                    us(percentile(&got, p)),
                    None,
                ));
            }
        }
        report.detail(
            format!("{n}: cycles, failed, calls retried once"),
            format!("{}, {}, {}", r.cycles, r.failed, r.retried),
        );
    }
    report.detail("baseline", format!("{base_n} replica(s), same run"));
    if !args.no_failover {
        let n = *args.replicas.iter().max().unwrap_or(&2);
        let (_, f) = results.last().expect("the failover run");
        report.rows.push(Row::absolute(
            format!(
                "{n} replicas, one killed mid-run: failed calls started after the kill (of {})",
                f.started_after_kill
            ),
            Value::new(f.failed_after_kill as f64, Unit::Count),
            Some(Value::new(0.0, Unit::Count)),
        ));
        report.rows.push(Row::absolute(
            format!(
                "{n} replicas, one killed mid-run: failed cycles in all, after one retry of a \
                 cut call (of {})",
                f.cycles + f.failed
            ),
            Value::new(f.failed as f64, Unit::Count),
            Some(Value::new(0.0, Unit::Count)),
        ));
        report.detail(
            "failover: calls cut in flight and retried once (creates carry an idempotency key)",
            f.retried,
        );
    }
    report.detail("pool size", args.pool);
    report.detail("hub log", log.display());
    Ok(report)
}

async fn runs(
    args: &Args,
    kubeconfig: &Path,
    ns: &str,
    key: &Path,
    log: &Path,
    pools: Api<SandboxWarmPool>,
) -> Result<Vec<(usize, Run)>> {
    let mut results = Vec::new();
    let mut counts = args.replicas.clone();
    if !args.no_failover {
        counts.push(*args.replicas.iter().max().unwrap_or(&2).max(&2));
    }
    let failover_at = counts.len() - 1;
    for (i, n) in counts.into_iter().enumerate() {
        let mut replicas = Vec::new();
        for _ in 0..n {
            replicas.push(start_replica(&args.bin("sandhub"), kubeconfig, ns, key, log).await?);
        }
        wait_pool(&pools, args.pool).await?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let balancer = Arc::new(Balancer {
            backends: Mutex::new(replicas.iter().map(|r| r.addr).collect()),
            next: AtomicUsize::new(0),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let serving = tokio::spawn(balancer.clone().serve(listener, stop.clone()));
        let kill = (!args.no_failover && i == failover_at)
            .then(|| (Duration::from_secs(args.secs / 2), replicas.remove(0)));
        eprintln!(
            "replicas bench: {n} replica(s), {} clients, {} s{}",
            args.clients,
            args.secs,
            if kill.is_some() {
                ", one killed halfway"
            } else {
                ""
            }
        );
        let run = drive(url, args.clients, args.secs, kill).await;
        stop.store(true, Ordering::Relaxed);
        serving.abort();
        eprintln!(
            "replicas bench: {n}: {} cycles, {} failed",
            run.cycles, run.failed
        );
        results.push((n, run));
        drop(replicas);
    }
    Ok(results)
}

/// Waits until the pool has `size` Ready members (refilled after a run).
async fn wait_pool(pools: &Api<SandboxWarmPool>, size: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let ready = pools
            .get(POOL)
            .await?
            .status
            .map_or(0, |s| s.ready_replicas);
        if ready >= size as i32 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the pool did not fill in 600 s ({ready} of {size} Ready)");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn rand_u128() -> u128 {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .expect("reading /dev/urandom");
    u128::from_ne_bytes(b)
}

/// The pool's template: sandboxd on the real node (as the e2e tests' is).
fn template() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxTemplate",
        "metadata": {"name": POOL},
        "spec": {
            "networkPolicyManagement": "Unmanaged",
            "podTemplate": {"spec": {
                "nodeSelector": {"sandhub.dev/real-node": "true"},
                "tolerations": [{"key": "sandhub.dev/real-node", "operator": "Equal",
                                 "value": "true", "effect": "NoSchedule"}],
                "containers": [{
                    "name": "sandboxd",
                    "image": "sandhub/sandboxd:dev",
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["--listen-host", "0.0.0.0"],
                    "ports": [{"containerPort": 8080}, {"containerPort": 9090}],
                    "readinessProbe": {"httpGet": {"path": "/v1/health", "port": 8080},
                                       "periodSeconds": 1},
                }],
            }},
        },
    })
}
