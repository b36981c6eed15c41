//! The Gym environment API against the real hub: episodes with every
//! reward and termination kind, reset to the task's start state, batch
//! steps, and recovery after the sandbox dies.

mod common;

use common::{HubOptions, TestHub};
use serde_json::{json, Value};

async fn post(hub: &TestHub, path: &str, body: Value) -> (u16, Value) {
    let r = hub
        .http()
        .post(format!("{}{path}", hub.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
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
    // Kill the sandbox from inside: PID 1 going away ends the namespace.
    let s = step(&hub, &env, "kill -9 $PPID; sleep 5").await;
    let s = if s["info"]["env_error"].is_null() {
        step(&hub, &env, "true").await
    } else {
        s
    };
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
