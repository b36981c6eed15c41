//! Sandbox ports end to end (issue #16 A, local backend): servers inside a
//! real sandbox, reached through `/v1/sandboxes/{id}/ports/...` of the real
//! `sandhub serve` (as root), while the sandbox keeps its own network.

mod common;

use futures::{SinkExt, StreamExt};
use sandhub_api::hub::{CreateSandbox, PortList, SandboxState};
use sandhub_client::{http::HubClient, ProcessEvents, Sandboxes, StartProcess};
use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};

use common::{
    error_body, eventually, shell, shell_ok, HubOptions, TestHub, ALICE_KEY, BOB_KEY, WAIT,
};

/// One stdlib-only Python server: `GET /conn` answers the client's port
/// (which connection it came on), `GET /closesoon` too, then hangs up that
/// connection 0.3 s later, idle; `GET /sse` streams three events (chunked),
/// `POST /echo` answers its body, `GET /ws` is a WebSocket echo (text frames
/// up to 125 bytes, enough here), anything else is `http.server`'s file
/// listing of the cwd.
const SERVER: &str = r#"
import base64, hashlib, http.server, sys
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Seen-Host", self.headers.get("Host", ""))
        self.send_header("X-Seen-Auth", self.headers.get("Authorization", "none"))
        self.send_header("X-Seen-Cookie", self.headers.get("Cookie", "none"))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path in ("/conn", "/closesoon"):
            body = str(self.client_address[1]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            if self.path == "/closesoon":
                import socket, threading
                threading.Timer(0.3, self.connection.shutdown, (socket.SHUT_RDWR,)).start()
            return
        if self.path == "/cookies":
            self.send_response(200)
            self.send_header("Set-Cookie", "a=1; Domain=127.0.0.1; Path=/")
            self.send_header("Set-Cookie", "sandhub_port=forged; Path=/")
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            return
        if self.path == "/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(3):
                data = f"data: event {i}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path == "/ws":
            key = self.headers["Sec-WebSocket-Key"]
            accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            self.end_headers()
            while True:
                head = self.rfile.read(2)
                if len(head) < 2:
                    return
                op, n = head[0] & 0x0F, head[1] & 0x7F
                mask = self.rfile.read(4)
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
                if op == 8:
                    self.wfile.write(b"\x88\x00"); self.wfile.flush()
                    return
                self.wfile.write(bytes([0x80 | op, len(data)]) + data)
                self.wfile.flush()
        return super().do_GET()
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"#;

const PORT: u16 = 8000;

async fn hub_with_server() -> (TestHub, HubClient, String, ProcessEvents) {
    hub_with_server_args(&[]).await
}

async fn hub_with_server_args(
    extra_args: &'static [&'static str],
) -> (TestHub, HubClient, String, ProcessEvents) {
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        extra_args,
        ..Default::default()
    })
    .await;
    let c = hub.client(Some(ALICE_KEY));
    let sb = c.create(CreateSandbox::default()).await.unwrap();
    assert_eq!(sb.state, SandboxState::Ready);
    shell_ok(
        &c,
        &sb.id,
        &format!("cat > server.py <<'EOF'\n{SERVER}\nEOF\necho hello > hello.txt"),
    )
    .await;
    let events = start_server(&hub, &c, &sb.id).await;
    (hub, c, sb.id, events)
}

