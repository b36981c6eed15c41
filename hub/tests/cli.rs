//! The `sandhub` CLI as a user runs it: the real binary as a subprocess,
//! against a real `sandhub serve` on loopback with its own state dir.
//!
//! The first group needs only the hub's store (templates, pools, errors);
//! the second starts sandboxes on the local backend.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_sandhub");
/// Every CLI run and every wait is bounded by this, so a hang fails the
/// test instead of stalling the suite.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
const START_TIMEOUT: Duration = Duration::from_secs(30);

struct Hub {
    child: Child,
    url: String,
    state: tempfile::TempDir,
    /// The first key of `--api-keys-file`, for cleaning up.
    key: Option<String>,
}

struct Run {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: String,
}

impl Run {
    fn code(&self) -> i32 {
        self.status.code().expect("the CLI was killed by a signal")
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout()))
    }

    /// Exit 0, or a panic that shows what the CLI said.
    fn ok(self) -> Run {
        assert_eq!(
            self.code(),
            0,
            "stdout: {}\nstderr: {}",
            self.stdout(),
            self.stderr
        );
        self
    }
}

impl Hub {
    fn start() -> Hub {
        Hub::start_with_keys(None)
    }

    /// `keys`: the `--api-keys-file` contents (`key tenant` per line).
    fn start_with_keys(keys: Option<&str>) -> Hub {
        let state = tempfile::tempdir().unwrap();
        let port = free_port();
        let log = std::fs::File::create(state.path().join("hub.log")).unwrap();
        let mut command = without_sandhub_env(Command::new(BIN));
        command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--state-dir")
            .arg(state.path().join("state"))
            // The template round trip sets (and reads back) `network: host`.
            .arg("--allow-host-network");
        if let Some(keys) = keys {
            let file = state.path().join("keys");
            std::fs::write(&file, keys).unwrap();
            command.arg("--api-keys-file").arg(file);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut hub = Hub {
            child,
            url: format!("http://127.0.0.1:{port}"),
            state,
            key: keys.and_then(|k| k.split_whitespace().next().map(String::from)),
        };
        hub.wait_healthy(port);
        hub
    }

    fn wait_healthy(&mut self, port: u16) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("sandhub serve exited ({status}):\n{}", self.log());
            }
            if healthz(port) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sandhub serve not healthy after {START_TIMEOUT:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.state.path().join("hub.log")).unwrap_or_default()
    }

    fn cli(&self, args: &[&str]) -> Run {
        self.cli_with_stdin(args, b"")
    }

    fn cli_with_stdin(&self, args: &[&str], stdin: &[u8]) -> Run {
        let mut command = self.command(args);
        run(&mut command, stdin)
    }

    /// The CLI with only `SANDHUB_URL` from the SANDHUB_* family set.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = without_sandhub_env(Command::new(BIN));
        command.args(args).env("SANDHUB_URL", &self.url);
        command
    }

    /// The CLI with the hub's API key, if it has one.
    fn admin(&self, args: &[&str]) -> Run {
        let mut command = self.command(args);
        if let Some(key) = &self.key {
            command.env("SANDHUB_API_KEY", key);
        }
        run(&mut command, b"")
    }

    /// `field` of each item a `... ls --output json` lists.
    fn names(&self, list: &[&str], field: &str) -> Vec<String> {
        let mut args = list.to_vec();
        args.extend(["--output", "json"]);
        let items: Value = serde_json::from_slice(&self.admin(&args).stdout).unwrap_or_default();
        items
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item[field].as_str().map(String::from))
            .collect()
    }

    /// A sandbox with a label to find it by; `Drop` deletes it.
    fn sandbox(&self) -> String {
        let id = self.cli(&["create", "--label", "suite=cli"]).ok().stdout();
        let id = id.trim().to_string();
        assert!(
            !id.is_empty() && !id.contains(char::is_whitespace),
            "{id:?}"
        );
        id
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        // Sandboxes outlive their hub by design; a test must leave none,
        // warm ones included, even when it failed halfway.
        for pool in self.names(&["pool", "ls"], "name") {
            let _ = self.admin(&["pool", "rm", &pool]);
        }
        let ids = self.names(&["ls"], "id");
        if !ids.is_empty() {
            let mut args = vec!["rm"];
            args.extend(ids.iter().map(String::as_str));
            let _ = self.admin(&args);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        detach_disk_volume(&self.state.path().join("state"));
    }
}

