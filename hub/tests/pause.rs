//! `pause` on the local backend (issue #32 §2): the sandbox's cgroup is
//! frozen, so its processes keep their memory and pids and use no CPU,
//! and `resume` thaws them where they stopped. Real namespaces and
//! cgroups, as every hub test (root).

mod common;

use std::{path::PathBuf, time::Duration};

use sandhub_api::{
    error::Code,
    hub::{Command, CreateSandbox, ExecRequest, IdleAction, SandboxState},
};
use sandhub_client::{http::HubClient, Sandboxes};

use common::{error_body, eventually, shell_ok as sh_ok, HubOptions, TestHub, WAIT};

/// A shell counting in memory (`i`), writing each value to `/tmp/c`
/// every 50 ms. Returns its pid in the sandbox.
const COUNTER: &str = "sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.05; done' \
                       >/dev/null 2>&1 </dev/null & echo $!";

async fn counter(c: &HubClient, id: &str) -> u64 {
    sh_ok(c, id, "cat /tmp/c")
        .await
        .trim()
        .parse()
        .expect("a number")
}

/// The start time (clock ticks since boot) of process `pid` in the
/// sandbox: the same pid with the same start time is the same process.
async fn started(c: &HubClient, id: &str, pid: &str) -> String {
    let stat = sh_ok(c, id, &format!("cat /proc/{pid}/stat")).await;
    // Field 22, counted after the `(comm)` that may hold spaces.
    let after = stat.rsplit_once(')').expect("a stat line").1;
    after
        .split_whitespace()
        .nth(19)
        .expect("starttime")
        .to_string()
}

/// Starts [`COUNTER`] in sandbox `id` and waits until it has counted:
/// its pid and start time.
async fn count_in(c: &HubClient, id: &str) -> (String, String) {
    let pid = sh_ok(c, id, COUNTER).await.trim().to_string();
    eventually("the counter to count", WAIT, || async {
        (counter(c, id).await >= 3).then_some(())
    })
    .await;
    let born = started(c, id, &pid).await;
    (pid, born)
}

async fn ready(c: &HubClient) -> String {
    let sb = c.create(CreateSandbox::default()).await.expect("create");
    assert_eq!(sb.state, SandboxState::Ready);
    sb.id
}

/// The CPU time the sandbox's cgroup has used, in ns (v2 `cpu.stat`, or
/// v1 `cpuacct.usage`); None where neither can be read.
fn cpu_ns(id: &str) -> Option<u64> {
    let v2 = PathBuf::from("/sys/fs/cgroup/sandhub")
        .join(id)
        .join("cpu.stat");
    if let Ok(stat) = std::fs::read_to_string(v2) {
        let usec = stat
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec "))?
            .trim()
            .parse::<u64>()
            .ok()?;
        return Some(usec * 1000);
    }
    for root in ["cpuacct", "cpu,cpuacct", "cpu"] {
        let p = PathBuf::from("/sys/fs/cgroup")
            .join(root)
            .join("sandhub")
            .join(id)
            .join("cpuacct.usage");
        if let Ok(ns) = std::fs::read_to_string(p) {
            return ns.trim().parse().ok();
        }
    }
    None
}

/// Host pids whose mounts name the sandbox: its processes.
fn host_pids(id: &str) -> Vec<i32> {
    common::host_pids_with_mount(&format!("/sandboxes/{id}/"))
}

#[tokio::test]
async fn a_paused_sandbox_keeps_its_processes_and_their_memory() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let id = ready(&c).await;
    let (pid, born) = count_in(&c, &id).await;

    let before = counter(&c, &id).await;
    let paused = c.pause(&id).await.unwrap();
    assert_eq!(paused.state, SandboxState::Paused);
    assert_eq!(c.get(&id).await.unwrap().state, SandboxState::Paused);
    // Unpaused, it would count 20 a second (30 in the pause).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let resumed = c.resume(&id).await.unwrap();
    assert_eq!(resumed.state, SandboxState::Ready);
    let after = counter(&c, &id).await;
    assert!(
        after >= before && after - before <= 15,
        "the counter went from {before} to {after} across a 1.5 s pause"
    );
    // The same process, counting on from its own memory.
    assert_eq!(
        started(&c, &id, &pid).await,
        born,
        "pid {pid} is another process"
    );
    eventually("the counter to count again", WAIT, || async {
        (counter(&c, &id).await >= after + 5).then_some(())
    })
    .await;
    // Resuming what runs is a precondition failure.
    assert_eq!(
        c.resume(&id).await.unwrap_err().code,
        Code::FailedPrecondition
    );
}

