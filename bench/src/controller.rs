//! The controller suite: a burst of SandboxClaims against the real
//! apiserver (loopback test cluster, fake node) and the release
//! `sandhub-controller --extensions`, measured from the client's side as the
//! upstream SDK sees it: from sending the create to watching Ready=True.
//!
//! 1. warm: `--claims` claims at once on a pool of the same size, after
//!    every member is Ready;
//! 2. cold: the same burst on a pool of size 0 (every claim creates its
//!    Sandbox, whose Pod the scheduler places and the fake node starts).
//!
//! After each burst it counts duplicates: claims controlling more than one
//! Sandbox, and Sandboxes named by more than one claim. Any is an error.
//!
//! The baseline is the API server's floor, measured in the same run: the same
//! burst of creates in a namespace no controller watches, where the bench
//! itself answers each claim with the one status write any controller must
//! make. No controller can beat it on this cluster; the ratio says how much
//! the controller's own work (adoption writes, Pod updates, refills) adds.
//!
//! With `--rounds N` the floor and the controller's bursts alternate N times
//! (which goes first alternates), each controller round in a namespace of
//! its own with a controller of its own, and the next round starts only once
//! the last one's namespace is gone. The rows pool every round; the details
//! give each round's p50 ratio and their median.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Namespace};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use sandhub_api::k8s::common::LocalRef;
use sandhub_api::k8s::{
    Sandbox, SandboxClaim, SandboxClaimSpec, SandboxTemplate, SandboxTemplateSpec, SandboxWarmPool,
    SandboxWarmPoolSpec,
};

use crate::machine::Machine;
use crate::report::{Report, Row, Target, Unit, Value};
use crate::stats::{median, percentile};

/// Targets from the issue: warm claim→Ready p50 ≤ 50 ms, p99 ≤ 200 ms.
const WARM_P50_MAX_US: f64 = 50_000.0;
const WARM_P99_MAX_US: f64 = 200_000.0;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Kubeconfig of a running test cluster. Unset: the suite starts one
    /// with dev/k8s/cluster.sh in a temp dir and stops it at the end.
    #[arg(long, env = "SANDHUB_BENCH_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The controller binary [default: $CARGO_TARGET_DIR/release/sandhub-controller].
    #[arg(long, env = "SANDHUB_BENCH_CONTROLLER_BIN")]
    controller_bin: Option<PathBuf>,
    /// Claims per burst (and warm pool size).
    #[arg(long, env = "SANDHUB_BENCH_CLAIMS", default_value_t = 300,
          value_parser = clap::value_parser!(u32).range(1..=2000))]
    claims: u32,
    /// Skip the cold burst.
    #[arg(long, env = "SANDHUB_BENCH_WARM_ONLY")]
    warm_only: bool,
    /// Rounds of the floor and the controller's bursts, alternating (which
    /// goes first alternates too): the floor moves by 2x between runs on
    /// this machine, so a ratio wants both sides measured in turn.
    #[arg(long, env = "SANDHUB_BENCH_ROUNDS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=50))]
    rounds: u32,
    /// Give up on a burst (or on filling the pool) after this many seconds.
    #[arg(long, env = "SANDHUB_BENCH_TIMEOUT_SECS", default_value_t = 300)]
    timeout_secs: u64,
    /// Extra flags for the controller, e.g. `--sandbox-claim-concurrent-workers=100`.
    #[arg(
        long = "controller-arg",
        env = "SANDHUB_BENCH_CONTROLLER_ARGS",
        value_delimiter = ' ',
        allow_hyphen_values = true
    )]
    controller_args: Vec<String>,
}

struct Cluster {
    dir: Option<tempfile::TempDir>,
    kubeconfig: PathBuf,
}

impl Cluster {
    fn start(repo: &Path) -> Result<Cluster> {
        Self::start_with(repo, "up")
    }