/// A killed hub leaves its sandboxes' disk volume mounted (sandboxes may
/// still use it); a test's must go with the test.
fn detach_disk_volume(state_dir: &std::path::Path) {
    use sandhub::local::runtime::quota::{plan, DEFAULT_RUN_DIR};
    let Ok(state_dir) = state_dir.canonicalize() else {
        return;
    };
    let mount_point = plan::mount_point(std::path::Path::new(DEFAULT_RUN_DIR), &state_dir);
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if plan::find_mount(&mountinfo, &mount_point).is_none() {
        return;
    }
    let path = std::ffi::CString::new(mount_point.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: umount2 reads a NUL-terminated path; nothing else is touched.
    unsafe {
        libc::umount2(path.as_ptr(), libc::MNT_DETACH);
    }
    let _ = std::fs::remove_dir(&mount_point);
}

/// The environment of whoever runs the tests must not change what the
/// hub or the CLI do (every flag has a SANDHUB_* variable).
fn without_sandhub_env(mut command: Command) -> Command {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SANDHUB_") {
            command.env_remove(name);
        }
    }
    command
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn healthz(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.1 200")
}

/// Runs to completion with `stdin` fed and both outputs collected, or
/// kills the process and panics after [`RUN_TIMEOUT`].
fn run(command: &mut Command, stdin: &[u8]) -> Run {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        // A command that never reads its stdin closes the pipe: fine.
        let _ = input.write_all(&stdin);
    });
    let stdout = reader(child.stdout.take().unwrap());
    let stderr = reader(child.stderr.take().unwrap());
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} still running after {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    writer.join().unwrap();
    Run {
        status,
        stdout: stdout.join().unwrap(),
        stderr: String::from_utf8_lossy(&stderr.join().unwrap()).into_owned(),
    }
}

fn reader(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = from.read_to_end(&mut out);
        out
    })
}

fn assert_fails_with(run: &Run, code: &str) {
    assert_eq!(
        run.code(),
        1,
        "stdout: {}\nstderr: {}",
        run.stdout(),
        run.stderr
    );
    assert!(
        run.stderr.contains(&format!("error: {code}: ")),
        "expected {code} on stderr, got: {}",
        run.stderr
    );
}

// --- Store-only: no sandbox is started. ---

#[test]
fn template_set_get_ls_rm_round_trip() {
    let hub = Hub::start();
    let set = hub
        .cli(&[
            "template",
            "set",
            "py",
            "--cpu",
            "0.5",
            "--memory-mb",
            "256",
            "--pids",
            "64",
            "--network",
            "host",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
        ])
        .ok();
    assert_eq!(set.stdout(), "py\n");

    let got = hub
        .cli(&["template", "get", "py", "--output", "json"])
        .ok()
        .json();
    assert_eq!(got["name"], "py");
    assert_eq!(got["cpu"], 0.5);
    assert_eq!(got["memory_mb"], 256);
    assert_eq!(got["pids"], 64);
    assert_eq!(got["network"], "host");
    assert_eq!(got["env"]["A"], "1");
    assert_eq!(got["env"]["B"], "x=y");

    let table = hub.cli(&["template", "ls"]).ok().stdout();
    let row = table
        .lines()
        .find(|l| l.starts_with("py "))
        .unwrap_or_else(|| panic!("no row for py in:\n{table}"));
    assert!(
        row.contains("0.5") && row.contains("256") && row.contains("host"),
        "{row}"
    );
    assert!(table.starts_with("NAME "), "{table}");

    // What `get --output json` prints can be edited and set again.
    let mut edited = got.clone();
    edited["memory_mb"] = 512.into();
    let file = hub.state.path().join("py.json");
    std::fs::write(&file, edited.to_string()).unwrap();
    hub.cli(&["template", "set", "py", "--file", file.to_str().unwrap()])
        .ok();
    let got = hub
        .cli(&["template", "get", "py", "--output", "json"])
        .ok()
        .json();
    assert_eq!(got["memory_mb"], 512);
    assert_eq!(got["cpu"], 0.5);

    let listed = hub.cli(&["template", "ls", "--output", "json"]).ok().json();
    assert!(
        listed.as_array().unwrap().iter().any(|t| t["name"] == "py"),
        "{listed}"
    );

    assert_eq!(hub.cli(&["template", "rm", "py"]).ok().stdout(), "py\n");
    assert_fails_with(&hub.cli(&["template", "get", "py"]), "NOT_FOUND");
}