#[tokio::test]
async fn a_paused_sandbox_uses_no_cpu_and_is_still_sampled() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let id = ready(&c).await;
    if cpu_ns(&id).is_none() {
        eprintln!("skipped: no readable CPU accounting for the sandbox's cgroup");
        return;
    }
    sh_ok(
        &c,
        &id,
        "sh -c 'while :; do :; done' >/dev/null 2>&1 </dev/null &",
    )
    .await;
    // It burns: over 100 ms of CPU in 500 ms.
    let t0 = cpu_ns(&id).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let burnt = cpu_ns(&id).unwrap() - t0;
    assert!(burnt > 100_000_000, "the loop used only {burnt} ns");

    c.pause(&id).await.unwrap();
    let p0 = cpu_ns(&id).unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let used = cpu_ns(&id).unwrap() - p0;
    assert!(
        used < 10_000_000,
        "a paused sandbox used {used} ns of CPU in 1.2 s"
    );

    // The sampler reads a frozen cgroup as any other: its samples go on,
    // and say no CPU is used.
    let c2 = &c;
    let id2 = id.as_str();
    eventually(
        "an idle sample of the paused sandbox",
        WAIT,
        || async move {
            let sb = c2.get(id2).await.ok()?;
            assert_eq!(sb.state, SandboxState::Paused);
            let usage = sb.usage?;
            (usage.latest.cpu_cores < 0.05 && usage.latest.memory_bytes > 0).then_some(())
        },
    )
    .await;

    c.resume(&id).await.unwrap();
    let r0 = cpu_ns(&id).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let burnt = cpu_ns(&id).unwrap() - r0;
    assert!(
        burnt > 100_000_000,
        "after resume the loop used only {burnt} ns"
    );
}

