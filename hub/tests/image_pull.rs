//! Registry pulls (issue #15), against a real CNCF `distribution` registry
//! on loopback (`dev/registry/registry.sh`) and the real `sandhub serve`:
//! the multi-layer python3 test image (an index: linux/amd64 + arm64)
//! pulled, run, pulled with htpasswd auth, refused when tampered with,
//! coalesced, and resumed after `kill -9` of the hub.
//!
//! Needs the registry binary (`bash dev/registry/registry.sh build`) and
//! the test image (built by `registry.sh build-test-image` from Debian
//! packages, cached). Without them a test is skipped, except under
//! `CI=true`, where it fails.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, OnceLock,
    },
    time::Duration,
};

use sandhub_api::hub::{CreateSandbox, Template};
use sandhub_client::Sandboxes;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::{error_body, shell_ok, HubOptions, ImageMounts, TestHub};

const USER: &str = "puller";
const PASS: &str = "pull-secret-7c1e";

fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dev/registry/registry.sh")
}

fn cache() -> PathBuf {
    std::env::var_os("SANDHUB_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/sandhub")
        })
}

/// What the tests need beyond the hub: `None` (skip) when missing outside
/// CI; a failure under CI.
fn missing(what: &str) -> Option<TestImage> {
    assert!(
        !is_ci(),
        "CI=true and {what}: run `bash dev/registry/registry.sh build` and \
         `bash dev/registry/registry.sh build-test-image`"
    );
    eprintln!("skipping: {what} (bash dev/registry/registry.sh build)");
    None
}

/// The test image layout and what is in it.
#[derive(Clone)]
struct TestImage {
    layout: PathBuf,
    summary: Value,
}

impl TestImage {
    /// The manifest an index resolves to on this machine, and its layers.
    /// This platform's manifest digest and its layers' blob digests.
    fn this_platform(&self) -> (String, Vec<String>) {
        let (digest, layers) = self.this_platform_layers();
        let blobs = layers
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string());
        (digest, blobs.collect())
    }

    /// The diff ids (sha256 of each uncompressed tar) of this platform's
    /// layers: what a stored image lists as its layers.
    fn diff_ids(&self) -> Vec<String> {
        let (_, layers) = self.this_platform_layers();
        layers
            .iter()
            .map(|l| l["diff_id"].as_str().unwrap().to_string())
            .collect()
    }

    fn this_platform_layers(&self) -> (String, Vec<Value>) {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "linux/amd64",
            "aarch64" => "linux/arm64/v8",
            other => panic!("no test image for {other}"),
        };
        let manifests = self.summary["manifests"].as_object().unwrap();
        // The python3 image for amd64 (the one with most layers: hostile
        // images have one), the tiny one for arm64; both in the index.
        let (digest, m) = manifests
            .iter()
            .filter(|(_, m)| m["platform"] == arch)
            .max_by_key(|(_, m)| m["layers"].as_array().map(Vec::len).unwrap_or(0))
            .expect("a manifest for this platform");
        (digest.clone(), m["layers"].as_array().unwrap().clone())
    }
}

