//! The fast download path (`fast_get.rs`): a plain `GET /v1/files/{path}`
//! of a whole regular file is sent with `sendfile`, outside hyper; every
//! other request on the same connection goes to hyper with the bytes
//! already read. Driven over raw sockets, so what is on the wire (heads,
//! pipelining, short bodies, closes) is what is asserted.

mod common;

use std::{
    io::{Read, Write},
    net::TcpStream,
    os::unix::net::UnixStream,
    time::{Duration, Instant},
};

use common::Daemon;

/// One response off `conn`: its head (lines, without the blank one) and body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn names(&self) -> Vec<&str> {
        self.headers.iter().map(|(n, _)| n.as_str()).collect()
    }
}

/// Reads one response whose body has a Content-Length; `rest` holds bytes
/// read past it (the next pipelined answer).
fn read_answer(conn: &mut impl Read, rest: &mut Vec<u8>) -> Answer {
    let mut buf = std::mem::take(rest);
    let mut chunk = [0u8; 64 * 1024];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = conn.read(&mut chunk).expect("reading a head");
        assert!(n > 0, "closed before a whole head: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (n, v) = l.split_once(": ").unwrap();
            (n.to_string(), v.to_string())
        })
        .collect();
    let mut body = buf[end + 4..].to_vec();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map(|(_, v)| v.parse().unwrap())
        .expect("a content-length");
    while body.len() < len {
        let n = conn.read(&mut chunk).expect("reading a body");
        assert!(n > 0, "closed {} bytes into a {len}-byte body", body.len());
        body.extend_from_slice(&chunk[..n]);
    }
    *rest = body.split_off(len);
    Answer {
        status,
        headers,
        body,
    }
}