/// Starts `server.py` (already written) in sandbox `id`, and waits until it listens.
async fn start_server(hub: &TestHub, c: &HubClient, id: &str) -> ProcessEvents {
    let events = c
        .start(
            id,
            StartProcess {
                command: vec![
                    "python3".into(),
                    "server.py".into(),
                    "127.0.0.1".into(),
                    PORT.to_string(),
                ],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let http = hub.http();
    let url = format!("{}/v1/sandboxes/{id}/ports", hub.url());
    eventually("the server to listen", WAIT, || {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let r = http.get(&url).bearer_auth(ALICE_KEY).send().await.ok()?;
            let list: PortList = r.json().await.ok()?;
            list.ports.iter().any(|p| p.port == PORT).then_some(())
        }
    })
    .await;
    events
}

/// The hub serves plain port requests on the HTTP/1.1 fast path (the one
/// sandhub-router runs) unless `--port-fast-path false`: the tests that
/// pin what a request and its answer may carry run on both paths.
const HYPERS_PATH: &[&str] = &["--port-fast-path", "false"];

#[tokio::test]
async fn http_sse_and_bodies_reach_a_server_inside_the_sandbox() {
    http_sse_and_bodies(&[]).await;
}

#[tokio::test]
async fn http_sse_and_bodies_reach_a_server_on_hypers_path_too() {
    http_sse_and_bodies(HYPERS_PATH).await;
}

async fn http_sse_and_bodies(extra_args: &'static [&'static str]) {
    let (hub, _c, id, _server) = hub_with_server_args(extra_args).await;
    let http = hub.http();
    let base = format!("{}/v1/sandboxes/{id}/ports/{PORT}", hub.url());

    let list: PortList = http
        .get(format!("{}/v1/sandboxes/{id}/ports", hub.url()))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let p = list.ports.iter().find(|p| p.port == PORT).unwrap();
    assert_eq!(p.address, "127.0.0.1");

    let r = http
        .get(format!("{base}/hello.txt"))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "hello\n");

    // A directory listing at the port's root, with and without the slash.
    for root in [base.clone(), format!("{base}/")] {
        let r = http.get(&root).bearer_auth(ALICE_KEY).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.text().await.unwrap().contains("server.py"));
    }

    // A body goes in; the hub's key never reaches the sandbox.
    let body = "x".repeat(200_000);
    let r = http
        .post(format!("{base}/echo?q=1"))
        .bearer_auth(ALICE_KEY)
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-seen-auth"], "none");
    assert_eq!(r.headers()["x-seen-host"], format!("localhost:{PORT}"));
    assert_eq!(r.text().await.unwrap(), body);

    // Server-sent events, chunked, arrive whole and in order.
    let r = http
        .get(format!("{base}/sse"))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    assert_eq!(
        r.text().await.unwrap(),
        "data: event 0\n\ndata: event 1\n\ndata: event 2\n\n"
    );

    // Counted as every request is, by route template, none left in flight;
    // a key that is no tenant's is refused before any route.
    let r = http
        .get(format!("{base}/hello.txt"))
        .bearer_auth("not-a-key-of-anyone")
        .send()
        .await
        .unwrap();
    error_body(r, 401, "UNAUTHENTICATED").await;
    let metrics = hub.metrics().await;
    for line in [
        r#"sandhub_http_requests_total{method="GET",route="/v1/sandboxes/{id}/ports/{port}/{*path}",code="200"} 2"#,
        r#"sandhub_http_requests_total{method="POST",route="/v1/sandboxes/{id}/ports/{port}/{*path}",code="200"} 1"#,
        r#"sandhub_http_requests_total{method="GET",route="/v1/sandboxes/{id}/ports/{port}",code="200"} 1"#,
        r#"sandhub_http_requests_total{method="GET",route="/v1/sandboxes/{id}/ports/{port}/",code="200"} 1"#,
        r#"sandhub_http_requests_total{method="GET",route="other",code="401"} 1"#,
        // This request itself.
        "sandhub_http_inflight_requests 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
}

fn ws_request(
    hub: &TestHub,
    id: &str,
    origin: Option<&str>,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let mut req = format!(
        "ws://127.0.0.1:{}/v1/sandboxes/{id}/ports/{PORT}/ws",
        hub.port
    )
    .into_client_request()
    .unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {ALICE_KEY}").parse().unwrap(),
    );
    if let Some(o) = origin {
        req.headers_mut().insert("origin", o.parse().unwrap());
    }
    req
}