fn test_image() -> Option<TestImage> {
    static IMAGE: OnceLock<Option<TestImage>> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            if !cache().join("registry/bin/registry").is_file() {
                return missing("no registry binary");
            }
            let out = Command::new("bash")
                .arg(script())
                .arg("build-test-image")
                .output()
                .expect("running registry.sh build-test-image");
            if !out.status.success() {
                return missing(&format!(
                    "the test image did not build: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            let summary: Value = serde_json::from_slice(&out.stdout).expect("summary JSON");
            Some(TestImage {
                layout: PathBuf::from(summary["layout"].as_str().unwrap()),
                summary,
            })
        })
        .clone()
}

/// One registry, stopped when dropped.
struct Registry {
    dir: tempfile::TempDir,
    addr: String,
    auth: Option<String>,
}

impl Registry {
    fn up(auth: bool) -> Registry {
        let dir = tempfile::Builder::new()
            .prefix("sandhub-registry-")
            .tempdir()
            .unwrap();
        let auth = auth.then(|| format!("{USER}:{PASS}"));
        let mut cmd = Command::new("bash");
        cmd.arg(script()).arg("up").arg(dir.path());
        if let Some(a) = &auth {
            cmd.args(["--auth", a]);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "registry up: {out:?}");
        let addr = std::fs::read_to_string(dir.path().join("addr"))
            .unwrap()
            .trim()
            .to_string();
        Registry { dir, addr, auth }
    }

    /// Pushes the layout's `name` as `repo_tag`.
    fn push(&self, image: &TestImage, name: &str, repo_tag: &str) {
        let mut cmd = Command::new("bash");
        cmd.arg(script())
            .arg("push")
            .arg(self.dir.path())
            .arg(&image.layout)
            .arg(repo_tag)
            .args(["--ref", name]);
        if let Some(a) = &self.auth {
            cmd.args(["--auth", a]);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "push {name}: {out:?}");
    }

    fn down(&self) {
        let out = Command::new("bash")
            .arg(script())
            .arg("down")
            .arg(self.dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "registry down: {out:?}");
    }

    /// The registry's own file of a blob.
    fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// How many GETs of a blob the registry answered.
    fn blob_gets(&self, digest: &str) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap();
        log.lines()
            .filter(|l| {
                l.contains("response completed")
                    && l.contains("http.request.method=GET")
                    && l.contains(&format!("/blobs/{digest}"))
            })
            .count()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("down")
            .arg(self.dir.path())
            .output();
    }
}

/// A TCP forwarder in front of the registry that sends the registry's
/// answers at `rate` bytes a second (0: as fast as they come).
struct Throttle {
    addr: String,
    rate: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Throttle {
    async fn start(upstream: &str, rate: u64) -> Throttle {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let rate = Arc::new(AtomicU64::new(rate));
        let (up, r) = (upstream.to_string(), rate.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (up, r) = (up.clone(), r.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&up).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                        let _ = sw.shutdown().await;
                    });
                    let mut buf = vec![0u8; 16 << 10];
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        let rate = r.load(Ordering::Relaxed);
                        if rate > 0 {
                            tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64))
                                .await;
                        }
                    }
                    let _ = cw.shutdown().await;
                });
            }
        });
        Throttle { addr, rate, task }
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn leak(args: Vec<String>) -> &'static [&'static str] {
    let v: Vec<&'static str> = args
        .into_iter()
        .map(|s| &*Box::leak(s.into_boxed_str()))
        .collect();
    Box::leak(v.into_boxed_slice())
}

async fn hub_for(insecure: &[&str], more: &[String]) -> TestHub {
    let mut args = Vec::new();
    for a in insecure {
        args.push("--insecure-registry".to_string());
        args.push(a.to_string());
    }
    args.extend(more.iter().cloned());
    TestHub::start(HubOptions {
        extra_args: leak(args),
        ..Default::default()
    })
    .await
}

