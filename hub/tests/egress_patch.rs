//! `PATCH /v1/sandboxes/{id}/network` end to end (issue #27): a real
//! `sandhub serve` (as root), real egress sandboxes, and the small
//! "internet" of `common::internet`. A change applies to the next
//! connection and the next DNS query, leaves other sandboxes alone, never
//! widens the template's policy, and is what a restarted hub enforces.

mod common;

use sandhub_api::hub::{CreateSandbox, NetworkSpec};
use sandhub_client::{http::HubClient, Sandboxes};
use serde_json::json;

use common::{
    error_body,
    internet::{assert_no_name, assert_ok, prerequisites, probe, Internet, ONE_INTERNET},
    mcp::{text, McpClient},
    shell, HubOptions, TestHub, ALICE_KEY, BOB_KEY,
};

async fn create(c: &HubClient, template: &str) -> String {
    c.create(CreateSandbox {
        template: Some(template.into()),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("creating a {template} sandbox: {e}"))
    .id
}

async fn patch(hub: &TestHub, key: &str, id: &str, body: serde_json::Value) -> reqwest::Response {
    hub.http()
        .patch(format!("{}/v1/sandboxes/{id}/network", hub.url()))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// The fake IP the sandbox's resolver gives `name` now.
async fn resolve(c: &HubClient, id: &str, name: &str) -> String {
    let r = shell(
        c,
        id,
        &format!("/usr/bin/python3 -c 'import socket; print(socket.gethostbyname(\"{name}\"))'"),
    )
    .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    r.stdout.trim().to_string()
}

/// A new TCP connection to `ip:80` from inside: `connected` or the error.
async fn dial(c: &HubClient, id: &str, ip: &str) -> String {
    let script = format!(
        r#"/usr/bin/python3 - <<'EOF'
import socket
try:
    socket.create_connection(("{ip}", 80), timeout=20).close()
    print("connected")
except Exception as e:
    print(type(e).__name__)
EOF
"#
    );
    shell(c, id, &script).await.stdout.trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_patch_applies_to_new_connections_at_once_and_survives_a_hub_kill() {
    if !prerequisites() {
        return;
    }
    let _one = ONE_INTERNET.lock().await;
    let net = Internet::up();
    let mut hub = TestHub::start(HubOptions {
        api_keys: true,
        extra_args: &["--egress-dns", "198.18.0.2"],
        ..Default::default()
    })
    .await;
    let alice = hub.client(Some(ALICE_KEY));
    let bob = hub.client(Some(BOB_KEY));
    alice
        .put_template(
            "web",
            serde_json::from_value(json!({"network": {"mode": "egress",
                "allow_out": ["pypi.test", "*.git.test", "api.test:8443"]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let (a, b) = (create(&alice, "web").await, create(&alice, "web").await);
    let got = probe(&alice, &a, &["http://pypi.test/a0", "http://a.git.test/a0"]).await;
    assert_ok(&got[0], "before: pypi.test");
    assert_ok(&got[1], "before: a.git.test");
    // A name resolved under the old policy: its fake IP is dialled again
    // after the change, with no DNS in between.
    let git_ip = resolve(&alice, &a, "a.git.test").await;
    assert!(git_ip.starts_with("100.127."), "{git_ip}");

    // Narrower: 200 with the sandbox, its narrowing in the answer.
    let r = patch(&hub, ALICE_KEY, &a, json!({"allow_out": ["pypi.test"]})).await;
    assert_eq!(r.status(), 200);
    let sb: serde_json::Value = r.json().await.unwrap();
    assert_eq!(sb["id"], a.as_str());
    assert_eq!(
        sb["network"],
        json!({"mode": "egress", "allow_out": ["pypi.test"]})
    );
    let got = probe(&alice, &a, &["http://pypi.test/a1", "http://a.git.test/a1"]).await;
    assert_ok(&got[0], "narrowed: pypi.test");
    assert_no_name(&got[1], "narrowed: a.git.test is no longer answered");
    assert_eq!(dial(&alice, &a, &git_ip).await, "ConnectionRefusedError");
    // The other sandbox of the same template is untouched.
    let got = probe(&alice, &b, &["http://a.git.test/b1"]).await;
    assert_ok(&got[0], &format!("the other sandbox: {}", hub.log_tail()));
    assert_eq!(net.seen("/a1"), 1, "only pypi.test was reached from a");
    assert_eq!(net.seen("/b1"), 1);

    // Never wider than the template (the entry named), a bad pattern named,
    // no other mode: 400.
    for (body, needle) in [
        (
            json!({"allow_out": ["pypi.test", "other.example"]}),
            "allow_out[1] \"other.example\"",
        ),
        (
            json!({"allow_out": ["api.test"]}),
            "allow_out[0] \"api.test\"",
        ),
        (
            json!({"allow_out": ["a.*.test"]}),
            "allow_out[0] \"a.*.test\"",
        ),
        (json!({"mode": "host"}), "widen"),
    ] {
        let r = patch(&hub, ALICE_KEY, &a, body.clone()).await;
        let e = error_body(r, 400, "INVALID_ARGUMENT").await;
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{body}: {e}"
        );
    }
    // Hostile bodies are 400 JSON, never a panic.
    for raw in [
        "{",
        "\"none\"",
        "[1]",
        r#"{"mode": "egress", "allow_out": "pypi.test"}"#,
        r#"{"nope": 1}"#,
    ] {
        let r = hub
            .http()
            .patch(format!("{}/v1/sandboxes/{a}/network", hub.url()))
            .bearer_auth(ALICE_KEY)
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        error_body(r, 400, "INVALID_ARGUMENT").await;
    }
    // The Rust client says the same.
    let e = alice
        .set_network(
            &a,
            serde_json::from_value(json!({"allow_out": ["x.example"]})).unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, sandhub_api::error::Code::InvalidArgument);
    // Another tenant's sandbox: 404, and nothing changes.
    let r = patch(&hub, BOB_KEY, &a, json!({"mode": "none"})).await;
    error_body(r, 404, "NOT_FOUND").await;
    assert!(bob.set_network(&a, NetworkSpec::default()).await.is_err());

    // `none`: every new name and connection refused at once.
    let pypi_ip = resolve(&alice, &a, "pypi.test").await;
    let sb = alice
        .set_network(&a, sandhub_api::hub::Network::None.into())
        .await
        .unwrap();
    assert_eq!(sb.network, Some(sandhub_api::hub::Network::None.into()));
    let asked = net.asked("pypi.test");
    let got = probe(&alice, &a, &["http://pypi.test/off"]).await;
    assert_no_name(&got[0], "none: pypi.test");
    assert_eq!(dial(&alice, &a, &pypi_ip).await, "ConnectionRefusedError");
    assert_eq!(net.asked("pypi.test"), asked, "none asks nothing upstream");
    assert_eq!(net.seen("/off"), 0);
    let log: serde_json::Value = hub
        .http()
        .get(format!("{}/v1/sandboxes/{a}/egress", hub.url()))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let last = log["decisions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["allowed"], false, "{last}");
    assert!(last["reason"].as_str().unwrap().contains("none"), "{last}");

    // kill -9 and restart: the patched policy (`none`) is what runs.
    hub.kill9();
    hub.restart().await;
    let alice = hub.client(Some(ALICE_KEY));
    let got = probe(&alice, &a, &["http://pypi.test/off-after-restart"]).await;
    assert_no_name(
        &got[0],
        &format!("none after a restart: {}", hub.log_tail()),
    );
    assert_eq!(
        alice.get(&a).await.unwrap().network,
        Some(sandhub_api::hub::Network::None.into())
    );
    let got = probe(&alice, &b, &["http://a.git.test/b-after-restart"]).await;
    assert_ok(&got[0], "the other sandbox after a restart");
    // Opened again (within the template) after the restart, then killed
    // again: the narrowing is what the next hub enforces.
    let r = patch(
        &hub,
        ALICE_KEY,
        &a,
        json!({"mode": "egress", "allow_out": ["pypi.test"]}),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    hub.restart().await;
    let alice = hub.client(Some(ALICE_KEY));
    let got = probe(&alice, &a, &["http://pypi.test/a2", "http://a.git.test/a2"]).await;
    assert_ok(
        &got[0],
        &format!("narrowed after a restart: {}", hub.log_tail()),
    );
    assert_no_name(&got[1], "narrowed after a restart: a.git.test");

    // Suspend and resume keep it too; a sandbox not Ready is 412.
    alice.suspend(&a).await.unwrap();
    let r = patch(&hub, ALICE_KEY, &a, json!({"mode": "egress"})).await;
    error_body(r, 412, "FAILED_PRECONDITION").await;
    alice.resume(&a).await.unwrap();
    let got = probe(&alice, &a, &["http://pypi.test/a3", "http://a.git.test/a3"]).await;
    assert_ok(&got[0], "narrowed after a resume");
    assert_no_name(&got[1], "narrowed after a resume: a.git.test");
    // Plain `egress`: back to the template's policy.
    let sb = alice
        .set_network(&a, sandhub_api::hub::Network::Egress.into())
        .await
        .unwrap();
    assert_eq!(sb.network, None);
    let got = probe(&alice, &a, &["http://a.git.test/a4"]).await;
    assert_ok(&got[0], "the template's policy again");

    // A sandbox that runs without a gateway cannot be switched to egress.
    alice
        .put_template(
            "offline",
            serde_json::from_value(json!({"network": "none"})).unwrap(),
        )
        .await
        .unwrap();
    let offline = create(&alice, "offline").await;
    let r = patch(
        &hub,
        ALICE_KEY,
        &offline,
        json!({"allow_out": ["pypi.test"]}),
    )
    .await;
    let e = error_body(r, 412, "FAILED_PRECONDITION").await;
    assert!(e["message"].as_str().unwrap().contains("egress"), "{e}");
    let r = patch(&hub, ALICE_KEY, &offline, json!({"mode": "none"})).await;
    assert_eq!(
        r.status(),
        200,
        "`none` on an offline sandbox changes nothing"
    );
    drop(hub);
    drop(net);
}

/// MCP `create_sandbox` takes the same `network` field: the narrowing
/// reaches the hub (and the gateway), a widening is the hub's
/// INVALID_ARGUMENT, a bad pattern is named before any round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_create_sandbox_narrows_the_network_like_rest() {
    if !prerequisites() {
        return;
    }
    let _one = ONE_INTERNET.lock().await;
    let net = Internet::up();
    let hub = TestHub::start(HubOptions {
        extra_args: &["--egress-dns", "198.18.0.2"],
        ..Default::default()
    })
    .await;
    let c = hub.client(None);
    c.put_template(
        "web",
        serde_json::from_value(json!({"network": {"mode": "egress",
            "allow_out": ["pypi.test", "*.git.test"]}}))
        .unwrap(),
    )
    .await
    .unwrap();
    let mut mcp = McpClient::connect(&hub.url(), None).await;
    let created = mcp
        .call_ok(
            "create_sandbox",
            json!({"warmpool": "web", "network": {"allow_out": ["pypi.test"]}}),
        )
        .await;
    let id = created["sandbox_claim_name"].as_str().unwrap().to_string();
    assert_eq!(
        c.get(&id).await.unwrap().network,
        Some(
            serde_json::from_value(json!({"mode": "egress", "allow_out": ["pypi.test"]})).unwrap()
        )
    );
    let got = probe(&c, &id, &["http://pypi.test/mcp", "http://a.git.test/mcp"]).await;
    assert_ok(&got[0], "mcp-narrowed: pypi.test");
    assert_no_name(&got[1], "mcp-narrowed: a.git.test");
    assert_eq!(net.seen("/mcp"), 1);
    // `none` as the plain word.
    let off = mcp
        .call_ok(
            "create_sandbox",
            json!({"warmpool": "web", "network": "none"}),
        )
        .await;
    let off = off["sandbox_claim_name"].as_str().unwrap().to_string();
    let got = probe(&c, &off, &["http://pypi.test/mcp-off"]).await;
    assert!(got[0].starts_with("ERR"), "{}", got[0]);
    for (network, needle) in [
        (
            json!({"allow_out": ["other.example"]}),
            "allow_out[0] \"other.example\"",
        ),
        (
            json!({"allow_out": ["a.*.test"]}),
            "allow_out[0] \"a.*.test\"",
        ),
    ] {
        let r = mcp
            .call(
                "create_sandbox",
                json!({"warmpool": "web", "network": network}),
            )
            .await;
        assert_eq!(r["isError"], true, "{r}");
        let t = text(&r);
        assert!(t.contains("INVALID_ARGUMENT") && t.contains(needle), "{t}");
    }
    drop(hub);
    drop(net);
}

/// E2B's words on the raw E2B HTTP shape (`sandhub serve --e2b`), enforced
/// by the gateway in the test internet: `allow_internet_access: false` is
/// offline, `denyOut: ["0.0.0.0/0"]` with `allowOut` reaches only those,
/// `PUT /sandboxes/{id}/network` changes it live, and what cannot be said
/// in Sandhub's deny-wins words is E2B's 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_network_words_map_onto_the_gateway() {
    if !prerequisites() {
        return;
    }
    let _one = ONE_INTERNET.lock().await;
    let net = Internet::up();
    let hub = TestHub::start(HubOptions {
        extra_args: &["--e2b", "--egress-dns", "198.18.0.2"],
        ..Default::default()
    })
    .await;
    let c = hub.client(None);
    c.put_template(
        "web",
        serde_json::from_value(json!({"network": {"mode": "egress",
            "allow_out": ["pypi.test", "*.git.test", "198.18.5.0/24"]}}))
        .unwrap(),
    )
    .await
    .unwrap();
    let e2b = |method: reqwest::Method, path: &str| {
        hub.http()
            .request(method, format!("{}{path}", hub.url()))
            .header("X-API-Key", "e2b_test")
    };
    let create = |body: serde_json::Value| async move {
        let r = e2b(reqwest::Method::POST, "/sandboxes")
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<serde_json::Value>().await.unwrap())
    };

    // Offline.
    let (status, off) = create(json!({"templateID": "web", "allow_internet_access": false})).await;
    assert_eq!(status, 201, "{off}");
    let off = off["sandboxID"].as_str().unwrap().to_string();
    let got = probe(
        &c,
        &off,
        &["http://pypi.test/e2b-off", "http://198.18.5.2/e2b-off"],
    )
    .await;
    assert_no_name(&got[0], "allow_internet_access: false");
    assert!(
        got[1].starts_with("ERR ConnectionRefusedError"),
        "{}",
        got[1]
    );
    assert_eq!(net.seen("/e2b-off"), 0);

    // Only allowOut.
    let (status, only) = create(json!({"templateID": "web",
        "network": {"allowOut": ["pypi.test"], "denyOut": ["0.0.0.0/0"], "dnsServers": ["8.8.8.8"]}}))
    .await;
    assert_eq!(status, 201, "{only}");
    let only = only["sandboxID"].as_str().unwrap().to_string();
    let got = probe(
        &c,
        &only,
        &["http://pypi.test/e2b-only", "http://a.git.test/e2b-only"],
    )
    .await;
    assert_ok(&got[0], "allowOut: pypi.test");
    assert_no_name(&got[1], "allowOut: a.git.test");
    let info: serde_json::Value = e2b(reqwest::Method::GET, &format!("/sandboxes/{only}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["network"]["allowOut"], json!(["pypi.test"]), "{info}");
    assert_eq!(info["allowInternetAccess"], false, "{info}");

    // Everything but denyOut.
    let (status, partial) =
        create(json!({"templateID": "web", "network": {"denyOut": ["198.18.5.0/24"]}})).await;
    assert_eq!(status, 201, "{partial}");
    let partial = partial["sandboxID"].as_str().unwrap().to_string();
    let got = probe(
        &c,
        &partial,
        &[
            "http://a.git.test/e2b-partial",
            "http://198.18.5.2/e2b-partial",
        ],
    )
    .await;
    assert_ok(&got[0], "denyOut: a.git.test");
    assert!(
        got[1].starts_with("ERR ConnectionRefusedError"),
        "{}",
        got[1]
    );

    // Live: the offline sandbox opened to one name, then cleared to the
    // template's policy (an empty body clears the rules, as in E2B).
    let r = e2b(reqwest::Method::PUT, &format!("/sandboxes/{off}/network"))
        .json(&json!({"allowOut": ["a.git.test"], "allow_internet_access": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204, "{}", r.text().await.unwrap());
    let got = probe(
        &c,
        &off,
        &["http://a.git.test/e2b-put", "http://pypi.test/e2b-put"],
    )
    .await;
    assert_ok(&got[0], "PUT: a.git.test");
    assert_no_name(&got[1], "PUT: pypi.test");
    let r = e2b(reqwest::Method::PUT, &format!("/sandboxes/{off}/network"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let got = probe(&c, &off, &["http://pypi.test/e2b-cleared"]).await;
    assert_ok(&got[0], "PUT {}: the template's policy");

    // What cannot be said, and what is not supported: E2B's error shape.
    for (body, needle) in [
        (
            json!({"templateID": "web", "network": {"denyOut": ["198.18.5.0/24"], "allowOut": ["198.18.5.2"]}}),
            "deny wins",
        ),
        (
            json!({"templateID": "web", "network": {"denyOut": ["evil.test"]}}),
            "denyOut[0]",
        ),
        (
            json!({"templateID": "web", "network": {"maskRequestHost": "x.test"}}),
            "maskRequestHost",
        ),
        (
            json!({"templateID": "web", "network": {"rules": {"api.test": {"headers": {}}}}}),
            "rules",
        ),
        (
            json!({"templateID": "web", "network": {"egressProxy": {"address": "198.18.0.2:1080"}}}),
            "egressProxy",
        ),
        (
            json!({"templateID": "web", "network": {"allowOut": ["other.example"], "denyOut": ["0.0.0.0/0"]}}),
            "never widen",
        ),
    ] {
        let (status, e) = create(body.clone()).await;
        assert_eq!(status, 400, "{body}: {e}");
        assert_eq!(e["code"], 400, "{e}");
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{body}: {e}"
        );
    }
    let r = e2b(reqwest::Method::PUT, &format!("/sandboxes/{only}/network"))
        .json(&json!({"allowOut": ["other.example"], "denyOut": ["0.0.0.0/0"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    drop(hub);
    drop(net);
}