#[test]
fn template_file_naming_another_template_is_refused() {
    let hub = Hub::start();
    let file = hub.state.path().join("t.json");
    std::fs::write(&file, r#"{"name":"other","cpu":1}"#).unwrap();
    let run = hub.cli(&["template", "set", "mine", "--file", file.to_str().unwrap()]);
    assert_fails_with(&run, "INVALID_ARGUMENT");
    assert!(run.stderr.contains("other"), "{}", run.stderr);
}

#[test]
fn pool_set_no_wait_ls_get_rm() {
    let hub = Hub::start();
    hub.cli(&["template", "set", "small", "--pids", "64"]).ok();
    let set = hub
        .cli(&[
            "pool",
            "set",
            "warm",
            "--template",
            "small",
            "--replicas",
            "2",
            "--no-wait",
            "--output",
            "json",
        ])
        .ok()
        .json();
    assert_eq!(set["name"], "warm");
    assert_eq!(set["template"], "small");
    assert_eq!(set["replicas"], 2);

    let pools = hub.cli(&["pool", "ls", "--output", "json"]).ok().json();
    let pools = pools.as_array().unwrap();
    assert_eq!(pools.len(), 1, "{pools:?}");
    assert_eq!(pools[0]["name"], "warm");
    assert_eq!(pools[0]["replicas"], 2);

    let table = hub.cli(&["pool", "ls"]).ok().stdout();
    assert!(table.starts_with("NAME "), "{table}");
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(
        row.starts_with("warm ") && row.contains("small") && row.contains("/2"),
        "{table}"
    );

    let got = hub
        .cli(&["pool", "get", "warm", "--output", "json"])
        .ok()
        .json();
    assert_eq!(got["template"], "small");

    assert_eq!(hub.cli(&["pool", "rm", "warm"]).ok().stdout(), "warm\n");
    assert_fails_with(&hub.cli(&["pool", "get", "warm"]), "NOT_FOUND");
    let pools = hub.cli(&["pool", "ls", "--output", "json"]).ok().json();
    assert_eq!(pools, serde_json::json!([]));
}

#[test]
fn pool_set_waits_and_times_out() {
    let hub = Hub::start();
    hub.cli(&["template", "set", "small"]).ok();
    // Zero replicas: ready at once, so waiting returns at once.
    let empty = hub
        .cli(&[
            "pool",
            "set",
            "none",
            "--template",
            "small",
            "--replicas",
            "0",
        ])
        .ok();
    assert_eq!(empty.stdout(), "none\n");
    // The hub fills pools in the background, so right after the PUT a new
    // pool of 3 is not full, and a zero timeout expires on the first look.
    let run = hub.cli(&[
        "pool",
        "set",
        "three",
        "--template",
        "small",
        "--replicas",
        "3",
        "--timeout",
        "0s",
    ]);
    assert_fails_with(&run, "DEADLINE_EXCEEDED");
    assert!(
        run.stderr.contains("pool three: 0/3 ready"),
        "{}",
        run.stderr
    );
    hub.cli(&["pool", "rm", "three"]).ok();
    hub.cli(&["pool", "rm", "none"]).ok();
}

#[test]
fn pool_of_unknown_template_is_not_found() {
    let hub = Hub::start();
    let run = hub.cli(&["pool", "set", "p", "--template", "nope", "--replicas", "1"]);
    assert_fails_with(&run, "NOT_FOUND");
}

#[test]
fn create_with_unknown_template_is_not_found() {
    let hub = Hub::start();
    assert_fails_with(&hub.cli(&["create", "--template", "nope"]), "NOT_FOUND");
}

#[test]
fn rm_of_unknown_ids_fails_and_names_them() {
    let hub = Hub::start();
    let run = hub.cli(&["rm", "sb-nope", "sb-gone"]);
    assert_eq!(run.code(), 1, "{}", run.stderr);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{}", run.stderr);
    assert!(
        lines[0].starts_with("error: NOT_FOUND: ") && lines[0].contains("sb-nope"),
        "{}",
        run.stderr
    );
    assert!(
        lines[1].starts_with("error: NOT_FOUND: ") && lines[1].contains("sb-gone"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stdout(), "");
}

#[test]
fn json_output_parses() {
    let hub = Hub::start();
    assert_eq!(
        hub.cli(&["ls", "--output", "json"]).ok().json(),
        serde_json::json!([])
    );
    assert_eq!(
        hub.cli(&["pool", "ls", "--output", "json"]).ok().json(),
        serde_json::json!([])
    );
    assert!(hub
        .cli(&["template", "ls", "--output", "json"])
        .ok()
        .json()
        .is_array());
    // The env var does what the flag does.
    let mut command = hub.command(&["ls"]);
    command.env("SANDHUB_OUTPUT", "json");
    assert_eq!(run(&mut command, b"").ok().json(), serde_json::json!([]));
    // An empty table is still its header.
    assert!(hub.cli(&["ls"]).ok().stdout().starts_with("ID "));
}

#[test]
fn an_unreachable_hub_is_unavailable() {
    let port = free_port();
    let mut command = without_sandhub_env(Command::new(BIN));
    command.args(["ls", "--hub", &format!("http://127.0.0.1:{port}")]);
    assert_fails_with(&run(&mut command, b""), "UNAVAILABLE");
}

#[test]
fn usage_errors_exit_2_and_bad_operands_exit_1() {
    let hub = Hub::start();
    assert_eq!(hub.cli(&["exec", "sb-1"]).code(), 2);
    assert_eq!(hub.cli(&["create", "--label", "novalue"]).code(), 2);
    assert_eq!(hub.cli(&["ls", "--output", "yaml"]).code(), 2);
    assert_fails_with(&hub.cli(&["cp", "a", "b"]), "INVALID_ARGUMENT");
    assert_fails_with(&hub.cli(&["cp", "sb-1:a", "sb-2:b"]), "INVALID_ARGUMENT");
    assert_fails_with(&hub.cli(&["exec", "sb-nope", "--", "true"]), "NOT_FOUND");
}

// --- With sandboxes on the local backend. ---

#[test]
fn exec_streams_output_and_passes_exit_codes_through() {
    let hub = Hub::start();
    let id = hub.sandbox();

    let hi = hub.cli(&["exec", &id, "--", "echo", "hi"]).ok();
    assert_eq!(hi.stdout(), "hi\n");

    assert_eq!(
        hub.cli(&["exec", &id, "--", "sh", "-c", "exit 7"]).code(),
        7
    );

    let both = hub.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]);
    assert_eq!(both.code(), 3);
    assert_eq!(both.stdout(), "out\n");
    assert_eq!(both.stderr, "err\n");

    // One argument with a space is a program name, not a shell line.
    assert_ne!(hub.cli(&["exec", &id, "--", "echo hi"]).code(), 0);

    let env = hub
        .cli(&[
            "exec",
            &id,
            "--env",
            "GREETING=hello",
            "--",
            "sh",
            "-c",
            "echo $GREETING",
        ])
        .ok();
    assert_eq!(env.stdout(), "hello\n");
}