#[tokio::test]
async fn websockets_are_spliced_and_cross_origin_upgrades_refused() {
    let (hub, _c, id, _server) = hub_with_server().await;
    let own = format!("http://127.0.0.1:{}", hub.port);
    for origin in [None, Some(own.as_str())] {
        let (mut ws, response) = tokio_tungstenite::connect_async(ws_request(&hub, &id, origin))
            .await
            .unwrap_or_else(|e| panic!("ws with origin {origin:?}: {e}"));
        assert_eq!(response.status(), 101);
        for text in ["one", "two"] {
            ws.send(Message::text(text)).await.unwrap();
            let got = tokio::time::timeout(WAIT, ws.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(got, Message::text(text));
        }
        ws.close(None).await.unwrap();
    }

    assert_upgrade_refused(ws_request(&hub, &id, Some("http://evil.example"))).await;
}

/// A cross-origin upgrade is refused: 403 PERMISSION_DENIED, nothing spliced.
async fn assert_upgrade_refused(
    request: tokio_tungstenite::tungstenite::handshake::client::Request,
) {
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            assert_eq!(r.status(), 403);
            let body: serde_json::Value =
                serde_json::from_slice(r.body().as_deref().unwrap()).unwrap();
            assert_eq!(body["code"], "PERMISSION_DENIED");
        }
        other => panic!(
            "a cross-origin upgrade went through: {:?}",
            other.map(|(_, r)| r)
        ),
    }
}

