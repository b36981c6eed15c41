//! What a claim may ask for, and the reasons it gets when it asks wrongly:
//! volumeClaimTemplates (admission and policy), additionalPodMetadata, env
//! injection policies, and missing pool or template.

mod claim_common;

use claim_common::{pod_metadata, Env};
use k8s_openapi::api::core::v1::{EnvVar, Pod};
use kube::api::PostParams;
use kube::ResourceExt;
use sandhub_api::k8s::claim::ClaimEnvVar;
use sandhub_api::k8s::common::PersistentVolumeClaimTemplate;
use sandhub_api::k8s::conditions::{claim as reason, messages};
use sandhub_api::k8s::names;
use sandhub_api::k8s::template::InjectionPolicy;
use sandhub_api::k8s::warmpool::UpdateStrategyType;
use sandhub_api::k8s::{Sandbox, SandboxClaim};

fn vct(name: &str) -> PersistentVolumeClaimTemplate {
    let mut v = PersistentVolumeClaimTemplate::default();
    v.metadata.name = name.into();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_invalid_vct_rejected() {
    let Some(env) = Env::start("claim-vct", &[]).await else {
        return;
    };
    env.template("tpl", |_| {}).await;
    env.pool("pool", "tpl", 0, UpdateStrategyType::OnReplenish)
        .await;
    let claims = env.api::<SandboxClaim>();
    // Admission (schema + CEL) refuses each v1.0.9 rule.
    let long = "v".repeat(64);
    let many: Vec<String> = (0..129).map(|i| format!("v{i}")).collect();
    let cases: Vec<(&str, Vec<PersistentVolumeClaimTemplate>)> = vec![
        ("empty name", vec![vct("")]),
        ("duplicate names", vec![vct("data"), vct("data")]),
        ("name too long", vec![vct(&long)]),
        ("too many", many.iter().map(|n| vct(n)).collect()),
    ];
    for (i, (what, vcts)) in cases.into_iter().enumerate() {
        let mut c = env.claim_obj(&format!("bad-{i}"), "pool");
        c.spec.volume_claim_templates = Some(vcts);
        match claims.create(&PostParams::default(), &c).await {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 422, "{what}: {e:?}"),
            other => panic!("{what}: the apiserver accepted an invalid claim: {other:?}"),
        }
    }
    // A valid list the template's policy (Disallowed) does not allow.
    let mut c = env.claim_obj("disallowed", "pool");
    c.spec.volume_claim_templates = Some(vec![vct("data")]);
    env.create_claim(c).await;
    env.claim_reason("disallowed", reason::VOLUME_CLAIM_TEMPLATES_ERROR)
        .await;
    assert!(env
        .api::<Sandbox>()
        .get_opt("disallowed")
        .await
        .unwrap()
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_invalid_metadata() {
    let Some(env) = Env::start("claim-meta", &[]).await else {
        return;
    };
    env.template("tpl", |_| {}).await;
    env.pool("pool", "tpl", 1, UpdateStrategyType::OnReplenish)
        .await;
    let bad = [
        ("no-domain", pod_metadata(&[("team", "a")], &[])),
        ("router", pod_metadata(&[("app", "sandbox-router")], &[])),
        (
            "reserved-annotation",
            pod_metadata(&[], &[("agents.x-k8s.io/claim-uid", "x")]),
        ),
        (
            "bad-value",
            pod_metadata(&[("sandbox.users.io/team", "a b")], &[]),
        ),
    ];
    for (name, md) in bad {
        let mut c = env.claim_obj(name, "pool");
        c.spec.additional_pod_metadata = Some(md);
        env.create_claim(c).await;
    }
    for name in ["no-domain", "router", "reserved-annotation", "bad-value"] {
        env.claim_reason(name, reason::INVALID_METADATA).await;
    }
    // Allowed metadata reaches the Pod, next to the claim's identity.
    let mut c = env.claim_obj("good", "pool");
    c.spec.additional_pod_metadata = Some(pod_metadata(
        &[
            ("sandbox.users.io/team", "a"),
            ("ml.sandbox.users.io/run", "r1"),
        ],
        &[
            ("note", "hello"),
            ("cluster-autoscaler.kubernetes.io/safe-to-evict", "false"),
        ],
    ));
    let created = env.create_claim(c).await;
    let good = env.claim_ready("good").await;
    let sb = good.status.unwrap().sandbox.unwrap().name;
    let pod = claim_common::eventually(
        claim_common::WAIT,
        "the Pod carries the claim's metadata",
        || async {
            let p = env.api::<Pod>().get_opt(&sb).await.ok()??;
            let has = p.labels().get("sandbox.users.io/team").map(String::as_str) == Some("a")
                && p.labels().get(names::CLAIM_UID) == created.uid().as_ref()
                && p.annotations()
                    .get(names::CLAIM_NAME_ANNOTATION)
                    .map(String::as_str)
                    == Some("good");
            has.then_some(p)
        },
    )
    .await;
    assert_eq!(
        pod.annotations().get("note").map(String::as_str),
        Some("hello")
    );
    assert_eq!(
        pod.labels()
            .get("ml.sandbox.users.io/run")
            .map(String::as_str),
        Some("r1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_env_injection_policies() {
    let Some(env) = Env::start("claim-env", &[]).await else {
        return;
    };
    let with_env = |policy: InjectionPolicy| {
        move |t: &mut sandhub_api::k8s::SandboxTemplateSpec| {
            t.env_vars_injection_policy = policy;
            t.blueprint.pod_template.spec.containers[0].env = Some(vec![EnvVar {
                name: "MODE".into(),
                value: Some("template".into()),
                value_from: None,
            }]);
        }
    };
    env.template("t-dis", with_env(InjectionPolicy::Disallowed))
        .await;
    env.template("t-allow", with_env(InjectionPolicy::Allowed))
        .await;
    env.template("t-over", with_env(InjectionPolicy::Overrides))
        .await;
    // Warm members exist, but env forces a cold start.
    env.pool("p-dis", "t-dis", 1, UpdateStrategyType::OnReplenish)
        .await;
    env.pool("p-allow", "t-allow", 1, UpdateStrategyType::OnReplenish)
        .await;
    env.pool("p-over", "t-over", 1, UpdateStrategyType::OnReplenish)
        .await;
    let claim = |name: &str, pool: &str, vars: &[(&str, &str)]| {
        let mut c = env.claim_obj(name, pool);
        c.spec.env = Some(
            vars.iter()
                .map(|(k, v)| ClaimEnvVar {
                    name: k.to_string(),
                    value: v.to_string(),
                    container_name: None,
                })
                .collect(),
        );
        c
    };
    env.create_claim(claim("dis", "p-dis", &[("EXTRA", "1")]))
        .await;
    env.create_claim(claim("allow-new", "p-allow", &[("EXTRA", "1")]))
        .await;
    env.create_claim(claim("allow-override", "p-allow", &[("MODE", "claim")]))
        .await;
    env.create_claim(claim(
        "over",
        "p-over",
        &[("MODE", "claim"), ("EXTRA", "2")],
    ))
    .await;
    env.claim_reason("dis", reason::ENV_VARS_INJECTION_REJECTED)
        .await;
    env.claim_reason("allow-override", reason::ENV_VARS_INJECTION_REJECTED)
        .await;
    let env_of = |sb: &Sandbox| -> Vec<(String, String)> {
        sb.spec.blueprint.pod_template.spec.containers[0]
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.name, e.value.unwrap_or_default()))
            .collect()
    };
    let p = |a: &str, b: &str| (a.to_string(), b.to_string());
    for (name, want) in [
        ("allow-new", vec![p("MODE", "template"), p("EXTRA", "1")]),
        ("over", vec![p("MODE", "claim"), p("EXTRA", "2")]),
    ] {
        let c = env.claim_ready(name).await;
        let sb_name = c.status.unwrap().sandbox.unwrap().name;
        assert_eq!(
            sb_name, name,
            "an env claim is created cold, named like the claim"
        );
        let sb = env.api::<Sandbox>().get(&sb_name).await.unwrap();
        assert_eq!(
            sb.labels().get(names::LAUNCH_TYPE).map(String::as_str),
            Some("cold")
        );
        assert_eq!(env_of(&sb), want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_warm_pool_not_found_and_template_not_found() {
    let Some(env) = Env::start("claim-refs", &[]).await else {
        return;
    };
    env.claim("no-pool", "missing").await;
    let c = env
        .claim_reason("no-pool", reason::WARM_POOL_NOT_FOUND)
        .await;
    let ready = c
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.message, messages::warm_pool_not_found("missing"));

    env.pool("pool", "later", 0, UpdateStrategyType::OnReplenish)
        .await;
    env.claim("no-template", "pool").await;
    env.claim_reason("no-template", reason::TEMPLATE_NOT_FOUND)
        .await;
    // Creating the template unblocks the waiting claim at once (not after
    // the one-minute retry).
    env.template("later", |_| {}).await;
    let t0 = std::time::Instant::now();
    env.claim_ready("no-template").await;
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(50),
        "claim waited for the retry timer"
    );
}