#[test]
fn exec_runs_in_the_workspace_relative_cwd() {
    let hub = Hub::start();
    let id = hub.sandbox();
    hub.cli(&["exec", &id, "--", "mkdir", "-p", "sub"]).ok();
    let cwd = hub.cli(&["exec", &id, "--cwd", "sub", "--", "pwd"]).ok();
    assert_eq!(cwd.stdout(), "/workspace/sub\n");
}

#[test]
fn exec_timeout_exits_124() {
    let hub = Hub::start();
    let id = hub.sandbox();
    let started = Instant::now();
    let run = hub.cli(&["exec", &id, "--timeout", "1s", "--", "sleep", "30"]);
    assert_eq!(run.code(), 124, "{}", run.stderr);
    assert!(started.elapsed() < Duration::from_secs(25));
}

#[test]
fn exec_forwards_stdin_until_eof() {
    let hub = Hub::start();
    let id = hub.sandbox();
    let cat = hub
        .cli_with_stdin(&["exec", &id, "--", "cat"], b"line one\nline two\n")
        .ok();
    assert_eq!(cat.stdout(), "line one\nline two\n");

    // More than one stdin chunk, and bytes that are not UTF-8.
    let input: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let echoed = hub.cli_with_stdin(&["exec", &id, "--", "cat"], &input).ok();
    assert_eq!(echoed.stdout.len(), input.len());
    assert!(echoed.stdout == input);

    // No input at all is an immediate EOF, not a hang.
    let empty = hub
        .cli_with_stdin(&["exec", &id, "--", "wc", "-c"], b"")
        .ok();
    assert_eq!(empty.stdout().trim(), "0");
}

