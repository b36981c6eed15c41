use super::*;

#[test]
fn sidecars_and_exec_containers_are_checked() {
    use crate::hub::{Command, ExecRequest, Sidecar};
    let ok = Sidecar {
        name: "grader".into(),
        image: "x:1".into(),
        ..Default::default()
    };
    assert!(sidecars(std::slice::from_ref(&ok)).is_ok());
    let named = |name: &str| Sidecar {
        name: name.into(),
        ..ok.clone()
    };
    for bad in [
        vec![named("sandboxd")],
        vec![named("sandhub-x")],
        vec![named("Grader")],
        vec![ok.clone(), ok.clone()],
        vec![Sidecar {
            image: "a b".into(),
            ..ok.clone()
        }],
        vec![Sidecar {
            memory_mb: Some(1),
            ..ok.clone()
        }],
        vec![Sidecar {
            command: Some(vec![String::new()]),
            ..ok.clone()
        }],
        (0..5).map(|i| named(&format!("s{i}"))).collect(),
    ] {
        assert!(sidecars(&bad).is_err(), "{bad:?}");
    }
    let exec = |container: &str, cwd: &str| ExecRequest {
        command: Command::Shell("true".into()),
        env: BTreeMap::new(),
        cwd: cwd.into(),
        timeout_seconds: None,
        stdin: String::new(),
        container: Some(container.into()),
    };
    assert!(exec("grader", "").validate().is_ok());
    assert!(exec("grader", "/tmp").validate().is_err());
    assert!(exec("sandboxd", "").validate().is_err());
    assert!(exec("a/b", "").validate().is_err());
}

