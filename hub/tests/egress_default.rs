//! The built-in `default` template is online (issue #27): on a hub with
//! default flags (only `--egress-dns` points at the test resolver) a new
//! user's `pip install` and `git clone` over HTTPS work from it, while the
//! private ranges and the hub stay closed; every way such a sandbox comes
//! to run (cold, warm, claimed, forked, resumed, after a hub restart) has
//! its gateway; and a hub that cannot run gateways says so once and keeps
//! the default offline. The "internet" is `common::internet`'s
//! (198.18.0.0/15 is not a private range, so no `--egress-allow-private`).

mod common;

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
};

use sandhub_api::hub::{CreateSandbox, ForkRequest, Launch, PoolSpec};
use sandhub_client::{http::HubClient, Sandboxes};

use common::{
    eventually,
    internet::{assert_ok, assert_refused, prerequisites, probe, Internet, ONE_INTERNET},
    shell, shell_ok, HubOptions, TestHub, WAIT,
};

/// Makes, in the directory it is given, a test CA and a certificate for
/// `pypi.test` and `git.test`, a PEP 503 simple index holding one
/// hand-made pure-Python wheel, and a git repository served the "dumb"
/// way; then serves it all over HTTPS on 198.18.0.2:443 (it runs inside
/// the test namespace) and prints `ready`. Each request is logged to
/// `requests.log`.
const INDEX_SERVER: &str = r#"
import base64, functools, hashlib, http.server, os, ssl, subprocess, sys, zipfile

d = sys.argv[1]
www = os.path.join(d, "www")
def run(*argv, **kw):
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)