#[test]
fn exec_forwards_sigint_to_the_command() {
    let hub = Hub::start();
    let id = hub.sandbox();
    let mut child = hub
        .command(&["exec", &id, "--", "sh", "-c", "echo ready; exec sleep 30"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 6];
    stdout.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"ready\n");
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("exec did not exit after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // sleep died of the forwarded SIGINT: 128 + 2.
    assert_eq!(status.code(), Some(130));
}

#[test]
fn cp_copies_binary_files_both_ways() {
    let hub = Hub::start();
    let id = hub.sandbox();
    let dir = hub.state.path();
    let data: Vec<u8> = (0..700_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let local = dir.join("blob.bin");
    std::fs::write(&local, &data).unwrap();

    let up = format!("{id}:data/blob.bin");
    hub.cli(&["cp", local.to_str().unwrap(), &up]).ok();
    let size = hub
        .cli(&["exec", &id, "--", "wc", "-c", "data/blob.bin"])
        .ok();
    assert_eq!(size.stdout().split_whitespace().next(), Some("700000"));

    let back = dir.join("back.bin");
    let summary = hub
        .cli(&["cp", &up, back.to_str().unwrap(), "--output", "json"])
        .ok()
        .json();
    assert_eq!(summary["files"], 1);
    assert_eq!(summary["bytes"], 700_000);
    assert!(std::fs::read(&back).unwrap() == data);

    // Into an existing directory, the file keeps its name.
    let into = dir.join("into");
    std::fs::create_dir(&into).unwrap();
    hub.cli(&["cp", &up, into.to_str().unwrap()]).ok();
    assert!(std::fs::read(into.join("blob.bin")).unwrap() == data);

    // `-` is stdout and stdin.
    let out = hub.cli(&["cp", &up, "-"]).ok();
    assert!(out.stdout == data);
    hub.cli_with_stdin(&["cp", "-", &format!("{id}:piped.bin")], &data[..1000])
        .ok();
    let piped = hub.cli(&["cp", &format!("{id}:piped.bin"), "-"]).ok();
    assert!(piped.stdout == data[..1000]);

    // A missing remote file is NOT_FOUND and leaves nothing behind.
    let missing = dir.join("missing.bin");
    assert_fails_with(
        &hub.cli(&["cp", &format!("{id}:nope.bin"), missing.to_str().unwrap()]),
        "NOT_FOUND",
    );
    assert!(!missing.exists());
}

#[test]
fn cp_directories_need_r() {
    let hub = Hub::start();
    let id = hub.sandbox();
    let src = hub.state.path().join("tree");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    std::fs::write(src.join("top.txt"), "top").unwrap();
    std::fs::write(src.join("a/b/deep.bin"), [0u8, 255, 10]).unwrap();

    let run = hub.cli(&["cp", src.to_str().unwrap(), &format!("{id}:tree")]);
    assert_fails_with(&run, "INVALID_ARGUMENT");
    assert!(
        run.stderr.contains("is a directory (use -r"),
        "{}",
        run.stderr
    );

    hub.cli(&["cp", "-r", src.to_str().unwrap(), &format!("{id}:tree")])
        .ok();
    let cat = hub.cli(&["exec", &id, "--", "cat", "tree/top.txt"]).ok();
    assert_eq!(cat.stdout(), "top");

    let run = hub.cli(&["cp", &format!("{id}:tree"), "-"]);
    assert_fails_with(&run, "INVALID_ARGUMENT");

    let back = hub.state.path().join("back");
    hub.cli(&["cp", "-r", &format!("{id}:tree"), back.to_str().unwrap()])
        .ok();
    assert_eq!(std::fs::read(back.join("top.txt")).unwrap(), b"top");
    assert_eq!(
        std::fs::read(back.join("a/b/deep.bin")).unwrap(),
        [0u8, 255, 10]
    );
}

#[test]
fn ls_shows_labels_and_rm_deletes() {
    let hub = Hub::start();
    let id = hub.sandbox();

    let table = hub.cli(&["ls", "--label", "suite=cli"]).ok().stdout();
    let row = table
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("no row for {id} in:\n{table}"));
    assert!(
        row.contains("suite=cli") && row.contains("default"),
        "{row}"
    );

    let listed = hub
        .cli(&["ls", "--output", "json", "--label", "suite=cli"])
        .ok()
        .json();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["labels"]["suite"], "cli");
    let other = hub
        .cli(&["ls", "--output", "json", "--label", "suite=other"])
        .ok()
        .json();
    assert_eq!(other, serde_json::json!([]));

    assert_eq!(hub.cli(&["rm", &id]).ok().stdout(), format!("{id}\n"));
    let after = hub.cli(&["ls", "--output", "json"]).ok().json();
    assert!(
        !after
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == id.as_str()),
        "{after}"
    );
    assert_fails_with(&hub.cli(&["rm", &id]), "NOT_FOUND");
}

