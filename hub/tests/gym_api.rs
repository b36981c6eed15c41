//! The Gym environment API against the real hub: episodes with every
//! reward and termination kind, reset to the task's start state, batch
//! steps, recovery after the sandbox dies, envs that survive a `kill -9`
//! of the hub, and abandoned envs closed after their idle timeout.

mod common;

use common::{HubOptions, TestHub, ALICE_KEY, BOB_KEY};
use serde_json::{json, Value};

async fn answer(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn post(hub: &TestHub, path: &str, body: Value) -> (u16, Value) {
    post_as(hub, None, path, body).await
}

async fn post_as(hub: &TestHub, key: Option<&str>, path: &str, body: Value) -> (u16, Value) {
    let mut r = hub.http().post(format!("{}{path}", hub.url())).json(&body);
    if let Some(key) = key {
        r = r.bearer_auth(key);
    }
    answer(r.send().await.unwrap()).await
}

async fn get(hub: &TestHub, path: &str) -> (u16, Value) {
    answer(
        hub.http()
            .get(format!("{}{path}", hub.url()))
            .send()
            .await
            .unwrap(),
    )
    .await
}

async fn delete(hub: &TestHub, path: &str) -> (u16, Value) {
    answer(
        hub.http()
            .delete(format!("{}{path}", hub.url()))
            .send()
            .await
            .unwrap(),
    )
    .await
}

async fn create(hub: &TestHub, spec: Value) -> String {
    let (status, body) = post(hub, "/gym/v1/envs", spec).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["observation_space"]["type"], "text");
    assert_eq!(body["action_space"]["type"], "text");
    body["env_id"].as_str().unwrap().to_string()
}