#[tokio::test]
async fn calls_on_a_paused_sandbox_say_it_is_paused_and_delete_works() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let id = ready(&c).await;
    sh_ok(&c, &id, "sleep 600 >/dev/null 2>&1 </dev/null &").await;
    c.pause(&id).await.unwrap();
    assert_eq!(c.get(&id).await.unwrap().state, SandboxState::Paused);
    let listed = c.list(&Default::default()).await.unwrap();
    assert_eq!(
        listed.iter().find(|s| s.id == id).map(|s| s.state),
        Some(SandboxState::Paused)
    );

    let exec = c
        .exec(
            &id,
            ExecRequest {
                command: Command::Shell("true".into()),
                env: Default::default(),
                cwd: String::new(),
                timeout_seconds: Some(10.0),
                stdin: String::new(),
                container: None,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(exec.code, Code::FailedPrecondition);
    assert!(exec.message.contains("Paused"), "{}", exec.message);

    let (http, url) = (hub.http(), hub.url());
    for (method, rest) in [
        (reqwest::Method::POST, "exec"),
        (reqwest::Method::GET, "files/x"),
        (reqwest::Method::POST, "processes"),
        (reqwest::Method::GET, "ports"),
        (reqwest::Method::POST, "suspend"),
        (reqwest::Method::POST, "pause"),
        (reqwest::Method::POST, "reset"),
    ] {
        let mut r = http.request(method.clone(), format!("{url}/v1/sandboxes/{id}/{rest}"));
        if rest == "exec" || rest == "processes" {
            r = r.json(&serde_json::json!({"command": "true"}));
        }
        if rest == "reset" {
            r = r.json(&serde_json::json!({}));
        }
        let body = error_body(r.send().await.unwrap(), 412, "FAILED_PRECONDITION").await;
        let msg = body["message"].as_str().unwrap();
        assert!(msg.contains("Paused"), "{method} {rest}: {msg}");
    }

    // Delete of a frozen sandbox leaves nothing running.
    assert!(!host_pids(&id).is_empty());
    c.delete(&id).await.unwrap();
    assert_eq!(c.get(&id).await.unwrap_err().code, Code::NotFound);
    assert_eq!(host_pids(&id), Vec::<i32>::new());
}

#[tokio::test]
async fn a_hub_restarted_while_paused_finds_the_sandbox_paused_and_resumes_it() {
    let mut hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let id = ready(&c).await;
    let (pid, born) = count_in(&c, &id).await;
    let before = counter(&c, &id).await;
    c.pause(&id).await.unwrap();

    hub.restart().await;
    let c = hub.client(None);
    // Not dead, not Ready: still Paused, and still frozen.
    assert_eq!(c.get(&id).await.unwrap().state, SandboxState::Paused);
    assert!(!host_pids(&id).is_empty());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(c.get(&id).await.unwrap().state, SandboxState::Paused);

    c.resume(&id).await.unwrap();
    let after = counter(&c, &id).await;
    assert!(
        after >= before,
        "the counter went back from {before} to {after}"
    );
    assert_eq!(started(&c, &id, &pid).await, born);
    eventually("the counter to count again", WAIT, || async {
        (counter(&c, &id).await >= after + 5).then_some(())
    })
    .await;
}

/// The deadline removes a paused sandbox as any other; pausing is no
/// activity, so an idle clock is not restarted by it either.
#[tokio::test]
async fn the_deadline_deletes_a_paused_sandbox() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let sb = c
        .create(CreateSandbox {
            shutdown_after_seconds: Some(3),
            ..Default::default()
        })
        .await
        .unwrap();
    sh_ok(&c, &sb.id, "sleep 600 >/dev/null 2>&1 </dev/null &").await;
    c.pause(&sb.id).await.unwrap();
    let (c2, id) = (&c, sb.id.as_str());
    eventually("the paused sandbox's deadline", WAIT, || async move {
        (c2.get(id).await.err()?.code == Code::NotFound).then_some(())
    })
    .await;
    assert_eq!(host_pids(&sb.id), Vec::<i32>::new());
}

// ------------------------------------------------------------ auto_resume, idle_action (§3)

fn exec_echo(text: &str) -> ExecRequest {
    ExecRequest {
        command: Command::Shell(format!("echo {text}")),
        env: Default::default(),
        cwd: String::new(),
        timeout_seconds: Some(60.0),
        stdin: String::new(),
        container: None,
    }
}

/// How often the hub logged that it auto-resumed `id`.
fn auto_resumes(hub: &TestHub, id: &str) -> usize {
    hub.log()
        .lines()
        .filter(|l| l.contains("auto-resumed") && l.contains(id))
        .count()
}

#[tokio::test]
async fn auto_resume_wakes_a_paused_sandbox_once_for_twenty_callers() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let sb = c
        .create(CreateSandbox {
            auto_resume: Some(true),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(sb.auto_resume, "{sb:?}");
    let pid = sh_ok(&c, &sb.id, "sleep 600 >/dev/null 2>&1 </dev/null & echo $!")
        .await
        .trim()
        .to_string();
    let born = started(&c, &sb.id, &pid).await;
    c.pause(&sb.id).await.unwrap();
    assert_eq!(c.get(&sb.id).await.unwrap().state, SandboxState::Paused);

    // Twenty calls at once, execs and file reads: every one answers, and
    // the sandbox was resumed once.
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let (c, id) = (c.clone(), sb.id.clone());
            tokio::spawn(async move {
                if i % 2 == 0 {
                    c.exec(&id, exec_echo(&i.to_string()))
                        .await
                        .map(|r| r.stdout)
                } else {
                    c.list_files(&id, "").await.map(|_| format!("{i}\n"))
                }
            })
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        let out = call
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("call {i}: {e}"));
        assert_eq!(out, format!("{i}\n"));
    }
    assert_eq!(c.get(&sb.id).await.unwrap().state, SandboxState::Ready);
    assert_eq!(auto_resumes(&hub, &sb.id), 1, "{}", hub.log_tail());
    // Thawed, not restarted: the same process.
    assert_eq!(started(&c, &sb.id, &pid).await, born);

    // A suspended one is started again on its files, once.
    sh_ok(&c, &sb.id, "echo kept > k").await;
    c.suspend(&sb.id).await.unwrap();
    assert_eq!(sh_ok(&c, &sb.id, "cat k").await, "kept\n");
    assert_eq!(c.get(&sb.id).await.unwrap().state, SandboxState::Ready);
    assert_eq!(auto_resumes(&hub, &sb.id), 2);

    // Without it: 412 naming the state, and it stays paused.
    let plain = ready(&c).await;
    c.pause(&plain).await.unwrap();
    let e = c.exec(&plain, exec_echo("x")).await.unwrap_err();
    assert_eq!(e.code, Code::FailedPrecondition);
    assert!(e.message.contains("Paused"), "{}", e.message);
    assert_eq!(c.get(&plain).await.unwrap().state, SandboxState::Paused);
    assert_eq!(auto_resumes(&hub, &plain), 0);
}