# The test CA, and the servers' certificate signed by it.
ca_key, ca, key, csr, cert, ext = (os.path.join(d, n) for n in
    ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem", "ext.cnf"))
run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
    "-days", "2", "-subj", "/CN=sandhub test CA",
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=pypi.test")
with open(ext, "w") as f:
    f.write("subjectAltName=DNS:pypi.test,DNS:git.test\nbasicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
run("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
    "-out", cert, "-days", "2", "-extfile", ext)

# A pure-Python wheel, written by hand (a wheel is a zip with a RECORD).
files = {
    "hellopkg/__init__.py": b"def hello():\n    return 'hello from hellopkg'\n",
    "hellopkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: hellopkg\nVersion: 1.0\n",
    "hellopkg-1.0.dist-info/WHEEL":
        b"Wheel-Version: 1.0\nGenerator: sandhub-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
def digest(b):
    return base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
record = "".join(f"{n},sha256={digest(b)},{len(b)}\n" for n, b in files.items())
record += "hellopkg-1.0.dist-info/RECORD,,\n"
files["hellopkg-1.0.dist-info/RECORD"] = record.encode()
wheel = "hellopkg-1.0-py3-none-any.whl"
os.makedirs(os.path.join(www, "packages"))
with zipfile.ZipFile(os.path.join(www, "packages", wheel), "w") as z:
    for n, b in files.items():
        z.writestr(n, b)
with open(os.path.join(www, "packages", wheel), "rb") as f:
    sha = hashlib.sha256(f.read()).hexdigest()
os.makedirs(os.path.join(www, "simple", "hellopkg"))
with open(os.path.join(www, "simple", "index.html"), "w") as f:
    f.write('<!DOCTYPE html><html><body><a href="hellopkg/">hellopkg</a></body></html>\n')
with open(os.path.join(www, "simple", "hellopkg", "index.html"), "w") as f:
    f.write(f'<!DOCTYPE html><html><body><a href="../../packages/{wheel}#sha256={sha}">{wheel}</a>'
            '</body></html>\n')

# A git repository, bare, with the files the dumb HTTP protocol reads.
work = os.path.join(d, "work")
git = ["git", "-c", "user.name=test", "-c", "user.email=test@git.test", "-c", "init.defaultBranch=main"]
run(*git, "init", "-q", work)
with open(os.path.join(work, "README.txt"), "w") as f:
    f.write("hello from git.test\n")
run(*git, "-C", work, "add", "README.txt")
run(*git, "-C", work, "commit", "-q", "-m", "first")
run(*git, "clone", "-q", "--bare", work, os.path.join(www, "repo.git"))
run(*git, "-C", os.path.join(www, "repo.git"), "update-server-info")

log = open(os.path.join(d, "requests.log"), "a", buffering=1)
class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, fmt, *args):
        log.write(self.path + "\n")
srv = http.server.ThreadingHTTPServer(("198.18.0.2", 443), functools.partial(Handler, directory=www))
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print("ready", flush=True)
srv.serve_forever()
"#;

/// The HTTPS index and git server in the test namespace; killed on drop.
struct IndexServer {
    child: Child,
    dir: tempfile::TempDir,
}

impl IndexServer {
    fn start(net: &Internet) -> IndexServer {
        let dir = tempfile::Builder::new()
            .prefix("sandhub-index-")
            .tempdir()
            .unwrap();
        // `ip netns exec` execs the program: the child is the server.
        let mut child = Command::new("ip")
            .args(["netns", "exec", &net.ns, "/usr/bin/python3", "-c"])
            .arg(INDEX_SERVER)
            .arg(dir.path())
            .env("HOME", dir.path())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the index server");
        let mut line = String::new();
        let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
        let server = IndexServer { child, dir };
        assert_eq!(line.trim(), "ready", "the index server did not start");
        server
    }

    fn ca(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ca.pem")).unwrap()
    }

    fn requests(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("requests.log")).unwrap_or_default()
    }
}

impl Drop for IndexServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn get_json(hub: &TestHub, path: &str) -> serde_json::Value {
    hub.http()
        .get(format!("{}{path}", hub.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The network interfaces a sandbox sees.
async fn interfaces(c: &HubClient, id: &str) -> Vec<String> {
    let dev = shell_ok(c, id, "cat /proc/net/dev").await;
    dev.lines()
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim().to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_template_installs_packages_and_clones_over_https_with_private_ranges_closed() {
    if !prerequisites() {
        return;
    }
    let _one = ONE_INTERNET.lock().await;
    let net = Internet::up();
    let index = IndexServer::start(&net);
    let hub = TestHub::start(HubOptions {
        extra_args: &["--egress-dns", "198.18.0.2"],
        ..Default::default()
    })
    .await;
    let c = hub.client(None);

    // What the new user sees: the default template is online.
    let t = get_json(&hub, "/v1/templates/default").await;
    assert_eq!(t["network"], "egress", "{t}");
    let listed = get_json(&hub, "/v1/templates").await;
    assert!(
        listed["templates"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "default" && t["network"] == "egress"),
        "{listed}"
    );

    // A cold sandbox of no named template, as `sandhub create` makes.
    let id = c.create(CreateSandbox::default()).await.unwrap().id;
    // The user trusts the index's CA the way pip and git are told to.
    shell_ok(
        &c,
        &id,
        &format!("cat > /workspace/test-ca.pem <<'EOF'\n{}EOF\n", index.ca()),
    )
    .await;

    let pip = r#"
set -e
/usr/bin/python3 -m venv /workspace/venv
/workspace/venv/bin/pip install --disable-pip-version-check --no-cache-dir \
    --index-url https://pypi.test/simple --cert /workspace/test-ca.pem hellopkg
/workspace/venv/bin/python -c 'import hellopkg; print(hellopkg.hello())'
"#;
    let r = shell(&c, &id, pip).await;
    assert_eq!(r.exit_code, 0, "{r:?}\n{}", hub.log_tail());
    assert!(
        r.stdout.contains("Successfully installed hellopkg-1.0"),
        "{r:?}"
    );
    assert!(
        r.stdout.ends_with("hello from hellopkg\n"),
        "the installed package imports and runs: {r:?}"
    );
    let seen = index.requests();
    assert!(
        seen.contains("/simple/hellopkg/") && seen.contains("/packages/hellopkg-1.0"),
        "the wheel came from the test index: {seen}"
    );

    let git = "GIT_SSL_CAINFO=/workspace/test-ca.pem git clone -q https://git.test/repo.git \
               /workspace/repo && cat /workspace/repo/README.txt";
    let r = shell(&c, &id, git).await;
    assert_eq!(r.exit_code, 0, "{r:?}\n{}", hub.log_tail());
    assert_eq!(r.stdout, "hello from git.test\n", "{r:?}");
    assert!(index.requests().contains("/repo.git/info/refs"));

    // Without being told to trust the test CA, TLS is refused: the
    // gateway passes TLS through untouched, it does not vouch for hosts.
    let r = shell(
        &c,
        &id,
        "git clone -q https://git.test/repo.git /workspace/untrusted",
    )
    .await;
    assert_ne!(r.exit_code, 0, "{r:?}");
    assert!(r.stderr.contains("certificate"), "{r:?}");

    // The same sandbox: a private test host and the hub's own port (by a
    // name that resolves to the host's loopback) are refused at once.
    let hub_port = hub.port;
    let urls = [
        "http://pypi.test/open-web".to_string(),
        "http://private.test/private".into(),
        "http://100.80.0.2/private-literal".into(),
        format!("http://rebind.test:{hub_port}/healthz"),
        "http://169.254.77.2/link-local".into(),
    ];
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let got = probe(&c, &id, &refs).await;
    assert_ok(&got[0], &got[0]);
    for line in &got[1..] {
        assert_refused(line, line);
    }
    assert_eq!(
        net.seen("/private") + net.seen("/private-literal") + net.seen("/link-local"),
        0
    );
    drop(hub);
    drop(index);
    drop(net);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_sandboxes_have_their_gateway_warm_claimed_forked_resumed_and_after_a_restart() {
    if !prerequisites() {
        return;
    }
    let _one = ONE_INTERNET.lock().await;
    let _net = Internet::up();
    let mut hub = TestHub::start(HubOptions {
        extra_args: &["--egress-dns", "198.18.0.2"],
        ..Default::default()
    })
    .await;
    let c = hub.client(None);
    let online = |c: &HubClient, id: &str, what: &'static str| {
        let (c, id) = (c.clone(), id.to_string());
        async move {
            let got = probe(&c, &id, &[&format!("http://pypi.test/{what}")]).await;
            assert_ok(&got[0], &format!("{what}: {}", got[0]));
        }
    };

    // A warm pool of the default template; a create naming nothing claims
    // a member, which was started (and got its gateway) before the claim.
    c.put_pool(
        "default",
        PoolSpec {
            template: "default".into(),
            replicas: 1,
        },
    )
    .await
    .unwrap();
    let pools = &c;
    let filled = move || async move {
        let p = pools.get_pool("default").await.ok()?;
        (p.ready == 1).then_some(())
    };
    eventually("the default pool to fill", WAIT, filled).await;
    let warm = c.create(CreateSandbox::default()).await.unwrap();
    assert_eq!(warm.launch, Launch::Warm, "{warm:?}");
    online(&c, &warm.id, "warm").await;

    // A fork of its snapshot.
    let fork = c.fork(&warm.id, ForkRequest::default()).await.unwrap();
    online(&c, &fork.id, "fork").await;

    // Suspended and resumed.
    c.suspend(&warm.id).await.unwrap();
    c.resume(&warm.id).await.unwrap();
    online(&c, &warm.id, "resumed").await;

    // kill -9 of the hub: the restarted hub gives each its gateway back,
    // the unclaimed warm member too.
    eventually("the default pool to refill", WAIT, filled).await;
    hub.restart().await;
    let c = hub.client(None);
    online(&c, &warm.id, "restart-claimed").await;
    online(&c, &fork.id, "restart-fork").await;
    let member = c.create(CreateSandbox::default()).await.unwrap();
    assert_eq!(member.launch, Launch::Warm, "{member:?}");
    online(&c, &member.id, "restart-warm").await;

    // A `default` template the tenant stores wins over the built-in one.
    c.delete_pool("default").await.unwrap();
    let r = hub
        .http()
        .put(format!("{}/v1/templates/default", hub.url()))
        .json(&serde_json::json!({"network": "none"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let off = c.create(CreateSandbox::default()).await.unwrap();
    assert_eq!(interfaces(&c, &off.id).await, ["lo"]);
}

/// Where no TUN device can be made (here: a mount namespace whose
/// `/dev/net` is empty), the default template runs offline, the hub warns
/// once at start, and `GET` shows what runs; `--default-network none`
/// asks for the same without a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_gateways_the_default_template_is_offline_and_the_hub_says_so_once() {
    if !prerequisites() {
        return;
    }
    const WARNING: &str = "cannot run egress gateways";
    let hub = TestHub::start(HubOptions {
        extra_args: &["--default-network", "none"],
        ..Default::default()
    })
    .await;
    let t = get_json(&hub, "/v1/templates/default").await;
    assert_eq!(t["network"], "none", "{t}");
    assert!(!hub.log().contains(WARNING), "{}", hub.log());
    drop(hub);

    let hub = TestHub::start(HubOptions {
        wrapper: &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            "mount -t tmpfs -o size=4k sandhub-no-tun /dev/net && exec \"$@\"",
            "sh",
        ],
        ..Default::default()
    })
    .await;
    let c = hub.client(None);
    let t = get_json(&hub, "/v1/templates/default").await;
    assert_eq!(t["network"], "none", "{t}");
    let sb = c.create(CreateSandbox::default()).await.unwrap();
    assert_eq!(interfaces(&c, &sb.id).await, ["lo"]);
    assert_eq!(
        hub.log().matches(WARNING).count(),
        1,
        "one warning at start:\n{}",
        hub.log()
    );
    // A template that asks for egress by name fails to start, saying why.
    let r = hub
        .http()
        .put(format!("{}/v1/templates/web", hub.url()))
        .json(&serde_json::json!({"network": "egress"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let err = c
        .create(CreateSandbox {
            template: Some("web".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("/dev/net/tun"), "{err}");
    // Its disk volume was mounted in its own mount namespace, which goes
    // with it; the empty mount point on the shared /run stays: remove it.
    let mount_point = sandhub::local::runtime::quota::plan::mount_point(
        std::path::Path::new(sandhub::local::runtime::quota::DEFAULT_RUN_DIR),
        &hub.state_dir.canonicalize().unwrap(),
    );
    drop(hub);
    let _ = std::fs::remove_dir(mount_point);
}