#[test]
fn users_are_names_or_numbers_with_an_optional_group() {
    for good in [
        "app",
        "1000",
        "1000:1000",
        "app:staff",
        "www-data",
        "user.name",
    ] {
        assert!(user(good).is_ok(), "{good}");
    }
    for bad in [
        "",
        ":",
        "a:",
        ":b",
        "a:b:c",
        "a b",
        "a\tb",
        "\u{11}x",
        "a\0",
        "a\n",
        "x:\u{7f}",
        "--root-dir=/",
        "-h",
        "app:-g",
        "-1",
    ] {
        assert!(user(bad).is_err(), "{bad:?}");
    }
    assert!(user(&"u".repeat(257)).is_err());
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn refused(r: Result<(), ErrorBody>) -> String {
    let e = r.unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    e.message
}

#[test]
fn names_are_dns_labels() {
    assert!(name("pool", "warm-1").is_ok());
    for bad in ["", "-a", "a-", "A", "a_b", &"a".repeat(64)] {
        let m = refused(name("pool", bad));
        assert!(m.starts_with(&format!("pool name `{bad}`")), "{m}");
    }
}

#[test]
fn labels_refuse_bad_characters_lengths_counts_and_reserved_prefixes() {
    assert!(labels(&map(&[("app", "web"), ("a.b/c", "x_y-z.1")])).is_ok());
    let long_value = "v".repeat(64);
    let long_key = "k".repeat(254);
    for bad in [
        map(&[("", "x")]),
        map(&[("a b", "x")]),
        map(&[("app", "a b")]),
        map(&[("app", &long_value)]),
        map(&[(&long_key, "x")]),
    ] {
        assert!(refused(labels(&bad)).contains("keys are [A-Za-z0-9-_./]"));
    }
    let m = refused(labels(&map(&[("kubernetes.io/x", "y")])));
    assert!(m.contains("are reserved"), "{m}");
    let many: BTreeMap<_, _> = (0..=MAX_LABELS)
        .map(|i| (format!("k{i}"), String::new()))
        .collect();
    assert_eq!(refused(labels(&many)), "at most 64 labels");
}

#[test]
fn env_refuses_unsettable_names_and_values() {
    assert!(env(&map(&[("PATH", "/bin"), ("EMPTY", "")])).is_ok());
    for bad in [
        map(&[("", "x")]),
        map(&[("A=B", "x")]),
        map(&[("A\0", "x")]),
        map(&[("A", "x\0")]),
    ] {
        assert!(refused(env(&bad)).contains("names must be non-empty"));
    }
}

#[test]
fn create_checks_lifetimes_first_then_labels_then_env() {
    let req = CreateSandbox {
        shutdown_after_seconds: Some(0),
        labels: map(&[("k8s.io/x", "y")]),
        env: map(&[("", "")]),
        ..Default::default()
    };
    assert!(refused(req.validate()).starts_with("shutdown_after_seconds"));
    let req = CreateSandbox {
        shutdown_after_seconds: None,
        ..req
    };
    assert!(refused(req.validate()).starts_with("label k8s.io/x"));
    let req = CreateSandbox {
        labels: BTreeMap::new(),
        ..req
    };
    assert!(refused(req.validate()).starts_with("env"));
    assert!(CreateSandbox::default().validate().is_ok());
}

#[test]
fn template_limits_name_their_range() {
    assert!(Template::default().validate().is_ok());
    let cases = [
        (
            Template {
                cpu: Some(0.01),
                ..Default::default()
            },
            "cpu must be 0.05 to 1024 cores",
        ),
        (
            Template {
                cpu: Some(f64::NAN),
                ..Default::default()
            },
            "cpu must be",
        ),
        (
            Template {
                memory_mb: Some(1),
                ..Default::default()
            },
            "memory_mb must be 32 to",
        ),
        (
            Template {
                pids: Some(1 << 40),
                ..Default::default()
            },
            "pids must be 16 to",
        ),
        (
            Template {
                disk_mb: Some(0),
                ..Default::default()
            },
            "disk_mb must be 16 to",
        ),
        (
            Template {
                env: map(&[("=", "")]),
                ..Default::default()
            },
            "env",
        ),
    ];
    for (t, want) in cases {
        let m = refused(t.validate());
        assert!(m.starts_with(want), "{m}");
    }
}

#[test]
fn pools_and_forks() {
    let spec = |replicas| PoolSpec {
        template: "t".into(),
        replicas,
    };
    assert!(spec(MAX_REPLICAS).validate().is_ok());
    assert_eq!(
        refused(spec(MAX_REPLICAS + 1).validate()),
        "replicas must be at most 1000"
    );
    let fork = ForkRequest {
        snapshot: None,
        labels: map(&[("agents.x-k8s.io/a", "b")]),
    };
    assert!(refused(fork.validate()).contains("reserved"));
}

#[test]
fn image_references() {
    for good in ["busybox", "a/b:1.0", "localhost:5000/x/y:tag", "sha256:abc"] {
        image_reference(good).unwrap();
    }
    for bad in ["", "../x", "/abs", "a b", "x:", "a//b", &"a".repeat(300)] {
        assert_eq!(
            image_reference(bad).unwrap_err().code,
            Code::InvalidArgument
        );
    }
    assert_eq!(normalize_image_reference("busybox"), "busybox:latest");
    assert_eq!(
        normalize_image_reference("host:5000/b"),
        "host:5000/b:latest"
    );
    assert_eq!(normalize_image_reference("b:1"), "b:1");
}

#[test]
fn pull_requests() {
    let req = |reference: &str| PullRequest {
        reference: reference.into(),
        ..Default::default()
    };
    req("127.0.0.1:5000/sandhub/test:latest")
        .validate()
        .unwrap();
    let id = format!("sha256:{}", "a".repeat(64));
    assert!(refused(req(&id).validate()).contains("is an image id"));
    registry_reference(&format!("x@{id}")).unwrap();
    for bad in ["../x", "a b", ""] {
        assert!(refused(req(bad).validate()).starts_with("image reference"));
    }
    // The distribution grammar, as the registry client parses it.
    for good in [
        "busybox",
        "library/busybox:1.36",
        "localhost:5000/a/b",
        "registry.example.com/team/app_x__y.z---w:v1.2-rc_3",
        "Registry.Example.com:443/a:latest",
        &format!("a/b@sha256:{}", "0f".repeat(32)),
        &format!("a:1@sha256:{}", "0f".repeat(32)),
    ] {
        registry_reference(good).unwrap();
    }
    for (bad, why) in [
        ("Busybox", "lower-case"),
        ("a/B", "lower-case"),
        ("a_-b", "lower-case"),
        ("a___b", "lower-case"),
        ("a/-b", "lower-case"),
        ("a:-x", "a tag"),
        (&format!("a:{}", "x".repeat(129)), "a tag"),
        ("a@sha256:abc", "a digest"),
        ("a@sha256", "a digest"),
        ("bad-.host/a", "registry host"),
        ("host:x/a", "registry port"),
    ] {
        let message = refused(registry_reference(bad));
        assert!(message.contains(why), "{bad}: {message}");
    }
    let tagged = |tag: &str| PullRequest {
        tag: Some(tag.into()),
        ..req("busybox")
    };
    tagged("").validate().unwrap();
    tagged("mine:1").validate().unwrap();
    refused(tagged("a b").validate());
    let creds = |username: Option<&str>, password: Option<&str>| PullRequest {
        username: username.map(Into::into),
        password: password.map(Into::into),
        ..req("busybox")
    };
    creds(Some("u"), Some("p")).validate().unwrap();
    creds(Some("u"), Some("")).validate().unwrap();
    for (u, p) in [(Some("u"), None), (None, Some("p")), (Some(""), Some("p"))] {
        assert_eq!(
            refused(creds(u, p).validate()),
            "give both username and password, or neither"
        );
    }
}

mod network {
    use super::*;

    fn spec(mode: Network, allow: &[&str], deny: &[&str]) -> NetworkSpec {
        NetworkSpec {
            mode,
            allow_out: allow.iter().map(|s| s.to_string()).collect(),
            deny_out: deny.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn message(r: Result<(), ErrorBody>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        e.message
    }

    #[test]
    fn templates_with_bad_patterns_are_400_naming_the_entry() {
        let mut t = Template {
            network: spec(Network::Egress, &["pypi.test", "a.*.test"], &[]),
            ..Default::default()
        };
        let m = message(t.validate());
        assert!(m.contains("allow_out[1] \"a.*.test\""), "{m}");
        t.network = spec(Network::Egress, &[], &["10.0.0.1/8"]);
        assert!(message(t.validate()).contains("deny_out[0] \"10.0.0.1/8\""));
        t.network = spec(Network::Egress, &["a.test:70000"], &[]);
        assert!(message(t.validate()).contains("1-65535"));
        t.network = spec(Network::Host, &["a.test"], &[]);
        assert!(message(t.validate()).contains("egress"));
        let many: Vec<String> = (0..257).map(|i| format!("h{i}.test")).collect();
        t.network = NetworkSpec {
            mode: Network::Egress,
            allow_out: many,
            deny_out: vec![],
        };
        assert!(message(t.validate()).contains("at most 256"));
        t.network = spec(
            Network::Egress,
            &["*.test", "[2001:db8::/32]:443"],
            &["x.test"],
        );
        t.validate().unwrap();
        let c = CreateSandbox {
            network: Some(spec(Network::Egress, &["*x.test"], &[])),
            ..Default::default()
        };
        assert!(message(c.validate()).contains("allow_out[0]"));
    }

    #[test]
    fn a_request_may_narrow_never_widen() {
        let tpl = spec(
            Network::Egress,
            &["*.test", "203.0.113.0/24", "api.example:443"],
            &[],
        );
        let ok = |r: NetworkSpec| narrow_network(&tpl, &r, true).unwrap();
        let widens = |r: NetworkSpec| message(narrow_network(&tpl, &r, true));
        ok(spec(Network::None, &[], &[]));
        ok(spec(Network::Egress, &[], &[]));
        ok(spec(
            Network::Egress,
            &["pypi.test", "*.a.test:443"],
            &["x.test"],
        ));
        ok(spec(
            Network::Egress,
            &["203.0.113.128/25:80", "api.example:443"],
            &[],
        ));
        assert!(widens(spec(Network::Host, &[], &[])).contains("widen"));
        assert!(widens(spec(Network::Egress, &["other.example"], &[])).contains("allow_out[0]"));
        assert!(widens(spec(Network::Egress, &["*"], &[])).contains("allow_out[0]"));
        assert!(
            widens(spec(Network::Egress, &["pypi.test", "203.0.0.0/16"], &[]))
                .contains("allow_out[1]")
        );
        assert!(widens(spec(Network::Egress, &["api.example"], &[])).contains("allow_out[0]"));
        // An offline template stays offline; a host one may go offline.
        let none = NetworkSpec::default();
        assert!(message(narrow_network(
            &none,
            &spec(Network::Egress, &[], &[]),
            true
        ))
        .contains("widen"));
        narrow_network(&spec(Network::Host, &[], &[]), &none, true).unwrap();
        // An empty template list is the operator's default.
        let open = spec(Network::Egress, &[], &[]);
        narrow_network(&open, &spec(Network::Egress, &["a.test"], &[]), true).unwrap();
        message(narrow_network(
            &open,
            &spec(Network::Egress, &["a.test"], &[]),
            false,
        ));
    }

    #[test]
    fn udp_entries_are_validated_and_never_widen() {
        let mut t = Template {
            network: spec(Network::Egress, &["pypi.test", "udp:stun.test"], &[]),
            ..Default::default()
        };
        let m = message(t.validate());
        assert!(m.contains("network.allow_out[1] \"udp:stun.test\""), "{m}");
        assert!(m.contains("needs a port"), "{m}");
        t.network = spec(Network::Egress, &[], &["udp:10.0.0.1/8:53"]);
        assert!(message(t.validate()).contains("deny_out[0]"));
        t.network = spec(
            Network::Egress,
            &[
                "udp:stun.test:3478",
                "udp:203.0.113.0/24:53",
                "udp:[2001:db8::1]:443",
            ],
            &["udp:bad.stun.test:3478"],
        );
        t.validate().unwrap();
        // The operator's default (`*`) and TCP entries cover no UDP entry;
        // a `udp:` template entry covers narrower `udp:` ones only.
        let open = spec(Network::Egress, &[], &[]);
        let udp = spec(Network::Egress, &["udp:stun.test:3478"], &[]);
        assert!(message(narrow_network(&open, &udp, true)).contains("allow_out[0]"));
        let tpl = spec(Network::Egress, &["*.test", "udp:*.test:3478"], &[]);
        narrow_network(&tpl, &udp, true).unwrap();
        narrow_network(&tpl, &spec(Network::Egress, &["stun.test:3478"], &[]), true).unwrap();
        let other_port = spec(Network::Egress, &["udp:stun.test:3479"], &[]);
        assert!(message(narrow_network(&tpl, &other_port, true)).contains("allow_out[0]"));
        // Secrets go over TLS: a `udp:` host is refused, naming it.
        let e = secret_hosts("secrets[0] \"K\"", &["udp:api.test:443".into()]).unwrap_err();
        assert!(
            e.message.contains("hosts[0]") && e.message.contains("udp"),
            "{}",
            e.message
        );
    }
}

#[test]
fn volume_mounts_are_absolute_normalized_and_shadow_nothing() {
    use crate::volumes::{VolumeMount, MAX_VOLUME_MOUNTS};
    let m = |name: &str, path: &str| VolumeMount {
        name: name.into(),
        path: path.into(),
        read_only: false,
    };
    for ok in [
        vec![],
        vec![m("data", "/workspace/data")],
        vec![m("data", "/data"), m("data", "/mnt/ro")],
        vec![m("a", "/workspace/a"), m("b", "/workspace/ab")],
        vec![m("a", "/procedures"), m("b", "/devices")],
    ] {
        assert!(super::volume_mounts(&ok).is_ok(), "{ok:?}");
    }
    for (bad, says) in [
        (vec![m("data", "workspace/data")], "absolute"),
        (vec![m("data", "/")], "root"),
        (vec![m("data", "/workspace/../etc")], "normalized"),
        (vec![m("data", "/workspace/./x")], "normalized"),
        (vec![m("data", "/workspace//x")], "normalized"),
        (vec![m("data", "/workspace/x/")], "normalized"),
        (vec![m("data", "/work\nspace")], "normalized"),
        (vec![m("data", "/proc")], "/proc"),
        (vec![m("data", "/proc/sys")], "/proc"),
        (vec![m("data", "/dev")], "/dev"),
        (vec![m("data", "/dev/shm")], "/dev"),
        (vec![m("data", "/sys")], "/sys"),
        (vec![m("data", "/.sandhub/overlay")], "/.sandhub"),
        (vec![m("data", "/workspace")], "below /workspace"),
        (vec![m("Data", "/data")], "DNS-1123"),
        (
            vec![m("a", "/data"), m("b", "/data")],
            "overlaps volumes[0]",
        ),
        (
            vec![m("a", "/data"), m("b", "/data/x")],
            "overlaps volumes[0]",
        ),
        (
            vec![m("a", "/data/x"), m("b", "/data")],
            "overlaps volumes[0]",
        ),
        (vec![m("a", &format!("/{}", "x".repeat(300)))], "at most"),
        (
            (0..=MAX_VOLUME_MOUNTS)
                .map(|i| m("a", &format!("/v{i}")))
                .collect(),
            "at most",
        ),
    ] {
        let e = super::volume_mounts(&bad).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains(says), "{bad:?}: {}", e.message);
    }
}