#[tokio::test]
async fn other_tenants_bad_ports_and_silent_ports_get_errors() {
    let (hub, _c, id, _server) = hub_with_server().await;
    let http = hub.http();
    let sb = format!("{}/v1/sandboxes/{id}", hub.url());

    for url in [
        format!("{sb}/ports"),
        format!("{sb}/ports/{PORT}/hello.txt"),
    ] {
        let r = http.get(&url).bearer_auth(BOB_KEY).send().await.unwrap();
        error_body(r, 404, "NOT_FOUND").await;
    }
    let r = http.get(format!("{sb}/ports")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // Links need a hub started with --sandbox-domain.
    let r = http
        .post(format!("{}/v1/sandboxes/{id}/port-urls/{PORT}", hub.url()))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    error_body(r, 412, "FAILED_PRECONDITION").await;

    for bad in ["0", "65536", "99999999999999", "http", "-1"] {
        let r = http
            .get(format!("{sb}/ports/{bad}/x"))
            .bearer_auth(ALICE_KEY)
            .send()
            .await
            .unwrap();
        error_body(r, 400, "INVALID_ARGUMENT").await;
    }
    let r = http
        .get(format!("{sb}/ports/9/x"))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    error_body(r, 503, "UNAVAILABLE").await;

    let r = http
        .get(format!(
            "{}/v1/sandboxes/no-such-sandbox/ports/80/",
            hub.url()
        ))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    error_body(r, 404, "NOT_FOUND").await;
}

#[tokio::test]
async fn the_sandbox_still_cannot_reach_the_hosts_loopback() {
    let (hub, c, id, _server) = hub_with_server().await;
    // A server on the host's loopback, next to the hub.
    let host = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host_port = host.local_addr().unwrap().port();
    let probe = |port: u16| {
        format!(
            "python3 -c 'import socket,sys\ntry:\n socket.create_connection((\"127.0.0.1\", {port}), 3)\n print(\"connected\")\nexcept OSError as e:\n print(\"refused\", e)'"
        )
    };
    let out = shell(&c, &id, &probe(host_port)).await;
    assert!(out.stdout.starts_with("refused"), "{out:?}");
    let out = shell(&c, &id, &probe(hub.port)).await;
    assert!(out.stdout.starts_with("refused"), "{out:?}");
    // ...while its own server is reachable from inside.
    let out = shell(&c, &id, &probe(PORT)).await;
    assert!(out.stdout.starts_with("connected"), "{out:?}");
    drop(host);
}

const DOMAIN: &str = "sandboxes.test";

/// `--sandbox-domain`: `Host: {port}-{id}.<domain>` reaches the port at the
/// root of its own host, with an API key or with a minted link's cookie
/// (which the server inside never sees); another tenant, no credential, a
/// link for another port and a foreign Origin are all refused.
#[tokio::test]
async fn host_routed_ports_open_with_a_link_or_a_key() {
    let (hub, _c, id, _server) = hub_with_server_args(&["--sandbox-domain", DOMAIN]).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let host = format!("{PORT}-{id}.{DOMAIN}");
    let at = |path: &str| format!("{}{path}", hub.url());
    let get = |path: &str, host: &str| {
        http.get(at(path))
            .header(reqwest::header::HOST, host.to_string())
    };

    // No credential: 401; another tenant's key: 404; the owner's key: the server.
    let r = get("/hello.txt", &host).send().await.unwrap();
    error_body(r, 401, "UNAUTHENTICATED").await;
    let r = get("/hello.txt", &host)
        .bearer_auth(BOB_KEY)
        .send()
        .await
        .unwrap();
    error_body(r, 404, "NOT_FOUND").await;
    let r = get("/hello.txt", &host)
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "hello\n");

    // A link: minted with the key (another tenant cannot mint one), traded
    // for a host-only cookie on the first visit, then the cookie opens the port.
    let mint = |key: &'static str| {
        http.post(at(&format!(
            "/v1/sandboxes/{id}/port-urls/{PORT}?ttl_seconds=600"
        )))
        .bearer_auth(key)
        .send()
    };
    error_body(mint(BOB_KEY).await.unwrap(), 404, "NOT_FOUND").await;
    let link: sandhub_api::hub::PortUrl = mint(ALICE_KEY).await.unwrap().json().await.unwrap();
    let prefix = format!("http://{host}/?sandhub_token=");
    let token = link
        .url
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{link:?}"));
    let r = get(&format!("/?sandhub_token={token}"), &host)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/");
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.starts_with(&format!("sandhub_port={token};")),
        "{cookie}"
    );
    for attr in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    assert!(
        !cookie.contains("Domain="),
        "a cookie for this host only: {cookie}"
    );
    let r = get("/hello.txt", &host)
        .header("cookie", format!("sandhub_port={token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "hello\n");
    let r = http
        .post(at("/echo"))
        .header(reqwest::header::HOST, host.clone())
        .header("cookie", format!("app=1; sandhub_port={token}"))
        .body("ping")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["x-seen-cookie"],
        "app=1",
        "the server inside saw our cookie"
    );
    assert_eq!(r.text().await.unwrap(), "ping");
    // Issue #26, same class: a page on another sandbox's host is same-site,
    // so the browser would send this host's cookie with its POST; it is
    // refused. The same sandbox's other ports (a front end calling its
    // back end) still may.
    for (origin, status) in [
        (format!("http://3000-sb-other.{DOMAIN}"), 403),
        (format!("http://3000-{id}.{DOMAIN}"), 200),
    ] {
        let r = http
            .post(at("/echo"))
            .header(reqwest::header::HOST, host.clone())
            .header("origin", origin.clone())
            .header("cookie", format!("sandhub_port={token}"))
            .body("ping")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{origin}");
    }

    // The link opens its own port only; a forged or wrong token is refused.
    let other = format!("{}-{id}.{DOMAIN}", PORT + 1);
    let r = get("/", &other)
        .header("cookie", format!("sandhub_port={token}"))
        .send()
        .await
        .unwrap();
    error_body(r, 401, "UNAUTHENTICATED").await;
    let r = get("/?sandhub_token=1.bad.token", &host)
        .send()
        .await
        .unwrap();
    error_body(r, 401, "UNAUTHENTICATED").await;

    // WebSockets on the host form: same origin goes through, a foreign one is refused.
    let ws = |origin: &str| {
        let mut req = format!("ws://127.0.0.1:{}/ws", hub.port)
            .into_client_request()
            .unwrap();
        let h = req.headers_mut();
        h.insert("host", host.parse().unwrap());
        h.insert("origin", origin.parse().unwrap());
        h.insert("cookie", format!("sandhub_port={token}").parse().unwrap());
        req
    };
    let (mut socket, response) = tokio_tungstenite::connect_async(ws(&format!("http://{host}")))
        .await
        .expect("a same-origin upgrade on the host form");
    assert_eq!(response.status(), 101);
    socket.send(Message::text("hi")).await.unwrap();
    let got = tokio::time::timeout(WAIT, socket.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(got, Message::text("hi"));
    assert_upgrade_refused(ws("http://evil.example")).await;
}

/// HTTP/2 from the client (prior knowledge, as gRPC-web proxies and curl
/// `--http2-prior-knowledge` speak): the proxy carries requests, bodies
/// and streamed answers to the HTTP/1.1 server inside.
#[tokio::test]
async fn http2_clients_reach_a_port() {
    use http_body_util::{BodyExt, Full};
    let (hub, _c, id, _server) = hub_with_server().await;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", hub.port))
        .await
        .unwrap();
    let (mut h2, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("an HTTP/2 connection to the hub");
    tokio::spawn(conn);
    let request = |method: &str, path: &str, body: &'static str| {
        hyper::Request::builder()
            .method(method)
            .uri(format!(
                "http://127.0.0.1:{}/v1/sandboxes/{id}/ports/{PORT}{path}",
                hub.port
            ))
            .header("authorization", format!("Bearer {ALICE_KEY}"))
            .body(Full::new(bytes::Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    let r = h2
        .send_request(request("GET", "/hello.txt", ""))
        .await
        .unwrap();
    assert_eq!(r.version(), hyper::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hello\n");
    let r = h2
        .send_request(request("POST", "/echo", "over h2"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"over h2");
    let r = h2.send_request(request("GET", "/sse", "")).await.unwrap();
    assert_eq!(r.status(), 200);
    let body = r.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body);
    for i in 0..3 {
        assert!(text.contains(&format!("data: event {i}")), "{text}");
    }
    // Another tenant's key over HTTP/2 is still NOT_FOUND.
    let mut other = request("GET", "/hello.txt", "");
    other.headers_mut().insert(
        "authorization",
        format!("Bearer {BOB_KEY}").parse().unwrap(),
    );
    assert_eq!(h2.send_request(other).await.unwrap().status(), 404);
}

/// Requests to a port reuse the hub's keep-alive connection to it (the
/// server sees one client connection), and a kept connection is never
/// reused once its sandbox is paused (until it is resumed) or gone, however
/// often it was just checked Ready.
#[tokio::test]
async fn kept_connections_are_reused_and_die_with_their_sandbox() {
    kept_connections(&[]).await;
}

#[tokio::test]
async fn kept_connections_die_with_their_sandbox_on_hypers_path_too() {
    kept_connections(HYPERS_PATH).await;
}

async fn kept_connections(extra_args: &'static [&'static str]) {
    let (hub, c, id, _server) = hub_with_server_args(extra_args).await;
    let http = hub.http();
    let url = format!("{}/v1/sandboxes/{id}/ports/{PORT}/conn", hub.url());
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..5 {
        let r = http.get(&url).bearer_auth(ALICE_KEY).send().await.unwrap();
        assert_eq!(r.status(), 200);
        seen.insert(r.text().await.unwrap());
    }
    assert_eq!(
        seen.len(),
        1,
        "one kept connection, not one per request: {seen:?}"
    );
    let r = http.get(&url).bearer_auth(BOB_KEY).send().await.unwrap();
    error_body(r, 404, "NOT_FOUND").await;
    // A kept connection the server hangs up while it sits idle is found
    // closed when next used, and the request goes on a new one.
    let soon = format!("{}/v1/sandboxes/{id}/ports/{PORT}/closesoon", hub.url());
    let r = http.get(&soon).bearer_auth(ALICE_KEY).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let hung_up = r.text().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    for _ in 0..3 {
        let r = http.get(&url).bearer_auth(ALICE_KEY).send().await.unwrap();
        assert_eq!(
            r.status(),
            200,
            "after the server hung up a kept connection"
        );
        assert_ne!(r.text().await.unwrap(), hung_up);
    }
    c.pause(&id).await.unwrap();
    let r = http.get(&url).bearer_auth(ALICE_KEY).send().await.unwrap();
    error_body(r, 412, "FAILED_PRECONDITION").await;
    c.resume(&id).await.unwrap();
    let r = http.get(&url).bearer_auth(ALICE_KEY).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // Suspended and resumed, the sandbox runs under a new shim in a new
    // network namespace: its port is dialled there, not through the one
    // the hub kept open for the old shim (where nothing listens any more).
    c.suspend(&id).await.unwrap();
    let r = http.get(&url).bearer_auth(ALICE_KEY).send().await.unwrap();
    error_body(r, 412, "FAILED_PRECONDITION").await;
    c.resume(&id).await.unwrap();
    let _server = start_server(&hub, &c, &id).await;
    let r = http.get(&url).bearer_auth(ALICE_KEY).send().await.unwrap();
    assert_eq!(r.status(), 200, "the resumed sandbox's own port");
    c.delete(&id).await.unwrap();
    let r = http.get(&url).bearer_auth(ALICE_KEY).send().await.unwrap();
    error_body(r, 404, "NOT_FOUND").await;
}

/// Issue #26 (2): a page served through the path route is on the hub's own
/// origin, so it is sandboxed (an opaque origin: its scripts' requests to
/// the API carry `Origin: null`, which the API refuses), cannot be sniffed
/// or embedded elsewhere, and its cookies stay host-only under its port's
/// path, never named like the hub's own.
#[tokio::test]
async fn pages_on_the_hubs_origin_are_sandboxed_and_keep_their_cookies_home() {
    pages_on_the_hubs_origin(&[]).await;
}

#[tokio::test]
async fn pages_on_the_hubs_origin_are_sandboxed_on_hypers_path_too() {
    pages_on_the_hubs_origin(HYPERS_PATH).await;
}

async fn pages_on_the_hubs_origin(extra_args: &'static [&'static str]) {
    let (hub, _c, id, _server) = hub_with_server_args(extra_args).await;
    let http = hub.http();
    let r = http
        .get(format!(
            "{}/v1/sandboxes/{id}/ports/{PORT}/cookies",
            hub.url()
        ))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers();
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("sandbox "), "{csp}");
    assert!(!csp.contains("allow-same-origin"), "{csp}");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["cross-origin-resource-policy"], "same-origin");
    let cookies: Vec<&str> = h
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(
        cookies,
        [format!("a=1; Path=/v1/sandboxes/{id}/ports/{PORT}/")],
        "no Domain, no cookie of the hub's name, kept under the port"
    );

    // What only such a page can send never reaches the API: an opaque
    // origin, or a same-origin request from a port page's address.
    let r = http
        .post(format!("{}/v1/sandboxes", hub.url()))
        .bearer_auth(ALICE_KEY)
        .header("origin", "null")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    error_body(r, 403, "PERMISSION_DENIED").await;
    let r = http
        .post(format!("{}/v1/sandboxes/{id}/exec", hub.url()))
        .bearer_auth(ALICE_KEY)
        .header("sec-fetch-site", "same-origin")
        .header(
            "referer",
            format!("{}/v1/sandboxes/{id}/ports/{PORT}/page.html", hub.url()),
        )
        .header("content-type", "application/json")
        .body(r#"{"command":"true"}"#)
        .send()
        .await
        .unwrap();
    error_body(r, 403, "PERMISSION_DENIED").await;
    // The page's own traffic to its server still flows.
    let r = http
        .get(format!(
            "{}/v1/sandboxes/{id}/ports/{PORT}/hello.txt",
            hub.url()
        ))
        .bearer_auth(ALICE_KEY)
        .header("origin", "null")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "hello\n");
}

/// The shell WebSocket refuses a foreign Origin like every other upgrade
/// (found while fixing #26: `/pty` was the one upgrade route without it,
/// so on a hub without keys any web page could open a shell).
#[tokio::test]
async fn the_shell_websocket_refuses_a_foreign_origin() {
    let (hub, _c, id, _server) = hub_with_server().await;
    let url = format!("ws://127.0.0.1:{}/v1/sandboxes/{id}/pty", hub.port);
    for origin in ["http://evil.example", "null"] {
        let mut request = url.as_str().into_client_request().unwrap();
        request.headers_mut().insert(
            "authorization",
            format!("Bearer {ALICE_KEY}").parse().unwrap(),
        );
        request
            .headers_mut()
            .insert("origin", origin.parse().unwrap());
        let err = tokio_tungstenite::connect_async(request).await.unwrap_err();
        match err {
            tokio_tungstenite::tungstenite::Error::Http(r) => {
                assert_eq!(r.status(), 403, "{origin}")
            }
            other => panic!("{origin}: expected 403, got {other}"),
        }
    }
    let mut request = url.as_str().into_client_request().unwrap();
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {ALICE_KEY}").parse().unwrap(),
    );
    request.headers_mut().insert(
        "origin",
        format!("http://127.0.0.1:{}", hub.port).parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    ws.send(Message::Binary(b"exit 7\n".to_vec().into()))
        .await
        .unwrap();
    let mut exit = None;
    while let Some(Ok(m)) = ws.next().await {
        if let Message::Text(t) = m {
            exit = Some(t.to_string());
        }
    }
    assert_eq!(exit.as_deref(), Some(r#"{"exit_code":7}"#));
}

/// A port that accepts and never answers: every connection is held; a
/// request for `/partial` gets a head and 10 of its 100 bytes, then nothing.
const SILENT: &str = r#"
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(4096)
held = []
while True:
    c, _ = s.accept()
    held.append(c)
    c.settimeout(5)
    try:
        head = c.recv(4096)
    except OSError:
        continue
    if head.startswith(b"GET /partial"):
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
"#;

const SILENT_PORT: u16 = 9000;

async fn start_silent(hub: &TestHub, c: &HubClient, id: &str) -> ProcessEvents {
    shell_ok(c, id, &format!("cat > silent.py <<'EOF'\n{SILENT}\nEOF")).await;
    let events = c
        .start(
            id,
            StartProcess {
                command: vec![
                    "python3".into(),
                    "silent.py".into(),
                    SILENT_PORT.to_string(),
                ],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let (http, url) = (hub.http(), format!("{}/v1/sandboxes/{id}/ports", hub.url()));
    eventually("the silent server to listen", WAIT, || {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let r = http.get(&url).bearer_auth(ALICE_KEY).send().await.ok()?;
            let list: PortList = r.json().await.ok()?;
            list.ports
                .iter()
                .any(|p| p.port == SILENT_PORT)
                .then_some(())
        }
    })
    .await;
    events
}

/// Issue #26 (4), the attack as run: tenant A sends 560 requests to a
/// port that never answers, on a hub with systemd's 1024 descriptors.
/// Each used to hold two descriptors with no bound, so the hub ran out
/// and tenant B's `exec` failed until A hung up. Now A's requests past
/// the caps get 429 at once, B's `exec` and the probes answer while A's
/// are held, and A's slots come back when it hangs up.
#[tokio::test]
async fn a_silent_port_cannot_starve_the_hub_of_descriptors() {
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        nofile: Some(1024),
        ..Default::default()
    })
    .await;
    let (alice, bob) = (hub.client(Some(ALICE_KEY)), hub.client(Some(BOB_KEY)));
    let a = alice.create(CreateSandbox::default()).await.unwrap().id;
    let b = bob.create(CreateSandbox::default()).await.unwrap().id;
    let _silent = start_silent(&hub, &alice, &a).await;

    // Every request on its own connection, as the attack had it.
    let attacker = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let url = format!("{}/v1/sandboxes/{a}/ports/{SILENT_PORT}/", hub.url());
    let (refused_tx, mut refused_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut held = tokio::task::JoinSet::new();
    for _ in 0..560 {
        let (attacker, url, refused_tx) = (attacker.clone(), url.clone(), refused_tx.clone());
        held.spawn(async move {
            if let Ok(r) = attacker.get(&url).bearer_auth(ALICE_KEY).send().await {
                let status = r.status().as_u16();
                let body = r.text().await.unwrap_or_default();
                let _ = refused_tx.send((status, body));
            }
        });
    }
    drop(refused_tx);
    // The caps answer at once: 1024 descriptors keep 256 requests in all.
    let mut refused = 0;
    let deadline = tokio::time::Instant::now() + WAIT;
    while refused < 560 - 256 {
        let got = tokio::time::timeout_at(deadline, refused_rx.recv()).await;
        let Ok(Some((status, body))) = got else {
            panic!("only {refused} of A's requests were refused in time");
        };
        assert_eq!(status, 429, "{body}");
        assert!(body.contains("RESOURCE_EXHAUSTED"), "{body}");
        refused += 1;
    }

    // While A's requests are held, B's exec and the probes answer.
    let out = tokio::time::timeout(WAIT, shell(&bob, &b, "echo still-served"))
        .await
        .expect("B's exec in time");
    assert_eq!(out.stdout, "still-served\n", "{out:?}\n{}", hub.log_tail());
    let r = hub
        .http()
        .get(format!("{}/healthz", hub.url()))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    assert!(
        !hub.log().contains("Too many open files"),
        "{}",
        hub.log_tail()
    );

    // A hangs up: its slots come back, and its port works again.
    held.abort_all();
    while held.join_next().await.is_some() {}
    drop(attacker);
    let _server = {
        shell_ok(&alice, &a, "echo hello > hello.txt").await;
        alice
            .start(
                &a,
                StartProcess {
                    command: vec![
                        "python3".into(),
                        "-m".into(),
                        "http.server".into(),
                        "--bind".into(),
                        "127.0.0.1".into(),
                        PORT.to_string(),
                    ],
                    ..Default::default()
                },
            )
            .await
            .unwrap()
    };
    let http = hub.http();
    let hello = format!("{}/v1/sandboxes/{a}/ports/{PORT}/hello.txt", hub.url());
    eventually("A's slots to come back", WAIT, || {
        let (http, hello) = (http.clone(), hello.clone());
        async move {
            let r = http.get(&hello).bearer_auth(ALICE_KEY).send().await.ok()?;
            (r.status() == 200).then_some(())
        }
    })
    .await;
}

/// A client that hangs up while the sandbox's server is silent takes its
/// request with it: the in-flight gauge comes back down (it used to stay
/// up for ever on hyper's path, whose answer is then never made), and so
/// do the caps' slots. On both paths.
#[tokio::test]
async fn a_request_whose_client_hangs_up_is_no_longer_in_flight() {
    hung_up_requests(&[]).await;
}

#[tokio::test]
async fn a_request_whose_client_hangs_up_is_no_longer_in_flight_on_hypers_path() {
    hung_up_requests(HYPERS_PATH).await;
}

async fn hung_up_requests(extra_args: &'static [&'static str]) {
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        extra_args,
        ..Default::default()
    })
    .await;
    let alice = hub.client(Some(ALICE_KEY));
    let a = alice.create(CreateSandbox::default()).await.unwrap().id;
    let _silent = start_silent(&hub, &alice, &a).await;
    let in_flight = || {
        let (http, url) = (hub.http(), format!("{}/metrics", hub.url()));
        async move {
            let text = http.get(url).send().await.ok()?.text().await.ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix("sandhub_http_inflight_requests "))
                .and_then(|n| n.parse::<i64>().ok())
        }
    };
    let url = format!("{}/v1/sandboxes/{a}/ports/{SILENT_PORT}/", hub.url());
    let mut held = tokio::task::JoinSet::new();
    for _ in 0..5 {
        let (http, url) = (hub.http(), url.clone());
        held.spawn(async move { http.get(url).bearer_auth(ALICE_KEY).send().await });
    }
    // Five held, plus the metrics request itself.
    eventually("the requests to be in flight", WAIT, || async {
        (in_flight().await? == 6).then_some(())
    })
    .await;
    held.abort_all();
    while held.join_next().await.is_some() {}
    eventually("the hung-up requests to leave the gauge", WAIT, || async {
        (in_flight().await? == 1).then_some(())
    })
    .await;
}

/// Issue #26 (4): a server that never sends its answer's head gets 504
/// after `--port-response-timeout`; one that stops mid-body is cut after
/// `--port-idle-timeout`. Neither holds the hub's descriptors for ever.
#[tokio::test]
async fn silent_and_stalled_answers_are_timed_out() {
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        extra_args: &["--port-response-timeout", "1s", "--port-idle-timeout", "1s"],
        ..Default::default()
    })
    .await;
    let alice = hub.client(Some(ALICE_KEY));
    let a = alice.create(CreateSandbox::default()).await.unwrap().id;
    let _silent = start_silent(&hub, &alice, &a).await;
    let http = hub.http();
    let base = format!("{}/v1/sandboxes/{a}/ports/{SILENT_PORT}", hub.url());

    let started = std::time::Instant::now();
    let r = http
        .get(format!("{base}/"))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    let body = error_body(r, 504, "DEADLINE_EXCEEDED").await;
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("--port-response-timeout"),
        "{body}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));

    let r = http
        .get(format!("{base}/partial"))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let started = std::time::Instant::now();
    let read = r.bytes().await;
    assert!(read.is_err(), "a stalled body must end in an error");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}