fn connect(d: &Daemon) -> TcpStream {
    let conn = TcpStream::connect(("127.0.0.1", d.rest_port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    conn
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: sandboxd\r\n{extra}\r\n")
}

/// What `sandboxd_fast_downloads_total` says now.
fn fast_downloads(d: &Daemon) -> u64 {
    fast_downloads_with(d, "")
}

fn fast_downloads_with(d: &Daemon, extra: &str) -> u64 {
    let mut conn = connect(d);
    conn.write_all(get("/metrics", extra).as_bytes()).unwrap();
    let metrics = String::from_utf8(read_answer(&mut conn, &mut Vec::new()).body).unwrap();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("sandboxd_fast_downloads_total "))
        .expect("the metric is exported")
        .parse()
        .unwrap()
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

#[test]
fn the_fast_answer_has_hypers_head_for_the_same_file() {
    let d = Daemon::start(&[]);
    std::fs::write(d.root_path().join("a.txt"), b"hello\n").unwrap();
    let mut conn = connect(&d);
    let mut rest = Vec::new();
    // The same file, plainly (the fast path), then with a condition that
    // does not hold (hyper's path, which then answers the whole file).
    conn.write_all(get("/v1/files/a.txt", "").as_bytes())
        .unwrap();
    let fast = read_answer(&mut conn, &mut rest);
    let old_date = "If-Modified-Since: Thu, 01 Jan 1970 00:00:00 GMT\r\n";
    conn.write_all(get("/v1/files/a.txt", old_date).as_bytes())
        .unwrap();
    let hyper = read_answer(&mut conn, &mut rest);
    for answer in [&fast, &hyper] {
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body, b"hello\n");
    }
    assert_eq!(fast.names(), hyper.names());
    assert_eq!(
        fast_downloads(&d),
        1,
        "the first was the fast path's, the second hyper's"
    );
    assert_eq!(
        fast.names(),
        [
            "content-type",
            "content-length",
            "last-modified",
            "accept-ranges",
            "date"
        ]
    );
    for name in [
        "content-type",
        "content-length",
        "last-modified",
        "accept-ranges",
    ] {
        assert_eq!(fast.header(name), hyper.header(name), "{name}");
    }
    // `Connection: close` is answered in kind, and the connection closes.
    conn.write_all(get("/v1/files/a.txt", "Connection: keep-alive, close\r\n").as_bytes())
        .unwrap();
    let last = read_answer(&mut conn, &mut rest);
    assert_eq!(last.header("connection"), Some("close"));
    assert_eq!(last.body, b"hello\n");
    assert_eq!(conn.read(&mut [0u8; 16]).unwrap(), 0, "closed after it");
}

#[test]
fn pipelined_requests_are_answered_in_order_across_both_paths() {
    let d = Daemon::start(&[]);
    let big = random_bytes(3 << 20);
    std::fs::write(d.root_path().join("big.bin"), &big).unwrap();
    std::fs::write(d.root_path().join("small.txt"), b"small").unwrap();
    std::fs::create_dir(d.root_path().join("dir")).unwrap();
    let mut conn = connect(&d);
    // Fast, fast (sendfile), then a listing and a range (hyper takes the
    // connection from there), then a plain GET again (still hyper's).
    let burst = [
        get("/v1/files/small.txt", ""),
        get("/v1/files/big.bin?type=file", ""),
        get("/v1/files/dir", ""),
        get("/v1/files/small.txt", "Range: bytes=1-2\r\n"),
        get("/v1/files/big.bin", ""),
    ]
    .concat();
    conn.write_all(burst.as_bytes()).unwrap();
    let mut rest = Vec::new();
    let answers: Vec<Answer> = (0..5).map(|_| read_answer(&mut conn, &mut rest)).collect();
    assert_eq!(answers[0].body, b"small");
    assert_eq!(answers[1].body, big);
    assert_eq!(answers[2].header("content-type"), Some("application/json"));
    let listing: serde_json::Value = serde_json::from_slice(&answers[2].body).unwrap();
    assert_eq!(listing["path"], "/dir");
    assert_eq!(answers[3].status, 206);
    assert_eq!(answers[3].body, b"ma");
    assert_eq!(answers[4].status, 200);
    assert_eq!(answers[4].body, big);
    assert!(rest.is_empty());
    // The first two were sent with sendfile; from the listing on, hyper's.
    assert_eq!(fast_downloads(&d), 2);
}

#[test]
fn a_refused_or_missing_download_gets_the_json_error_and_the_connection_goes_on() {
    let d = Daemon::start(&["--auth-token-file", &token_file("s3cret")]);
    std::fs::write(d.root_path().join("a.txt"), b"secret data").unwrap();
    let mut conn = connect(&d);
    let mut rest = Vec::new();
    conn.write_all(get("/v1/files/a.txt", "").as_bytes())
        .unwrap();
    let refused = read_answer(&mut conn, &mut rest);
    assert_eq!(refused.status, 401);
    let body: serde_json::Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(body["code"], "UNAUTHENTICATED");
    conn.write_all(get("/v1/files/a.txt", "Authorization: Bearer wrong\r\n").as_bytes())
        .unwrap();
    assert_eq!(read_answer(&mut conn, &mut rest).status, 401);

    // A fresh connection for each, so each starts on the fast path.
    let served = |extra: &str| {
        let mut conn = connect(&d);
        let mut rest = Vec::new();
        conn.write_all(get("/v1/files/a.txt", extra).as_bytes())
            .unwrap();
        read_answer(&mut conn, &mut rest)
    };
    assert_eq!(
        fast_downloads_with(&d, "Authorization: Bearer s3cret\r\n"),
        0
    );
    let ok = served("Authorization: Bearer s3cret\r\n");
    assert_eq!((ok.status, ok.body.as_slice()), (200, &b"secret data"[..]));
    // Behind sandhub-router: its own token in Authorization, ours routed.
    let routed =
        served("Authorization: Bearer router\r\nX-Sandboxd-Authorization: Bearer s3cret\r\n");
    assert_eq!(routed.status, 200);
    assert_eq!(
        fast_downloads_with(&d, "Authorization: Bearer s3cret\r\n"),
        2
    );
    let mut conn = connect(&d);
    conn.write_all(get("/v1/files/nope.txt", "Authorization: Bearer s3cret\r\n").as_bytes())
        .unwrap();
    let not_found = read_answer(&mut conn, &mut rest);
    assert_eq!(not_found.status, 404);
    let body: serde_json::Value = serde_json::from_slice(&not_found.body).unwrap();
    assert_eq!(body["code"], "NOT_FOUND");
}

fn token_file(token: &str) -> String {
    let path = std::env::temp_dir().join(format!(
        "sandboxd-fast-token-{}-{}",
        std::process::id(),
        token
    ));
    std::fs::write(&path, token).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn a_file_that_shrinks_mid_download_ends_the_connection_short() {
    let d = Daemon::start(&[]);
    let path = d.root_path().join("shrinks.bin");
    let len = 64 << 20;
    std::fs::write(&path, random_bytes(len)).unwrap();
    let mut conn = connect(&d);
    conn.write_all(get("/v1/files/shrinks.bin", "").as_bytes())
        .unwrap();
    // The daemon sends until the socket buffers are full, then waits for
    // this client; meanwhile the workload truncates the file.
    std::thread::sleep(Duration::from_millis(300));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    let mut got = Vec::new();
    conn.read_to_end(&mut got).unwrap();
    let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&got[..end]).to_string();
    assert!(
        head.contains(&format!("content-length: {len}\r\n")),
        "{head}"
    );
    let body = got.len() - end;
    assert!(
        body < len,
        "a {len}-byte promise, {body} bytes, then a close"
    );
}

#[test]
fn a_client_that_stops_reading_is_dropped_after_the_idle_timeout() {
    let d = Daemon::start(&["--http-idle-timeout", "1s"]);
    std::fs::write(d.root_path().join("big.bin"), random_bytes(64 << 20)).unwrap();
    let mut conn = connect(&d);
    conn.write_all(get("/v1/files/big.bin", "").as_bytes())
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let started = Instant::now();
    let mut got = Vec::new();
    // A reset is as good as an end of stream here: either way it is gone.
    let _ = conn.read_to_end(&mut got);
    assert!(got.len() < 64 << 20, "{} bytes", got.len());
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn an_idle_fast_path_connection_is_closed_after_the_idle_timeout() {
    let d = Daemon::start(&["--http-idle-timeout", "1s"]);
    let mut conn = connect(&d);
    let started = Instant::now();
    assert_eq!(conn.read(&mut [0u8; 16]).unwrap(), 0);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
}

#[test]
fn downloads_over_the_unix_socket_take_the_fast_path_too() {
    let (sockets, root) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let big = random_bytes(5 << 20);
    std::fs::write(root.path().join("big.bin"), &big).unwrap();
    let child = std::process::Command::new(common::binary())
        .arg("--unix-socket")
        .arg(sockets.path())
        .args(["--legacy-port", "0", "--root-dir"])
        .arg(root.path())
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let _child = Killed(child);
    let rest_sock = sockets.path().join("rest.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut conn = loop {
        match UnixStream::connect(&rest_sock) {
            Ok(conn) => break conn,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("{}: {e}", rest_sock.display()),
        }
    };
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    for _ in 0..2 {
        conn.write_all(get("/v1/files/big.bin", "").as_bytes())
            .unwrap();
        let answer = read_answer(&mut conn, &mut rest);
        assert_eq!(answer.status, 200);
        assert!(answer.body == big, "the bytes differ");
    }
    // And the metric counts them as the hyper path would.
    conn.write_all(get("/metrics", "").as_bytes()).unwrap();
    let metrics = String::from_utf8(read_answer(&mut conn, &mut rest).body).unwrap();
    assert!(
        metrics.contains(r#"sandboxd_http_requests_total{method="GET",code="200"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("sandboxd_fast_downloads_total 2\n"),
        "{metrics}"
    );
}

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_name_swapped_for_a_fifo_is_not_waited_on() {
    let d = Daemon::start(&[]);
    let fifo = d.root_path().join("pipe");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    // Both the REST route and the legacy download open it without blocking
    // and refuse it: no writer ever comes.
    let mut conn = connect(&d);
    let mut rest = Vec::new();
    conn.write_all(get("/v1/files/pipe", "").as_bytes())
        .unwrap();
    assert_eq!(read_answer(&mut conn, &mut rest).status, 400);
    let mut legacy = TcpStream::connect(("127.0.0.1", d.legacy_port)).unwrap();
    legacy
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    legacy
        .write_all(get("/download/pipe", "").as_bytes())
        .unwrap();
    assert_eq!(read_answer(&mut legacy, &mut rest).status, 404);
}