async fn reset(hub: &TestHub, env: &str, seed: Option<u64>) -> Value {
    let (status, body) = post(
        hub,
        &format!("/gym/v1/envs/{env}/reset"),
        json!({"seed": seed}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn step(hub: &TestHub, env: &str, action: &str) -> Value {
    let (status, body) = post(
        hub,
        &format!("/gym/v1/envs/{env}/step"),
        json!({"action": action}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn episode_with_every_reward_and_termination_kind() {
    let hub = TestHub::start(HubOptions::default()).await;
    let env = create(
        &hub,
        json!({
            "task": {
                "files": {"task/goal.txt": "make done.txt say yes\n"},
                "setup": ["echo seed=$SANDHUB_SEED", "mkdir -p out"],
            },
            "reward": [
                {"kind": "exit_code", "weight": 0.5},
                {"kind": "regex", "pattern": "^progress", "stream": "stdout", "weight": 0.25},
                {"kind": "file", "path": "done.txt", "contains": "yes", "weight": 2.0},
                {"kind": "command", "command": "test -f out/verified", "when": "end", "weight": 10.0}
            ],
            "termination": [{"kind": "file", "path": "done.txt", "equals": "yes\n"}],
            "max_episode_steps": 5
        }),
    )
    .await;
    let first = reset(&hub, &env, Some(42)).await;
    assert_eq!(first["observation"], "seed=42\n");
    assert_eq!(first["info"]["step"], 0);
    assert_eq!(first["info"]["episode"], 1);

    // exit code 0 + regex: 0.5 + 0.25.
    let s = step(&hub, &env, "echo progress; cat task/goal.txt").await;
    assert_eq!(s["reward"], 0.75, "{s}");
    assert_eq!(s["terminated"], false);
    assert_eq!(s["truncated"], false);
    assert_eq!(s["observation"], "progress\nmake done.txt say yes\n");
    assert_eq!(s["info"]["exit_code"], 0);
    assert_eq!(s["info"]["step"], 1);

    // A failing command earns nothing; stderr is observed after stdout.
    let s = step(&hub, &env, "echo out; echo err >&2; exit 3").await;
    assert_eq!(s["reward"], 0.0);
    assert_eq!(s["observation"], "out\nerr\n");
    assert_eq!(s["info"]["exit_code"], 3);
    assert_eq!(s["info"]["stderr"], "err\n");

    // Printing what the verify command would look for forges nothing.
    let s = step(&hub, &env, "echo out/verified").await;
    assert_eq!(s["reward"], 0.5);

    // Termination: file matcher; the `end` verify command now counts.
    let s = step(&hub, &env, "touch out/verified; echo yes > done.txt").await;
    assert_eq!(s["terminated"], true, "{s}");
    assert_eq!(s["reward"], 0.5 + 2.0 + 10.0, "{s}");
    assert_eq!(s["info"]["reward_terms"], json!([0.5, 0.0, 2.0, 10.0]));

    // The episode is over until the next reset.
    let (status, body) = post(
        &hub,
        &format!("/gym/v1/envs/{env}/step"),
        json!({"action": "true"}),
    )
    .await;
    assert_eq!(status, 412, "{body}");
    assert_eq!(body["code"], "FAILED_PRECONDITION");
}

#[tokio::test]
async fn max_steps_truncate_and_reset_restores_the_task_start_state() {
    let hub = TestHub::start(HubOptions::default()).await;
    let env = create(
        &hub,
        json!({
            "task": {"files": {"state.txt": "start\n"}, "prompt": "fix state.txt"},
            "max_episode_steps": 2
        }),
    )
    .await;
    let r = reset(&hub, &env, None).await;
    assert_eq!(r["observation"], "fix state.txt");
    let s = step(
        &hub,
        &env,
        "echo changed > state.txt; touch extra; sleep 300 > /dev/null 2>&1 &",
    )
    .await;
    assert_eq!(s["truncated"], false);
    let s = step(&hub, &env, "cat state.txt; ls").await;
    assert_eq!(s["observation"], "changed\nextra\nstate.txt\n");
    assert_eq!(s["truncated"], true);
    assert_eq!(s["terminated"], false);

    let r = reset(&hub, &env, None).await;
    assert_eq!(r["info"]["episode"], 2);
    let s = step(&hub, &env, "cat state.txt; ls; pgrep -c sleep || true").await;
    assert_eq!(s["observation"], "start\nstate.txt\n0\n", "{s}");
}

#[tokio::test]
async fn batch_step_runs_eight_environments_in_order() {
    let hub = TestHub::start(HubOptions::default()).await;
    let mut envs = Vec::new();
    for i in 0..8 {
        let env = create(
            &hub,
            json!({"task": {"env": {"ME": format!("{i}")}}, "reward": [{"kind": "exit_code"}]}),
        )
        .await;
        reset(&hub, &env, Some(i)).await;
        envs.push(env);
    }
    let steps: Vec<Value> = envs
        .iter()
        .map(|e| json!({"env_id": e, "action": "echo $ME-$SANDHUB_SEED"}))
        .chain(std::iter::once(
            json!({"env_id": "env-nonexistent", "action": "true"}),
        ))
        .collect();
    let (status, body) = post(&hub, "/gym/v1/step", json!({"steps": steps})).await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 9);
    for (i, r) in results.iter().take(8).enumerate() {
        assert_eq!(r["env_id"], envs[i].as_str());
        assert_eq!(r["result"]["observation"], format!("{i}-{i}\n"));
        assert_eq!(r["result"]["reward"], 1.0);
    }
    assert_eq!(results[8]["error"]["code"], "NOT_FOUND");
}

#[tokio::test]
async fn a_dead_sandbox_gives_env_error_and_the_next_reset_recovers() {
    let hub = TestHub::start(HubOptions::default()).await;
    let env = create(&hub, json!({"reward": [{"kind": "exit_code"}]})).await;
    let r = reset(&hub, &env, None).await;
    let sandbox = r["info"]["sandbox_id"].as_str().unwrap().to_string();
    // The sandbox dies under the env (its processes killed from the host:
    // from inside, sandboxd is PID 1 and the workload cannot kill it).
    common::kill_host_pids_with_mount(&format!("/sandboxes/{sandbox}/"));
    let s = step(&hub, &env, "true").await;
    assert!(s["info"]["env_error"].is_string(), "{s}");
    assert_eq!(s["truncated"], true);
    assert_eq!(s["reward"], 0.0);
    let r = reset(&hub, &env, None).await;
    assert_ne!(
        r["info"]["sandbox_id"],
        sandbox.as_str(),
        "a fresh sandbox after a failure"
    );
    let s = step(&hub, &env, "echo alive").await;
    assert_eq!(s["observation"], "alive\n");
    assert_eq!(s["reward"], 1.0);
}

#[tokio::test]
async fn oom_in_an_action_is_an_ordinary_failed_step() {
    let hub = TestHub::start(HubOptions::default()).await;
    let r = hub
        .http()
        .put(format!("{}/v1/templates/small", hub.url()))
        .json(&json!({"memory_mb": 64}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let env = create(
        &hub,
        json!({"template": "small", "reward": [{"kind": "exit_code"}]}),
    )
    .await;
    reset(&hub, &env, None).await;
    let s = step(&hub, &env, "head -c 400M /dev/zero | tail > /dev/null").await;
    assert_ne!(s["info"]["exit_code"], 0, "{s}");
    assert_eq!(s["reward"], 0.0);
    let s = step(&hub, &env, "echo still here").await;
    assert_eq!(s["observation"], "still here\n");
}

#[tokio::test]
async fn bad_specs_and_unknown_envs_are_clear_errors() {
    let hub = TestHub::start(HubOptions::default()).await;
    for (spec, code) in [
        (json!({"template": "nope"}), "NOT_FOUND"),
        (
            json!({"reward": [{"kind": "regex", "pattern": "("}]}),
            "INVALID_ARGUMENT",
        ),
        (
            json!({"reward": [{"kind": "file", "path": "x"}]}),
            "INVALID_ARGUMENT",
        ),
        (
            json!({"reward": [{"kind": "telepathy"}]}),
            "INVALID_ARGUMENT",
        ),
        (json!({"step_timeout_seconds": -1}), "INVALID_ARGUMENT"),
        (json!({"idle_timeout_seconds": 0}), "INVALID_ARGUMENT"),
        (
            json!({"idle_timeout_seconds": 366u64 * 24 * 3600}),
            "INVALID_ARGUMENT",
        ),
        (json!({"surprise": true}), "INVALID_ARGUMENT"),
    ] {
        let (status, body) = post(&hub, "/gym/v1/envs", spec.clone()).await;
        assert_eq!(body["code"], code, "{spec}: {body}");
        assert!(status >= 400);
    }
    let (status, body) = post(
        &hub,
        "/gym/v1/envs/env-missing/step",
        json!({"action": "true"}),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(body["code"], "NOT_FOUND");
    let env = create(&hub, json!({})).await;
    let (status, body) = post(
        &hub,
        &format!("/gym/v1/envs/{env}/step"),
        json!({"action": "true"}),
    )
    .await;
    assert_eq!(status, 412, "step before reset: {body}");
    let r = hub
        .http()
        .delete(format!("{}/gym/v1/envs/{env}", hub.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
}

#[tokio::test]
async fn an_env_survives_a_hub_kill9_with_its_config_episode_and_labelled_sandbox() {
    let mut hub = TestHub::start(HubOptions::default()).await;
    let env = create(
        &hub,
        json!({
            "task": {"files": {"a.txt": "hi\n"}, "env": {"ME": "x"}},
            "reward": [{"kind": "exit_code", "weight": 0.5}],
            "max_episode_steps": 3
        }),
    )
    .await;
    let r = reset(&hub, &env, Some(7)).await;
    let sandbox = r["info"]["sandbox_id"].as_str().unwrap().to_string();
    let s = step(&hub, &env, "echo $ME-$SANDHUB_SEED > out.txt").await;
    assert_eq!(s["info"]["step"], 1);

    hub.restart().await;
    // Same sandbox, same task env and seed, same reward, the step count on.
    let s = step(&hub, &env, "cat out.txt a.txt; echo $ME-$SANDHUB_SEED").await;
    assert_eq!(s["observation"], "x-7\nhi\nx-7\n", "{s}");
    assert_eq!(s["info"]["sandbox_id"], sandbox.as_str());
    assert_eq!(s["info"]["step"], 2);
    assert_eq!(s["info"]["episode"], 1);
    assert_eq!(s["reward"], 0.5);
    let s = step(&hub, &env, "false").await;
    assert_eq!(s["reward"], 0.0);
    assert_eq!(s["truncated"], true, "max_episode_steps survived: {s}");

    hub.restart().await;
    // The ended episode stays ended.
    let (status, body) = post(
        &hub,
        &format!("/gym/v1/envs/{env}/step"),
        json!({"action": "true"}),
    )
    .await;
    assert_eq!(status, 412, "{body}");
    let r = reset(&hub, &env, None).await;
    assert_eq!(r["info"]["episode"], 2);
    assert_eq!(r["info"]["sandbox_id"], sandbox.as_str());
    let s = step(&hub, &env, "ls").await;
    assert_eq!(
        s["observation"], "a.txt\n",
        "reset to the task's start: {s}"
    );
    assert_eq!(s["info"]["step"], 1);

    // The sandbox names its env and has a lifetime of its own.
    let (status, sb) = get(&hub, &format!("/v1/sandboxes/{sandbox}")).await;
    assert_eq!(status, 200, "{sb}");
    assert_eq!(sb["labels"]["sandhub.dev/gym-env"], env.as_str(), "{sb}");
    assert_eq!(sb["idle_timeout_seconds"], 3600, "{sb}");

    // Closing deletes the env's record and its sandbox, for good.
    let (status, _) = delete(&hub, &format!("/gym/v1/envs/{env}")).await;
    assert_eq!(status, 204);
    let (status, _) = get(&hub, &format!("/v1/sandboxes/{sandbox}")).await;
    assert_eq!(status, 404);
    hub.restart().await;
    let (status, body) = post(&hub, &format!("/gym/v1/envs/{env}/reset"), json!({})).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["code"], "NOT_FOUND");
    let (status, _) = delete(&hub, &format!("/gym/v1/envs/{env}")).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn after_a_restart_an_env_is_still_only_its_tenants() {
    let mut hub = TestHub::start(HubOptions {
        api_keys: true,
        ..Default::default()
    })
    .await;
    let (status, body) = post_as(&hub, Some(ALICE_KEY), "/gym/v1/envs", json!({})).await;
    assert_eq!(status, 201, "{body}");
    let env = body["env_id"].as_str().unwrap().to_string();
    hub.restart().await;
    // Bob asks first, so the env is not yet loaded when he does.
    let path = format!("/gym/v1/envs/{env}/reset");
    let (status, body) = post_as(&hub, Some(BOB_KEY), &path, json!({})).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = post_as(&hub, Some(ALICE_KEY), &path, json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post_as(&hub, Some(BOB_KEY), &path, json!({})).await;
    assert_eq!(status, 404, "{body}");
    let r = hub
        .http()
        .delete(format!("{}/gym/v1/envs/{env}", hub.url()))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
}

#[tokio::test]
async fn an_abandoned_env_is_closed_with_its_busy_sandbox_after_its_idle_timeout() {
    let hub = TestHub::start(HubOptions::default()).await;
    // A server the agent left running keeps the sandbox busy, which a
    // sandbox's own idle timeout counts as activity; the env's does not.
    let env = create(
        &hub,
        json!({
            "task": {"setup": ["sleep 600 > /dev/null 2>&1 &"]},
            "idle_timeout_seconds": 10
        }),
    )
    .await;
    let r = reset(&hub, &env, None).await;
    let sandbox = r["info"]["sandbox_id"].as_str().unwrap().to_string();
    common::eventually("the idle env to be closed", common::WAIT, || async {
        let (status, _) = get(&hub, &format!("/v1/sandboxes/{sandbox}")).await;
        (status == 404).then_some(())
    })
    .await;
    let (status, body) = post(
        &hub,
        &format!("/gym/v1/envs/{env}/step"),
        json!({"action": "true"}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
}