#[tokio::test]
async fn a_templates_idle_action_pauses_or_suspends_instead_of_deleting() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    c.put_template(
        "napper",
        sandhub_api::hub::Template {
            idle_action: Some(IdleAction::Pause),
            auto_resume: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let sb = c
        .create(CreateSandbox {
            template: Some("napper".into()),
            idle_timeout_seconds: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (sb.idle_action, sb.auto_resume),
        (Some(IdleAction::Pause), true)
    );
    let (c2, id) = (&c, sb.id.as_str());
    eventually("the idle sandbox to be paused", WAIT, || async move {
        (c2.get(id).await.ok()?.state == SandboxState::Paused).then_some(())
    })
    .await;
    // Paused, it is not idle again (nor deleted): it stays Paused.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(c.get(id).await.unwrap().state, SandboxState::Paused);
    // A call wakes it (the template says auto_resume), and idleness pauses
    // it again.
    assert_eq!(sh_ok(&c, id, "echo up").await, "up\n");
    eventually("the sandbox to be paused again", WAIT, || async move {
        (c2.get(id).await.ok()?.state == SandboxState::Paused).then_some(())
    })
    .await;

    // The request's choice wins over the template's.
    let sb = c
        .create(CreateSandbox {
            template: Some("napper".into()),
            idle_timeout_seconds: Some(1),
            idle_action: Some(IdleAction::Suspend),
            auto_resume: Some(false),
            ..Default::default()
        })
        .await
        .unwrap();
    let id = sb.id.as_str();
    eventually("the idle sandbox to be suspended", WAIT, || async move {
        (c2.get(id).await.ok()?.state == SandboxState::Suspended).then_some(())
    })
    .await;
    assert_eq!(
        c.exec(id, exec_echo("x")).await.unwrap_err().code,
        Code::FailedPrecondition
    );
}

/// Being paused is no activity: a paused sandbox's idle timeout runs on
/// from its last call, and then does its `idle_action` (delete by default;
/// `suspend` lets its memory go).
#[tokio::test]
async fn the_idle_timeout_runs_on_while_paused() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let mut ids = Vec::new();
    for action in [None, Some(IdleAction::Suspend)] {
        let sb = c
            .create(CreateSandbox {
                idle_timeout_seconds: Some(2),
                idle_action: action,
                ..Default::default()
            })
            .await
            .unwrap();
        // A process that would keep a Ready sandbox busy (never idle).
        sh_ok(&c, &sb.id, "sleep 600 >/dev/null 2>&1 </dev/null &").await;
        c.pause(&sb.id).await.unwrap();
        ids.push(sb.id);
    }
    let (c2, deleted, suspended) = (&c, ids[0].as_str(), ids[1].as_str());
    eventually(
        "the idle paused sandbox to be deleted",
        WAIT,
        || async move { (c2.get(deleted).await.err()?.code == Code::NotFound).then_some(()) },
    )
    .await;
    assert_eq!(host_pids(deleted), Vec::<i32>::new());
    eventually("the idle paused sandbox to be suspended", WAIT, || async move {
        (c2.get(suspended).await.ok()?.state == SandboxState::Suspended).then_some(())
    })
    .await;
    assert_eq!(host_pids(suspended), Vec::<i32>::new());
}