/// `POST /v1/images/pull`; the NDJSON lines, each parsed.
async fn pull(hub: &TestHub, body: Value) -> Vec<Value> {
    let r = hub
        .http()
        .post(format!("{}/v1/images/pull", hub.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "pull {body}");
    assert_eq!(
        r.headers()["content-type"],
        "application/x-ndjson",
        "pull {body}"
    );
    let text = r.text().await.unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let last = lines.last().unwrap_or_else(|| panic!("empty stream"));
    assert!(
        last["event"] == "done" || last["event"] == "error",
        "the last line is done or error: {text}"
    );
    lines
}

fn last(lines: &[Value]) -> &Value {
    lines.last().unwrap()
}

fn assert_error(lines: &[Value], code: &str) -> String {
    let l = last(lines);
    assert_eq!(l["event"], "error", "{lines:?}");
    assert_eq!(l["code"], code, "{l}");
    l["message"].as_str().unwrap().to_string()
}

async fn image_count(hub: &TestHub) -> usize {
    let list: Value = hub
        .http()
        .get(format!("{}/v1/images", hub.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    list["items"].as_array().unwrap().len()
}

fn dir_count(p: &Path) -> usize {
    std::fs::read_dir(p).map(|d| d.count()).unwrap_or(0)
}

/// `(name, length)` of every partial download: `partial/<tenant>/<hex>`.
fn partial_files(store: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(store.join("partial"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            out.push((f.file_name().to_string_lossy().into_owned(), len));
        }
    }
    out
}

/// The multi-arch index resolves to this machine's manifest; the NDJSON
/// stream is `resolved`, `layer`..., `layer_done` per layer, `done`; the
/// pulled image runs python3 with its Env and WorkingDir, its whiteouts
/// and owners; a second pull fetches nothing.
#[tokio::test]
async fn an_index_pulls_this_platform_and_the_image_runs_python() {
    let Some(image) = test_image() else { return };
    let registry = Registry::up(false);
    registry.push(&image, "sandhub/test:latest", "sandhub/test:latest");
    let hub = hub_for(&[&registry.addr], &[]).await;
    let _mounts = ImageMounts::of(&hub);
    let reference = format!("{}/sandhub/test:latest", registry.addr);

    let lines = pull(&hub, json!({ "reference": reference })).await;
    let (manifest, layers) = image.this_platform();
    let resolved = &lines[0];
    assert_eq!(resolved["event"], "resolved", "{lines:?}");
    assert_eq!(resolved["digest"], manifest.as_str(), "{resolved}");
    let got: Vec<&str> = resolved["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap())
        .collect();
    assert_eq!(got, layers, "{resolved}");
    for l in &layers {
        let of = |kind: &str| {
            lines
                .iter()
                .filter(|e| e["event"] == kind && e["digest"] == l.as_str())
                .count()
        };
        assert!(of("layer") >= 1, "progress of {l}: {lines:?}");
        assert_eq!(of("layer_done"), 1, "{l}: {lines:?}");
    }
    let done = last(&lines);
    assert_eq!(done["event"], "done", "{lines:?}");
    assert_eq!(done["image"]["tags"], json!([reference]), "{done}");
    assert_eq!(done["image"]["layers"], json!(image.diff_ids()), "{done}");
    if std::env::consts::ARCH == "x86_64" {
        assert_eq!(done["image"]["config"]["workdir"], "/srv/work", "{done}");
    }

    // Pulled again: every layer cached, nothing fetched.
    let again = pull(&hub, json!({ "reference": reference })).await;
    assert_eq!(last(&again)["event"], "done");
    assert!(
        again
            .iter()
            .filter(|e| e["event"] == "layer_done")
            .all(|e| e["cached"] == true),
        "{again:?}"
    );
    assert!(!again.iter().any(|e| e["event"] == "layer"), "{again:?}");
    assert_eq!(image_count(&hub).await, 1);

    if std::env::consts::ARCH != "x86_64" {
        return; // the arm64 entry of the index is a one-file image
    }
    let c = hub.client(None);
    c.put_template(
        "py",
        Template {
            image: Some(reference.clone()),
            ..Default::default()
        },
    )
    .await
    .expect("template with the pulled image");
    let sb = c
        .create(CreateSandbox {
            template: Some("py".into()),
            ..Default::default()
        })
        .await
        .expect("sandbox of the pulled image");
    let out = shell_ok(
        &c,
        &sb.id,
        "python3 -c 'import sys; print(sys.version_info[0])'; echo $SANDHUB_IMAGE_MARK; \
         test -e /etc/hidden-by-upper && echo whiteout-broken; ls /opt/opaque; \
         stat -c %u:%a /root-owned; stat -c %u /home/app/mine",
    )
    .await;
    assert_eq!(
        out, "3\nfrom-image\nnew\n0:600\n1000\n",
        "python3, Env, whiteout, opaque dir, owners"
    );
}

/// htpasswd auth: without credentials `UNAUTHENTICATED` (and no image);
/// with wrong ones too; with the body's credentials, and then with the
/// hub's `--registry-config` (read at each pull), it works.
#[tokio::test]
async fn auth_from_the_request_and_from_a_docker_config() {
    let Some(image) = test_image() else { return };
    let registry = Registry::up(true);
    registry.push(&image, "sandhub/test:amd64", "private/app:1");
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), r#"{"auths": {}}"#).unwrap();
    let hub = hub_for(
        &[&registry.addr],
        &[
            "--registry-config".into(),
            config.path().display().to_string(),
        ],
    )
    .await;
    let reference = format!("{}/private/app:1", registry.addr);

    let msg = assert_error(
        &pull(&hub, json!({ "reference": reference })).await,
        "UNAUTHENTICATED",
    );
    assert!(msg.contains("credentials"), "{msg}");
    assert_error(
        &pull(
            &hub,
            json!({ "reference": reference, "username": USER, "password": "wrong" }),
        )
        .await,
        "UNAUTHENTICATED",
    );
    assert_eq!(image_count(&hub).await, 0);

    let lines = pull(
        &hub,
        json!({ "reference": reference, "username": USER, "password": PASS, "tag": "mine:1" }),
    )
    .await;
    assert_eq!(last(&lines)["event"], "done", "{lines:?}");
    assert_eq!(last(&lines)["image"]["tags"], json!(["mine:1"]));

    // A username without a password is refused before any stream.
    let r = hub
        .http()
        .post(format!("{}/v1/images/pull", hub.url()))
        .json(&json!({ "reference": reference, "username": USER }))
        .send()
        .await
        .unwrap();
    error_body(r, 400, "INVALID_ARGUMENT").await;

    // The docker config: `auth` is base64 of user:password.
    use base64::Engine;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASS}"));
    std::fs::write(
        config.path(),
        json!({ "auths": { registry.addr.clone(): { "auth": auth } } }).to_string(),
    )
    .unwrap();
    let lines = pull(&hub, json!({ "reference": reference })).await;
    assert_eq!(last(&lines)["event"], "done", "{lines:?}");
    assert_eq!(
        last(&lines)["image"]["tags"],
        json!([reference, "mine:1"]),
        "{lines:?}"
    );
}

/// Unknown tags and repositories are `NOT_FOUND`, a registry that is down
/// `UNAVAILABLE`, a bad reference `INVALID_ARGUMENT` before any stream;
/// none leaves an image.
#[tokio::test]
async fn unknown_images_and_a_down_registry_have_clear_codes() {
    let Some(image) = test_image() else { return };
    let registry = Registry::up(false);
    registry.push(&image, "sandhub/test:amd64", "sandhub/test:amd64");
    let hub = hub_for(&[&registry.addr], &[]).await;
    let a = &registry.addr;

    assert_error(
        &pull(
            &hub,
            json!({ "reference": format!("{a}/sandhub/test:nope") }),
        )
        .await,
        "NOT_FOUND",
    );
    assert_error(
        &pull(&hub, json!({ "reference": format!("{a}/no/such:1") })).await,
        "NOT_FOUND",
    );
    for bad in ["../x", "a b", ""] {
        let r = hub
            .http()
            .post(format!("{}/v1/images/pull", hub.url()))
            .json(&json!({ "reference": bad }))
            .send()
            .await
            .unwrap();
        error_body(r, 400, "INVALID_ARGUMENT").await;
    }
    // Not an insecure registry: HTTPS to a plain-HTTP port fails clearly.
    let other = Registry::up(false);
    assert_error(
        &pull(
            &hub,
            json!({ "reference": format!("{}/x/y:1", other.addr) }),
        )
        .await,
        "UNAVAILABLE",
    );

    // An image over the hub's --max-image-bytes: refused before a byte of
    // a layer is fetched.
    let small = hub_for(&[a], &["--max-image-bytes".into(), "100000".into()]).await;
    let msg = assert_error(
        &pull(
            &small,
            json!({ "reference": format!("{a}/sandhub/test:amd64") }),
        )
        .await,
        "RESOURCE_EXHAUSTED",
    );
    assert!(msg.contains("--max-image-bytes"), "{msg}");
    assert_eq!(dir_count(&small.state_dir.join("images/partial")), 0);

    registry.down();
    let msg = assert_error(
        &pull(
            &hub,
            json!({ "reference": format!("{a}/sandhub/test:amd64") }),
        )
        .await,
        "UNAVAILABLE",
    );
    assert!(msg.contains("unreachable"), "{msg}");
    assert_eq!(image_count(&hub).await, 0);
}

/// A registry serving a blob that does not match its digest (its stored
/// file edited, same size): refused, the partial download deleted, no
/// image record, no unpacked layer.
#[tokio::test]
async fn a_tampered_blob_is_refused_and_leaves_no_image() {
    let Some(image) = test_image() else { return };
    let registry = Registry::up(false);
    registry.push(&image, "sandhub/test:amd64", "sandhub/test:amd64");
    let (_, layers) = image.this_platform();
    let victim = layers
        .iter()
        .max_by_key(|d| std::fs::metadata(registry.blob_file(d)).unwrap().len())
        .unwrap()
        .clone();
    let file = registry.blob_file(&victim);
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();

    let hub = hub_for(&[&registry.addr], &[]).await;
    let reference = format!("{}/sandhub/test:amd64", registry.addr);
    let msg = assert_error(
        &pull(&hub, json!({ "reference": reference })).await,
        "INVALID_ARGUMENT",
    );
    assert!(msg.contains(&victim) && msg.contains("tampered"), "{msg}");
    let store = hub.state_dir.join("images");
    assert_eq!(image_count(&hub).await, 0);
    assert_eq!(dir_count(&store.join("images")), 0);
    assert_eq!(dir_count(&store.join("layers")), 0);
    let hex = victim.strip_prefix("sha256:").unwrap();
    assert!(partial_files(&store).iter().all(|(name, _)| name != hex));
    assert!(!store.join("blobs/sha256").join(hex).exists());
}

/// Two pulls of one image at the same time: both get the image, and the
/// registry serves each layer once.
#[tokio::test]
async fn concurrent_pulls_of_one_image_fetch_each_layer_once() {
    let Some(image) = test_image() else { return };
    let registry = Registry::up(false);
    registry.push(&image, "sandhub/test:amd64", "sandhub/test:amd64");
    // Slow enough that the second pull starts while the first runs.
    let slow = Throttle::start(&registry.addr, 8 << 20).await;
    let hub = hub_for(&[&slow.addr], &[]).await;
    let reference = format!("{}/sandhub/test:amd64", slow.addr);
    let body = json!({ "reference": reference });
    let first = pull(&hub, body.clone());
    let second = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        pull(&hub, body.clone()).await
    };
    let (a, b) = tokio::join!(first, second);
    assert_eq!(last(&a)["event"], "done", "{a:?}");
    assert_eq!(last(&b)["event"], "done", "{b:?}");
    assert_eq!(last(&a)["image"]["id"], last(&b)["image"]["id"]);
    let (_, layers) = image.this_platform();
    for l in &layers {
        assert_eq!(registry.blob_gets(l), 1, "GETs of {l}");
    }
    assert_eq!(image_count(&hub).await, 1);
}

/// `kill -9` of the hub in the middle of a (slow) pull: nothing of the
/// image is listed or unpacked; the next pull resumes the cut download
/// (its first progress is past 0) and completes.
#[tokio::test]
async fn a_hub_killed_mid_pull_resumes_and_never_uses_half_a_layer() {
    let Some(image) = test_image() else { return };
    let registry = Registry::up(false);
    registry.push(&image, "sandhub/test:amd64", "sandhub/test:amd64");
    let slow = Throttle::start(&registry.addr, 1 << 20).await;
    let mut hub = hub_for(&[&slow.addr], &[]).await;
    let _mounts = ImageMounts::of(&hub);
    let reference = format!("{}/sandhub/test:amd64", slow.addr);
    let url = format!("{}/v1/images/pull", hub.url());
    let client = hub.http();
    let body = json!({ "reference": reference });
    let pending = tokio::spawn(async move { client.post(url).json(&body).send().await });
    let images = hub.state_dir.join("images");
    let big = 1u64 << 20;
    let (cut_hex, cut_len) = common::eventually("a blob half downloaded", common::WAIT, || {
        let images = images.clone();
        async move {
            partial_files(&images)
                .into_iter()
                .find(|(_, len)| *len >= big)
        }
    })
    .await;
    hub.kill9();
    let _ = pending.await;
    let store = hub.state_dir.join("images");
    assert_eq!(dir_count(&store.join("images")), 0);
    assert_eq!(dir_count(&store.join("layers")), 0);
    assert!(!store.join("blobs/sha256").join(&cut_hex).exists());

    slow.rate.store(0, Ordering::Relaxed);
    hub.restart().await;
    assert_eq!(image_count(&hub).await, 0, "no half image after a restart");
    let lines = pull(&hub, json!({ "reference": reference })).await;
    assert_eq!(last(&lines)["event"], "done", "{lines:?}");
    let digest = format!("sha256:{cut_hex}");
    let first = lines
        .iter()
        .find(|e| e["event"] == "layer" && e["digest"] == digest.as_str())
        .unwrap_or_else(|| panic!("progress of {digest}: {lines:?}"));
    assert!(
        first["downloaded"].as_u64().unwrap() >= cut_len,
        "resumed from {cut_len}: {first}"
    );
    let (_, layers) = image.this_platform();
    assert_eq!(dir_count(&store.join("layers")), layers.len());
    assert_eq!(partial_files(&store), vec![]);
}

/// `POST /v1/images/prepull` reports per reference; `sandhub image pull`
/// and `prepull` on the command line.
#[tokio::test]
async fn prepull_and_the_cli() {
    let Some(image) = test_image() else { return };
    let registry = Registry::up(false);
    registry.push(&image, "sandhub/test:amd64", "sandhub/test:amd64");
    registry.push(&image, "sandhub/test:latest", "sandhub/test:latest");
    let hub = hub_for(&[&registry.addr], &[]).await;
    let a = &registry.addr;
    let r: Value = hub
        .http()
        .post(format!("{}/v1/images/prepull", hub.url()))
        .json(&json!({ "references": [
            format!("{a}/sandhub/test:amd64"), format!("{a}/sandhub/test:gone")] }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["images"][0]["ok"], true, "{r}");
    assert!(r["images"][0]["id"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert_eq!(r["images"][1]["ok"], false, "{r}");
    let error = r["images"][1]["error"].as_str().unwrap();
    assert!(error.starts_with("NOT_FOUND: "), "{r}");
    let r = hub
        .http()
        .post(format!("{}/v1/images/prepull", hub.url()))
        .json(&json!({ "references": [] }))
        .send()
        .await
        .unwrap();
    error_body(r, 400, "INVALID_ARGUMENT").await;

    let cli = |args: &[&str]| {
        std::process::Command::new(common::EXE)
            .args(args)
            .args(["--hub", &hub.url()])
            .output()
            .unwrap()
    };
    let out = cli(&[
        "image",
        "pull",
        &format!("{a}/sandhub/test:latest"),
        "--tag",
        "cli:1",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("sha256:"),
        "{out:?}"
    );
    let out = cli(&["image", "prepull", &format!("{a}/sandhub/test:nope")]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("NOT_FOUND"),
        "{out:?}"
    );
    let ls = String::from_utf8(cli(&["image", "ls"]).stdout).unwrap();
    assert!(ls.contains("cli:1"), "{ls}");

    let doc: Value = hub
        .http()
        .get(format!("{}/openapi.json", hub.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for path in ["/v1/images/pull", "/v1/images/prepull"] {
        assert!(
            doc["paths"][path]["post"].is_object(),
            "{path} in /openapi.json"
        );
    }
    let pull = &doc["paths"]["/v1/images/pull"]["post"]["responses"]["200"]["content"];
    assert!(pull["application/x-ndjson"].is_object(), "{pull}");
    assert!(doc["components"]["schemas"]["PullEvent"].is_object());
}

fn sha(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

fn gzip(data: &[u8], level: u32) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A one-file layer tar.
fn one_file_layer(name: &str, data: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    b.append_data(&mut h, name, data).unwrap();
    b.into_inner().unwrap()
}

/// The files of an OCI layout (path -> bytes) of one image whose manifest
/// lists `blobs` as gzip layers and whose config names `diff_ids`,
/// whatever the blobs hold; named `name` in its index.
fn layout_files(name: &str, blobs: &[Vec<u8>], diff_ids: &[String]) -> Vec<(String, Vec<u8>)> {
    let config = serde_json::to_vec(&json!({"os": "linux", "architecture": "amd64",
        "config": {"Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers",
                   "diff_ids": diff_ids.iter().map(|d| format!("sha256:{d}")).collect::<Vec<_>>()}}))
    .unwrap();
    let layers: Vec<Value> = blobs
        .iter()
        .map(|l| {
            json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                   "digest": format!("sha256:{}", sha(l)), "size": l.len()})
        })
        .collect();
    let manifest = serde_json::to_vec(&json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": format!("sha256:{}", sha(&config)), "size": config.len()},
        "layers": layers}))
    .unwrap();
    let index = serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json",
         "digest": format!("sha256:{}", sha(&manifest)), "size": manifest.len(),
         "annotations": {"org.opencontainers.image.ref.name": name}}]}))
    .unwrap();
    let mut files = vec![
        (
            "oci-layout".to_string(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
        ("index.json".to_string(), index),
    ];
    for blob in blobs.iter().chain([&config, &manifest]) {
        files.push((format!("blobs/sha256/{}", sha(blob)), blob.clone()));
    }
    files
}

impl Registry {
    /// Pushes a layout given as files.
    fn push_files(&self, files: &[(String, Vec<u8>)], name: &str, repo_tag: &str) {
        let layout = self
            .dir
            .path()
            .join(format!("layout-{}", sha(name.as_bytes())));
        for (path, data) in files {
            let p = layout.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, data).unwrap();
        }
        let image = TestImage {
            layout,
            summary: Value::Null,
        };
        self.push(&image, name, repo_tag);
    }
}