    /// `verb`: `up` (fake node), or `up-real-node` (root: containerd,
    /// kubelet and runc running the sandboxd image).
    fn start_with(repo: &Path, verb: &str) -> Result<Cluster> {
        let dir = tempfile::Builder::new()
            .prefix("sandhub-bench-k8s-")
            .tempdir()?;
        eprintln!(
            "controller bench: starting a test cluster in {}",
            dir.path().display()
        );
        let st = Command::new("bash")
            .arg(repo.join("dev/k8s/cluster.sh"))
            .arg(verb)
            .arg(dir.path())
            .stdout(Stdio::null())
            .status()?;
        if !st.success() {
            bail!("dev/k8s/cluster.sh {verb} failed");
        }
        Ok(Cluster {
            kubeconfig: dir.path().join("kubeconfig"),
            dir: Some(dir),
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let repo = repo_root();
            let _ = Command::new("bash")
                .arg(repo.join("dev/k8s/cluster.sh"))
                .arg("down")
                .arg(dir.path())
                .stdout(Stdio::null())
                .status();
        }
    }
}

/// A test cluster with the real node, for suites that run sandboxd in Pods.
pub(crate) struct RealNodeCluster(Cluster);

impl RealNodeCluster {
    pub(crate) fn start(repo: &Path) -> Result<Self> {
        Ok(RealNodeCluster(Cluster::start_with(repo, "up-real-node")?))
    }

    pub(crate) fn kubeconfig(&self) -> &Path {
        &self.0.kubeconfig
    }
}

pub(crate) struct Controller(Child);

impl Controller {
    /// `sandhub-controller --extensions` on namespace `ns`, with `extra` flags.
    pub(crate) fn start(
        bin: &Path,
        kubeconfig: &Path,
        ns: &str,
        extra: &[String],
        log: &Path,
    ) -> Result<Self> {
        let child = Command::new(bin)
            .args([
                "--extensions",
                "--leader-elect=false",
                "--watch-namespace",
                ns,
            ])
            .args([
                "--metrics-bind-address",
                "127.0.0.1:0",
                "--health-probe-bind-address",
                "127.0.0.1:0",
            ])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Controller(child))
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub(crate) async fn client(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    cfg.read_timeout = Some(Duration::from_secs(300));
    Ok(Client::try_from(cfg)?)
}

pub async fn run(args: Args) -> Result<Report> {
    let repo = repo_root();
    let _cluster;
    let kubeconfig = match &args.kubeconfig {
        Some(k) => k.clone(),
        None => {
            _cluster = Cluster::start(&repo)?;
            _cluster.kubeconfig.clone()
        }
    };
    let bin = args.controller_bin.clone().unwrap_or_else(|| {
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo.join("target"), PathBuf::from);
        target.join("release/sandhub-controller")
    });
    let client = client(&kubeconfig).await?;
    sandhub_testkit::crds::install_crds(&client, "sandhub-bench").await?;
    let nss: Api<Namespace> = Api::all(client.clone());
    let timeout = Duration::from_secs(args.timeout_secs);
    let (mut floors, mut warms, mut colds, mut fills) = (vec![], vec![], vec![], vec![]);
    let mut log = PathBuf::new();
    for round in 0..args.rounds {
        let ns = format!("bench-controller-{}-{round}", std::process::id());
        let floor_ns = format!("{ns}-floor");
        if round % 2 == 0 {
            floors.push(floor(&client, &nss, &floor_ns, &args).await?);
        }
        create_namespace(&nss, &ns).await?;
        log = std::env::temp_dir().join(format!("{ns}-controller.log"));
        let controller = Controller::start(&bin, &kubeconfig, &ns, &args.controller_args, &log)?;
        let result = bursts(&client, &ns, &args).await;
        drop(controller);
        let _ = nss.delete(&ns, &DeleteParams::background()).await;
        let (warm, cold, pool_fill) = result?;
        // The next burst does not share the API server with this one's teardown.
        gone(&nss, &ns, timeout).await?;
        if round % 2 == 1 {
            floors.push(floor(&client, &nss, &floor_ns, &args).await?);
        }
        if args.rounds > 1 {
            eprintln!(
                "controller bench: round {}: warm p50 {:.1} ms against the floor's {:.1} ms",
                round + 1,
                p50_ms(&warm),
                p50_ms(floors.last().expect("a floor per round"))
            );
        }
        warms.push(warm);
        colds.extend(cold);
        fills.push(pool_fill);
    }
    let round_ratios: Vec<f64> = warms
        .iter()
        .zip(&floors)
        .map(|(w, f)| p50_ms(w) / p50_ms(f))
        .collect();
    let floor = Burst::pooled(floors);
    let warm = Burst::pooled(warms);
    let cold = (!colds.is_empty()).then(|| Burst::pooled(colds));
    fills.sort_unstable();
    let pool_fill = fills[fills.len() / 2];