#[test]
fn create_json_describes_the_sandbox() {
    let hub = Hub::start();
    let created = hub
        .cli(&[
            "create",
            "--label",
            "a=1",
            "--shutdown-after",
            "10m",
            "--output",
            "json",
        ])
        .ok()
        .json();
    assert_eq!(created["labels"]["a"], "1");
    assert_eq!(created["template"], "default");
    assert!(created["shutdown_at"].is_string(), "{created}");
    assert_eq!(created["launch"], "cold");
}

#[test]
fn shell_without_a_terminal_runs_piped_input() {
    let hub = Hub::start();
    let id = hub.sandbox();
    let run = hub.cli_with_stdin(&["shell", &id], b"echo from-$((40 + 2))\nexit 3\n");
    assert_eq!(
        run.code(),
        3,
        "stdout: {}\nstderr: {}",
        run.stdout(),
        run.stderr
    );
    assert!(run.stdout().contains("from-42"), "{}", run.stdout());
}

#[test]
fn api_keys_come_from_the_flag_or_the_env() {
    let hub = Hub::start_with_keys(Some("key-alpha-0123456789 alpha\n"));
    assert_fails_with(&hub.cli(&["ls"]), "UNAUTHENTICATED");
    assert_fails_with(&hub.cli(&["ls", "--api-key", "wrong"]), "UNAUTHENTICATED");
    let listed = hub
        .cli(&[
            "ls",
            "--api-key",
            "key-alpha-0123456789",
            "--output",
            "json",
        ])
        .ok()
        .json();
    assert_eq!(listed, serde_json::json!([]));
    let mut command = hub.command(&["template", "set", "keyed"]);
    command.env("SANDHUB_API_KEY", "key-alpha-0123456789");
    assert_eq!(run(&mut command, b"").ok().stdout(), "keyed\n");

    // The terminal's WebSocket carries the key too.
    let id = hub
        .cli(&["create", "--api-key", "key-alpha-0123456789"])
        .ok()
        .stdout()
        .trim()
        .to_string();
    let shell = hub.cli_with_stdin(
        &["shell", &id, "--api-key", "key-alpha-0123456789"],
        b"exit 4\n",
    );
    assert_eq!(shell.code(), 4, "{}", shell.stderr);
    assert_fails_with(
        &hub.cli_with_stdin(&["shell", &id], b"exit 4\n"),
        "UNAUTHENTICATED",
    );
    hub.cli(&["rm", &id, "--api-key", "key-alpha-0123456789"])
        .ok();
}