async fn pull_as(hub: &TestHub, key: &str, body: Value) -> Vec<Value> {
    let r = hub
        .http()
        .post(format!("{}/v1/images/pull", hub.url()))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "pull {body}");
    r.text()
        .await
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Finding 1 through a pull: bob's registry (his own) names the diff id of
/// alice's private layer with a junk blob. The hub fetches the junk (it is
/// not skipped because the layer is unpacked already), finds it is not
/// that layer, and stores nothing for bob; with the real content in his
/// registry, the pull succeeds.
#[tokio::test]
async fn a_pull_cannot_borrow_a_layer_by_its_diff_id() {
    use common::{ALICE_KEY, BOB_KEY};
    if !cache().join("registry/bin/registry").is_file() {
        missing("no registry binary");
        return;
    }
    let registry = Registry::up(false);
    let secret = one_file_layer("secret", b"alice's private key\n");
    let diff_ids = [sha(&secret)];
    let junk = gzip(&vec![7u8; 10 << 10], 1);
    registry.push_files(
        &layout_files("steal", std::slice::from_ref(&junk), &diff_ids),
        "steal",
        "bob/steal:1",
    );
    registry.push_files(
        &layout_files("own", &[gzip(&secret, 1)], &diff_ids),
        "own",
        "bob/own:1",
    );
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        extra_args: leak(vec!["--insecure-registry".into(), registry.addr.clone()]),
        ..Default::default()
    })
    .await;
    let _mounts = ImageMounts::of(&hub);
    // Alice's image, imported: a layout as one tar.
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in layout_files("private", &[gzip(&secret, 6)], &diff_ids) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, path, &data[..]).unwrap();
    }
    let r = hub
        .http()
        .post(format!("{}/v1/images/import?tag=private:1", hub.url()))
        .bearer_auth(ALICE_KEY)
        .body(b.into_inner().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());

    let steal = format!("{}/bob/steal:1", registry.addr);
    let lines = pull_as(&hub, BOB_KEY, json!({ "reference": steal })).await;
    let msg = assert_error(&lines, "INVALID_ARGUMENT");
    assert!(msg.contains("image config says"), "{msg}");
    assert_eq!(registry.blob_gets(&format!("sha256:{}", sha(&junk))), 1);
    assert!(partial_files(&hub.state_dir.join("images")).is_empty());

    let own = format!("{}/bob/own:1", registry.addr);
    let lines = pull_as(&hub, BOB_KEY, json!({ "reference": own })).await;
    assert_eq!(last(&lines)["event"], "done", "{lines:?}");
    let list: Value = hub
        .http()
        .get(format!("{}/v1/images", hub.url()))
        .bearer_auth(BOB_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");
}