    let mut report = Report {
        suite: "controller",
        machine: Machine::probe(&std::env::temp_dir()),
        rows: Vec::new(),
        details: Vec::new(),
    };
    let us = |d: Duration| Value::new(d.as_secs_f64() * 1e6, Unit::Microseconds);
    let n = args.claims;
    let sorted = |b: &Burst| {
        let mut lat = b.latencies.clone();
        lat.sort_unstable();
        lat
    };
    let floor_lat = sorted(&floor);
    let mut add = |label: &str, s: &Burst, p50max: Option<f64>, p99max: Option<f64>| {
        let lat = sorted(s);
        let max = |m: Option<f64>| m.map(|v| Target::AtMost(Value::new(v, Unit::Microseconds)));
        let row = |what: String, base: Duration, got: Duration, target: Option<Target>| {
            Row::compare(what, us(base), us(got), target)
        };
        for (p, target) in [(50.0, max(p50max)), (90.0, None), (99.0, max(p99max))] {
            report.rows.push(row(
                format!("{label}: claim→Ready p{p} ({n} at once)"),
                percentile(&floor_lat, p),
                percentile(&lat, p),
                target,
            ));
        }
        report.rows.push(row(
            format!("{label}: whole burst Ready"),
            floor.all_ready,
            s.all_ready,
            None,
        ));
        report.rows.push(row(
            format!("{label}: API server answered every create"),
            floor.creates_done,
            s.creates_done,
            None,
        ));
    };
    add("warm", &warm, Some(WARM_P50_MAX_US), Some(WARM_P99_MAX_US));
    if let Some(cold) = &cold {
        add("cold", cold, None, None);
    }
    report.detail(
        "warm duplicates (claims with >1 Sandbox + Sandboxes of >1 claim)",
        warm.duplicates,
    );
    if let Some(cold) = &cold {
        report.detail("cold duplicates", cold.duplicates);
        report.detail(
            "cold claims that adopted warm (must be 0)",
            cold.warm_launches,
        );
    }
    report.detail(
        format!("warm claims served warm (of {})", n * args.rounds),
        warm.warm_launches,
    );
    report.detail(
        format!("pool of {n}: 0→all Ready"),
        format!("{:.2} s", pool_fill.as_secs_f64()),
    );
    if round_ratios.len() > 1 {
        report.detail(
            format!(
                "warm p50 ÷ the floor's, per round ({} alternating rounds; the rows pool them)",
                round_ratios.len()
            ),
            format!(
                "{} (median {:.2}×)",
                round_ratios
                    .iter()
                    .map(|r| format!("{r:.2}×"))
                    .collect::<Vec<_>>()
                    .join(", "),
                median(&round_ratios)
            ),
        );
    }
    report.detail("controller log (the last round's)", log.display());
    report.detail(
        "controller args",
        if args.controller_args.is_empty() {
            "(defaults)".to_string()
        } else {
            args.controller_args.join(" ")
        },
    );
    if warm.duplicates > 0 || cold.as_ref().is_some_and(|c| c.duplicates > 0) {
        report.print_table();
        bail!("duplicates found: a claim owns two Sandboxes or a Sandbox two claims");
    }
    Ok(report)
}

struct Burst {
    latencies: Vec<Duration>,
    all_ready: Duration,
    /// Until the API server had answered every create.
    creates_done: Duration,
    duplicates: usize,
    warm_launches: usize,
}

impl Burst {
    /// Rounds as one: every latency, the median round's whole-burst times,
    /// and the counts summed.
    fn pooled(rounds: Vec<Burst>) -> Burst {
        let median = |f: fn(&Burst) -> Duration| {
            let mut v: Vec<Duration> = rounds.iter().map(f).collect();
            v.sort_unstable();
            v[v.len() / 2]
        };
        Burst {
            all_ready: median(|b| b.all_ready),
            creates_done: median(|b| b.creates_done),
            duplicates: rounds.iter().map(|b| b.duplicates).sum(),
            warm_launches: rounds.iter().map(|b| b.warm_launches).sum(),
            latencies: rounds.into_iter().flat_map(|b| b.latencies).collect(),
        }
    }
}

fn p50_ms(b: &Burst) -> f64 {
    let mut lat = b.latencies.clone();
    lat.sort_unstable();
    percentile(&lat, 50.0).as_secs_f64() * 1e3
}

/// Waits until namespace `ns` and everything in it are gone.
async fn gone(nss: &Api<Namespace>, ns: &str, timeout: Duration) -> Result<()> {
    let t0 = Instant::now();
    while nss.get_opt(ns).await?.is_some() {
        if t0.elapsed() > timeout {
            bail!("namespace {ns} still there after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

async fn bursts(
    client: &Client,
    ns: &str,
    args: &Args,
) -> Result<(Burst, Option<Burst>, Duration)> {
    let timeout = Duration::from_secs(args.timeout_secs);
    let n = args.claims as usize;
    let mut spec = SandboxTemplateSpec::default();
    spec.blueprint.pod_template.spec.containers = vec![Container {
        name: "main".into(),
        image: Some("busybox".into()),
        ..Default::default()
    }];
    Api::<SandboxTemplate>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &SandboxTemplate::new("tpl", spec))
        .await?;
    let pools: Api<SandboxWarmPool> = Api::namespaced(client.clone(), ns);
    let pool = |name: &str, replicas: i32| {
        SandboxWarmPool::new(
            name,
            SandboxWarmPoolSpec {
                replicas,
                sandbox_template_ref: LocalRef { name: "tpl".into() },
                update_strategy: None,
            },
        )
    };
    let t0 = Instant::now();
    pools
        .create(&PostParams::default(), &pool("warm", n as i32))
        .await?;
    eprintln!("controller bench: filling a pool of {n}");
    loop {
        let p = pools.get("warm").await?;
        if p.status.is_some_and(|s| s.ready_replicas == n as i32) {
            break;
        }
        if t0.elapsed() > timeout {
            bail!("the pool did not fill within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fill = t0.elapsed();
    // Let the pool's last status writes and the Pods' settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!(
        "controller bench: pool full after {:.2}s; warm burst of {n}",
        fill.as_secs_f64()
    );
    let warm = burst(client, ns, "warm", "w", n, timeout, true).await?;
    let cold = if args.warm_only {
        None
    } else {
        pools
            .create(&PostParams::default(), &pool("empty", 0))
            .await?;
        eprintln!("controller bench: cold burst of {n}");
        Some(burst(client, ns, "empty", "c", n, timeout, true).await?)
    };
    Ok((warm, cold, fill))
}

async fn create_namespace(nss: &Api<Namespace>, name: &str) -> Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    nss.create(&PostParams::default(), &ns).await?;
    Ok(())
}

/// The API server's floor: the same burst in namespace `ns`, which no
/// controller watches, answered by the bench with one status write per claim
/// (Ready=True naming a Sandbox) as soon as its watch shows the claim.
async fn floor(client: &Client, nss: &Api<Namespace>, ns: &str, args: &Args) -> Result<Burst> {
    create_namespace(nss, ns).await?;
    let claims: Api<SandboxClaim> = Api::namespaced(client.clone(), ns);
    let oracle = tokio::spawn(async move {
        let stream = watcher(claims.clone(), watcher::Config::default());
        futures::pin_mut!(stream);
        let mut answered = HashSet::new();
        while let Some(ev) = stream.next().await {
            let Ok(watcher::Event::Apply(c)) = ev else {
                continue;
            };
            if ready(&c) || !answered.insert(c.name_any()) {
                continue;
            }
            let claims = claims.clone();
            tokio::spawn(async move {
                let patch = serde_json::json!({"status": {
                    "conditions": [{
                        "type": "Ready", "status": "True", "reason": "SandboxReady",
                        "message": "", "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
                    }],
                    "sandbox": {"name": c.name_any()},
                }});
                claims
                    .patch_status(
                        &c.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
            });
        }
    });
    eprintln!(
        "controller bench: API server floor, a burst of {}",
        args.claims
    );
    let result = burst(
        client,
        ns,
        "floor",
        "f",
        args.claims as usize,
        Duration::from_secs(args.timeout_secs),
        false,
    )
    .await;
    oracle.abort();
    let _ = nss.delete(ns, &DeleteParams::background()).await;
    gone(nss, ns, Duration::from_secs(args.timeout_secs)).await?;
    result
}

fn ready(c: &SandboxClaim) -> bool {
    c.status.as_ref().is_some_and(|s| {
        s.sandbox.as_ref().is_some_and(|sb| !sb.name.is_empty())
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

async fn burst(
    client: &Client,
    ns: &str,
    pool: &str,
    prefix: &str,
    n: usize,
    timeout: Duration,
    check: bool,
) -> Result<Burst> {
    let claims: Api<SandboxClaim> = Api::namespaced(client.clone(), ns);
    // The watch runs before the first create, so no Ready is missed.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let watch = {
        let claims = claims.clone();
        let prefix = format!("{prefix}-");
        tokio::spawn(async move {
            let mut seen = HashSet::new();
            let stream = watcher(claims, watcher::Config::default());
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                let objs = match ev {
                    Ok(watcher::Event::Apply(c)) | Ok(watcher::Event::InitApply(c)) => vec![c],
                    _ => continue,
                };
                for c in objs {
                    let name = c.name_any();
                    if name.starts_with(&prefix) && ready(&c) && seen.insert(name.clone()) {
                        let _ = tx.send((name, Instant::now()));
                    }
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = Instant::now();
    let creates = (0..n).map(|i| {
        let claims = claims.clone();
        let name = format!("{prefix}-{i}");
        let mut spec = SandboxClaimSpec::default();
        spec.warm_pool_ref.name = pool.into();
        let claim = SandboxClaim::new(&name, spec);
        async move {
            let sent = Instant::now();
            claims
                .create(&PostParams::default(), &claim)
                .await
                .map(|_| (name, sent))
        }
    });
    let sent: HashMap<String, Instant> = futures::future::join_all(creates)
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let creates_done = start.elapsed();
    let mut latencies = Vec::with_capacity(n);
    while latencies.len() < n {
        let left = timeout.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some((name, at))) => latencies.push(at - sent[&name]),
            _ => {
                // Say why: the Ready condition of a few that are not.
                let list = claims.list(&ListParams::default()).await?.items;
                let stuck: Vec<String> = list
                    .iter()
                    .filter(|c| c.name_any().starts_with(&format!("{prefix}-")) && !ready(c))
                    .take(3)
                    .map(|c| format!("{}: {:?}", c.name_any(), c.status))
                    .collect();
                bail!(
                    "{} of {n} claims Ready after {timeout:?}; e.g. {stuck:#?}",
                    latencies.len()
                )
            }
        }
    }
    let all_ready = start.elapsed();
    watch.abort();
    if !check {
        return Ok(Burst {
            latencies,
            all_ready,
            creates_done,
            duplicates: 0,
            warm_launches: 0,
        });
    }

    // Duplicates, from the API server's view.
    let sandboxes = Api::<Sandbox>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items;
    let list = claims.list(&ListParams::default()).await?.items;
    let mut duplicates = 0;
    let mut named = HashMap::<String, usize>::new();
    let mut warm_launches = 0;
    for c in list
        .iter()
        .filter(|c| c.name_any().starts_with(&format!("{prefix}-")))
    {
        let uid = c.uid().unwrap_or_default();
        let owned: Vec<&Sandbox> = sandboxes
            .iter()
            .filter(|sb| {
                sb.owner_references()
                    .iter()
                    .any(|o| o.controller == Some(true) && o.uid == uid)
            })
            .collect();
        if owned.len() != 1 {
            duplicates += 1;
        }
        warm_launches += owned
            .iter()
            .filter(|sb| {
                sb.labels()
                    .get(sandhub_api::k8s::names::LAUNCH_TYPE)
                    .map(String::as_str)
                    == Some("warm")
            })
            .count();
        if let Some(sb) = c.status.as_ref().and_then(|s| s.sandbox.as_ref()) {
            *named.entry(sb.name.clone()).or_default() += 1;
        }
    }
    duplicates += named.values().filter(|&&v| v > 1).count();
    Ok(Burst {
        latencies,
        all_ready,
        creates_done,
        duplicates,
        warm_launches,
    })
}