#[test]
fn exec_tty_runs_on_a_terminal() {
    let hub = Hub::start();
    let id = hub.sandbox();
    let run = hub
        .cli(&["exec", "--tty", &id, "--", "sh", "-c", "tty; stty size"])
        .ok();
    // No local terminal to measure: the remote one gets 80x24, and its
    // line discipline turns \n into \r\n.
    let out = run.stdout();
    let lines: Vec<&str> = out.split("\r\n").collect();
    assert!(lines[0].starts_with("/dev/pts/"), "{out:?}");
    assert_eq!(lines[1], "24 80", "{out:?}");
}

#[test]
fn lifecycle_verbs() {
    let hub = Hub::start();
    let id = hub.sandbox();
    hub.cli(&["exec", &id, "--", "sh", "-c", "echo kept > f"])
        .ok();

    let snapshot = hub.cli(&["snapshot", &id]).ok().stdout();
    let snapshot = snapshot.trim();
    assert!(
        !snapshot.is_empty() && !snapshot.contains(' '),
        "{snapshot:?}"
    );

    assert_eq!(
        hub.cli(&["suspend", &id]).ok().stdout(),
        format!("{id} Suspended\n")
    );
    let resumed = hub.cli(&["resume", &id, "--output", "json"]).ok().json();
    assert_eq!(resumed["state"], "Ready");
    assert_eq!(
        hub.cli(&["exec", &id, "--", "cat", "f"]).ok().stdout(),
        "kept\n"
    );
    assert_eq!(
        hub.cli(&["pause", &id]).ok().stdout(),
        format!("{id} Paused\n")
    );
    let refused = hub.cli(&["exec", &id, "--", "true"]);
    assert_ne!(refused.code(), 0);
    assert!(
        refused.stderr.contains("FAILED_PRECONDITION") && refused.stderr.contains("is Paused"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        hub.cli(&["resume", &id]).ok().stdout(),
        format!("{id} Ready\n")
    );

    let fork = hub
        .cli(&["fork", &id, "--snapshot", snapshot, "--label", "forked=yes"])
        .ok()
        .stdout();
    let fork = fork.trim();
    assert_ne!(fork, id);
    assert_eq!(
        hub.cli(&["exec", fork, "--", "cat", "f"]).ok().stdout(),
        "kept\n"
    );
    let forked = hub
        .cli(&["ls", "--label", "forked=yes", "--output", "json"])
        .ok()
        .json();
    assert_eq!(forked[0]["id"], fork);

    assert_eq!(
        hub.cli(&["reset", &id]).ok().stdout(),
        format!("{id} Ready\n")
    );
    assert_ne!(hub.cli(&["exec", &id, "--", "cat", "f"]).code(), 0);
    assert_fails_with(&hub.cli(&["suspend", "sb-nope"]), "NOT_FOUND");
}

/// `create --allow-out/--deny-out` and `network ID` carry the API's words:
/// what the hub keeps is what was typed, a widening is the hub's
/// INVALID_ARGUMENT, `--none` cuts the sandbox off. (What the gateway
/// then enforces is `hub/tests/egress_patch.rs`.)
#[test]
fn create_narrows_the_network_and_network_patches_it() {
    let hub = Hub::start();
    hub.cli(&["template", "set", "web", "--network", "egress"])
        .ok();
    let sb = hub
        .cli(&[
            "create",
            "--template",
            "web",
            "--label",
            "suite=cli",
            "--allow-out",
            "pypi.test",
            "--allow-out",
            "*.git.test:443",
            "--deny-out",
            "bad.git.test",
            "--output",
            "json",
        ])
        .ok()
        .json();
    let id = sb["id"].as_str().unwrap().to_string();
    assert_eq!(
        sb["network"],
        serde_json::json!({"mode": "egress", "allow_out": ["pypi.test", "*.git.test:443"],
               "deny_out": ["bad.git.test"]})
    );
    // No flag: shows it.
    assert_eq!(
        hub.cli(&["network", &id]).ok().stdout(),
        format!(
            "{id} {{\"mode\":\"egress\",\"allow_out\":[\"pypi.test\",\"*.git.test:443\"],\"deny_out\":[\"bad.git.test\"]}}\n"
        )
    );
    let patched = hub
        .cli(&[
            "network",
            &id,
            "--allow-out",
            "pypi.test",
            "--output",
            "json",
        ])
        .ok()
        .json();
    assert_eq!(
        patched["network"],
        serde_json::json!({"mode": "egress", "allow_out": ["pypi.test"]})
    );
    assert_eq!(
        hub.cli(&["network", &id, "--none"]).ok().stdout(),
        format!("{id} \"none\"\n")
    );
    assert_eq!(
        hub.cli(&["network", &id, "--network", "egress"])
            .ok()
            .stdout(),
        format!("{id} template\n")
    );
    // The env var is the flag's.
    let run = run(
        hub.command(&["network", &id])
            .env("SANDHUB_ALLOW_OUT", "a.test,b.test"),
        b"",
    );
    assert!(
        run.stdout().contains("[\"a.test\",\"b.test\"]"),
        "{}",
        run.stderr
    );
    // The hub's refusals, as every verb shows them.
    let widen = hub.cli(&[
        "network",
        &id,
        "--allow-out",
        "pypi.test",
        "--network",
        "host",
    ]);
    assert_fails_with(&widen, "INVALID_ARGUMENT");
    let bad = hub.cli(&["create", "--template", "web", "--allow-out", "a.*.test"]);
    assert_fails_with(&bad, "INVALID_ARGUMENT");
    assert!(bad.stderr.contains("allow_out[0]"), "{}", bad.stderr);
    assert_fails_with(&hub.cli(&["network", "sb-nope", "--none"]), "NOT_FOUND");
    // `--none` with lists is a usage error (exit 2), not a request.
    assert_eq!(
        hub.cli(&["network", &id, "--none", "--allow-out", "x.test"])
            .code(),
        2
    );
}

#[test]
fn snapshot_ls_and_rm() {
    let hub = Hub::start();
    let id = hub.sandbox();
    hub.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "head -c 300000 /dev/urandom > f",
    ])
    .ok();
    let snap = hub.cli(&["snapshot", &id]).ok().stdout().trim().to_string();
    let listed = hub
        .cli(&["snapshot", "ls", &id, "--output", "json"])
        .ok()
        .json();
    assert_eq!(listed[0]["id"], snap.as_str());
    // The layer holds the 300 kB file.
    assert!(
        listed[0]["size_bytes"].as_u64().unwrap() >= 300_000,
        "{listed}"
    );
    let table = hub.cli(&["snapshot", "ls", &id]).ok().stdout();
    assert!(table.starts_with("ID ") && table.contains(&snap), "{table}");

    // A fork stands on the snapshot: refused until the fork is gone.
    let fork = hub.cli(&["fork", &id, "--snapshot", &snap]).ok().stdout();
    assert_fails_with(&hub.cli(&["snapshot", "rm", &id, &snap]), "CONFLICT");
    hub.cli(&["rm", fork.trim()]).ok();

    assert_eq!(
        hub.cli(&["snapshot", "rm", &id, &snap]).ok().stdout(),
        format!("{snap}\n")
    );
    assert_eq!(
        hub.cli(&["snapshot", "ls", &id, "--output", "json"])
            .ok()
            .json(),
        serde_json::json!([])
    );
    assert_fails_with(&hub.cli(&["snapshot", "rm", &id, &snap]), "NOT_FOUND");
    // Usage errors exit 2: `rm` needs a snapshot, `snapshot` an id.
    assert_eq!(hub.cli(&["snapshot", "rm", &id]).code(), 2);
    assert_eq!(hub.cli(&["snapshot"]).code(), 2);
}
