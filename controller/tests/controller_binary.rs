//! The `sandhub-controller` binary as deployed: metrics and probes, leader election on a
//! Lease, and the `agent-sandbox-config` ConfigMap.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use serde_json::json;

async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let resp = reqwest::get(format!("http://127.0.0.1:{port}{path}"))
        .await
        .ok()?;
    let code = resp.status().as_u16();
    Some((code, resp.text().await.ok()?))
}

#[tokio::test]
async fn metrics_and_probes_are_served() {
    let Some(env) = Env::start("ctl-metrics").await else {
        return;
    };
    let c = &env.controllers[0];
    let (code, body) = eventually(WAIT, "/healthz", || get(c.health_port, "/healthz")).await;
    assert_eq!((code, body.as_str()), (200, "ok"));
    eventually(WAIT, "/readyz 200", || async {
        get(c.health_port, "/readyz")
            .await
            .filter(|(c, _)| *c == 200)
    })
    .await;

    env.create_sandbox(sandbox("m", &[])).await;
    env.sandbox_ready("m").await;
    env.patch::<sandhub_api::k8s::Sandbox>("m", json!({"spec": {"operatingMode": "Suspended"}}))
        .await;
    env.sandbox_until("m", "suspended", |sb| {
        condition(sb, sandhub_api::k8s::conditions::types::SUSPENDED)
            .is_some_and(|(s, _, _)| s == "True")
    })
    .await;
    let ns = env.ns.name();
    let suspended = format!("agent_sandbox_suspend_total{{namespace=\"{ns}\"");
    // The counter moves right after the status write the watch above saw.
    let text = eventually(Duration::from_secs(10), "suspend counter", || async {
        get(c.metrics_port, "/metrics")
            .await
            .filter(|(code, t)| *code == 200 && t.contains(&suspended))
            .map(|(_, t)| t)
    })
    .await;
    for needle in [
        format!("agent_sandboxes{{namespace=\"{ns}\",ready_condition=\"False\",expired=\"false\""),
        format!("agent_sandbox_creation_latency_ms_count{{namespace=\"{ns}\",launch_type=\"cold\""),
        format!("agent_sandbox_suspend_total{{namespace=\"{ns}\",sandbox_template=\"\",owned_by=\"None\",result=\"success\"}} 1"),
        format!("agent_sandbox_suspend_latency_ms_count{{namespace=\"{ns}\""),
        "agent_sandbox_build_info{".to_string(),
    ] {
        assert!(text.contains(&needle), "missing {needle} in\n{text}");
    }
}

fn leader_args(ns: &str) -> Vec<String> {
    [
        "--leader-elect=true",
        "--leader-election-namespace",
        ns,
        "--leader-election-lease-duration=3s",
        "--leader-election-retry-period=300ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[tokio::test]
async fn only_the_lease_holder_reconciles_and_a_standby_takes_over() {
    let Some(mut env) = Env::bare("ctl-leader").await else {
        return;
    };
    let ns = env.ns.name().to_string();
    let args = leader_args(&ns);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    env.spawn_controller(&args);
    env.spawn_controller(&args);

    let leases = env.api::<Lease>();
    let lease =
        sandhub_testkit::wait::until(&leases, "sandhub-controller-leader", WAIT, "held", |l| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_ref())
                .is_some_and(|h| !h.is_empty())
        })
        .await
        .unwrap();
    let holder = lease.spec.unwrap().holder_identity.unwrap();
    env.create_sandbox(sandbox("first", &[])).await;
    env.sandbox_ready("first").await;

    let leaders: Vec<usize> = (0..2)
        .filter(|i| env.controllers[*i].log_text().contains("became leader"))
        .collect();
    assert_eq!(
        leaders.len(),
        1,
        "exactly one leader expected:\n{}",
        env.logs()
    );
    let leader = leaders[0];
    assert!(env.controllers[leader].log_text().contains(&holder));
    let standby = 1 - leader;
    assert!(!env.controllers[standby]
        .log_text()
        .contains("starting controllers"));

    // A crash of the leader: the standby takes the Lease once it expires (3s).
    let killed_at = Instant::now();
    env.kill_controller(leader);
    let lease = sandhub_testkit::wait::until(
        &leases,
        "sandhub-controller-leader",
        WAIT,
        "taken over",
        |l| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_ref())
                .is_some_and(|h| *h != holder)
        },
    )
    .await
    .unwrap();
    let took = killed_at.elapsed();
    assert!(
        took >= Duration::from_secs(2),
        "taken over before the Lease expired: {took:?}"
    );
    assert_eq!(lease.spec.as_ref().unwrap().lease_transitions, Some(1));
    env.create_sandbox(sandbox("second", &[])).await;
    env.sandbox_ready("second").await;
    assert!(env.controllers[standby]
        .log_text()
        .contains("became leader"));
}

#[tokio::test]
async fn config_map_tunes_unset_flags_and_an_invalid_value_stops_the_start() {
    let Some(mut env) = Env::bare("ctl-config").await else {
        return;
    };
    let cms = env.api::<ConfigMap>();
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "agent-sandbox-config"},
        "data": {"sandbox-concurrent-workers": "lots", "no-such-key": "1"}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let idx = env.spawn_controller(&["--leader-elect=false"]);
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(st) = env.controllers[idx].child.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "controller did not stop on an invalid ConfigMap value"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.success());
    let log = env.controllers[idx].log_text();
    assert!(
        log.contains("agent-sandbox-config") && log.contains("lots"),
        "{log}"
    );

    // Valid values start it; unknown keys are only logged.
    let fixed = json!({"data": {"sandbox-concurrent-workers": "4"}});
    env.patch::<ConfigMap>("agent-sandbox-config", fixed).await;
    let idx = env.spawn_controller(&["--leader-elect=false"]);
    env.create_sandbox(sandbox("tuned", &[])).await;
    env.sandbox_ready("tuned").await;
    assert!(
        env.controllers[idx]
            .log_text()
            .contains("ignoring unknown key"),
        "{}",
        env.logs()
    );
}
