use super::*;
use crate::kube::model::TENANT_LABEL;

const SANDBOXD: &str = "sandhub/sandboxd:dev";

fn image_template() -> Template {
    Template {
        image: Some("docker.io/sandhub/test:amd64".into()),
        env: BTreeMap::from([("A".into(), "1".into())]),
        cpu: Some(0.5),
        memory_mb: Some(256),
        ..Template::default()
    }
}

#[test]
fn an_image_runs_the_copied_sandboxd_with_the_bases_arguments() {
    let t = tenant_template(
        "alice",
        "py",
        builtin_base(SANDBOXD),
        &image_template(),
        SANDBOXD,
        PullPolicy::Never,
    )
    .unwrap();
    let pod = &t.spec.blueprint.pod_template.spec;
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some("docker.io/sandhub/test:amd64"));
    assert_eq!(c.command.as_ref().unwrap(), &["/.sandhub/sandboxd"]);
    assert_eq!(c.args.as_ref().unwrap(), &["--listen-host", "0.0.0.0"]);
    assert_eq!(
        c.image_pull_policy.as_deref(),
        Some("Never"),
        "--image-pull-policy"
    );
    assert!(c.readiness_probe.is_some());
    let mounts: Vec<_> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(mounts, ["/.sandhub", "/workspace"]);
    let init = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(init.image.as_deref(), Some(SANDBOXD));
    assert_eq!(
        init.command.as_ref().unwrap()[..3],
        ["/bin/busybox", "cp", "/usr/local/bin/sandboxd"]
    );
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["cpu"].0, "500m");
    assert_eq!(limits["memory"].0, "256Mi");
    // Owned as pools are.
    assert_eq!(
        t.metadata.name.as_deref(),
        Some(owner::object_name("alice", "py").as_str())
    );
    assert!(t
        .metadata
        .labels
        .as_ref()
        .unwrap()
        .contains_key(TENANT_LABEL));
    assert_eq!(owner::hub_name(&t.metadata, "alice").as_deref(), Some("py"));
    assert_eq!(owner::hub_name(&t.metadata, "bob"), None);
    // And read back as it was written.
    assert_eq!(template_of(&t.spec, SANDBOXD), image_template());
}

#[test]
fn sidecars_join_the_pod_hardened_and_read_back() {
    let mut base = builtin_base(SANDBOXD);
    let main = &mut base.blueprint.pod_template.spec.containers[0];
    main.security_context = Some(k8s_openapi::api::core::v1::SecurityContext {
        run_as_non_root: Some(true),
        ..Default::default()
    });
    // The operator's own extra container is no tenant sidecar.
    base.blueprint.pod_template.spec.containers.push(Container {
        name: "log-shipper".into(),
        image: Some("shipper:1".into()),
        ..Default::default()
    });
    let t = Template {
        sidecars: vec![Sidecar {
            name: "grader".into(),
            image: "docker.io/sandhub/test:amd64".into(),
            command: Some(vec!["sleep".into(), "infinity".into()]),
            env: BTreeMap::from([("MODE".into(), "grade".into())]),
            cpu: Some(0.25),
            memory_mb: Some(128),
        }],
        ..image_template()
    };
    let out = tenant_template("a", "t", base, &t, SANDBOXD, PullPolicy::Never).unwrap();
    let pod_template = &out.spec.blueprint.pod_template;
    let grader = pod_template
        .spec
        .containers
        .iter()
        .find(|c| c.name == "grader")
        .unwrap();
    assert_eq!(grader.image_pull_policy.as_deref(), Some("Never"));
    assert_eq!(
        grader.security_context.as_ref().unwrap().run_as_non_root,
        Some(true)
    );
    let mounts = grader.volume_mounts.as_ref().unwrap();
    assert_eq!(
        (mounts[0].name.as_str(), mounts[0].mount_path.as_str()),
        (WORKSPACE_VOLUME, "/workspace")
    );
    assert_eq!(sidecar_names(pod_template), ["grader"]);
    assert_eq!(template_of(&out.spec, SANDBOXD), t);
}

#[test]
fn a_sidecar_never_replaces_a_container_of_the_base() {
    let mut base = builtin_base(SANDBOXD);
    base.blueprint.pod_template.spec.containers.push(Container {
        name: "log-shipper".into(),
        image: Some("shipper:1".into()),
        ..Default::default()
    });
    let t = Template {
        sidecars: vec![Sidecar {
            name: "log-shipper".into(),
            image: "mine:1".into(),
            ..Default::default()
        }],
        ..image_template()
    };
    let e = tenant_template("a", "t", base, &t, SANDBOXD, PullPolicy::IfNotPresent).unwrap_err();
    assert_eq!(e.code, sandhub_api::error::Code::InvalidArgument, "{e}");
    assert!(e.message.contains("log-shipper"), "{e}");
}

#[test]
fn a_base_command_becomes_arguments_and_placement_is_kept() {
    let mut base = builtin_base(SANDBOXD);
    let pod = &mut base.blueprint.pod_template.spec;
    pod.containers[0].command = Some(vec!["/usr/local/bin/sandboxd".into(), "--x".into()]);
    pod.runtime_class_name = Some("gvisor".into());
    pod.node_selector = Some(BTreeMap::from([("pool".into(), "sandboxes".into())]));
    let t = tenant_template(
        "a",
        "t",
        base,
        &image_template(),
        SANDBOXD,
        PullPolicy::IfNotPresent,
    )
    .unwrap();
    let pod = &t.spec.blueprint.pod_template.spec;
    assert_eq!(
        pod.containers[0].args.as_ref().unwrap(),
        &["--x", "--listen-host", "0.0.0.0"]
    );
    assert_eq!(pod.runtime_class_name.as_deref(), Some("gvisor"));
    assert!(pod.node_selector.is_some());
}

#[test]
fn workdir_is_sandboxds_default_cwd_and_reads_back() {
    let t = Template {
        workdir: Some("/srv/work".into()),
        user: Some("app".into()),
        entrypoint: Some(vec!["/srv/serve".into(), "--port=8000".into()]),
        env: [("SANDBOXD_ROOT_DIR".to_string(), "/".to_string())].into(),
        ..image_template()
    };
    let out = tenant_template(
        "alice",
        "py",
        builtin_base(SANDBOXD),
        &t,
        SANDBOXD,
        PullPolicy::IfNotPresent,
    )
    .unwrap();
    let c = &out.spec.blueprint.pod_template.spec.containers[0];
    let env: Vec<(&str, Option<&str>)> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref()))
        .collect();
    assert!(
        env.contains(&("SANDBOXD_DEFAULT_CWD", Some("/srv/work"))),
        "{env:?}"
    );
    // A tenant's env cannot reconfigure sandboxd.
    assert!(
        !env.iter().any(|(k, _)| *k == "SANDBOXD_ROOT_DIR"),
        "{env:?}"
    );
    let back = template_of(&out.spec, SANDBOXD);
    assert_eq!(back.workdir.as_deref(), Some("/srv/work"));
    assert_eq!(back.user.as_deref(), Some("app"));
    assert_eq!(back.entrypoint, t.entrypoint);
    assert!(!back.env.contains_key("SANDBOXD_DEFAULT_CWD"));
}

#[test]
fn without_an_image_the_sandboxd_image_runs_and_is_not_reported() {
    let t = Template {
        disk_mb: Some(1024),
        ..Template::default()
    };
    let out = tenant_template(
        "a",
        "t",
        builtin_base(SANDBOXD),
        &t,
        SANDBOXD,
        PullPolicy::IfNotPresent,
    )
    .unwrap();
    let pod = &out.spec.blueprint.pod_template.spec;
    assert!(pod.init_containers.is_none());
    assert_eq!(pod.containers[0].image.as_deref(), Some(SANDBOXD));
    assert_eq!(template_of(&out.spec, "docker.io/sandhub/sandboxd:dev"), t);
}

#[test]
fn local_only_fields_are_refused() {
    for t in [
        Template {
            root_fs: Some("/srv/root".into()),
            ..Template::default()
        },
        Template {
            seed_dir: Some("/srv/seed".into()),
            ..Template::default()
        },
        Template {
            pids: Some(100),
            ..Template::default()
        },
        Template {
            network: Network::Host.into(),
            ..Template::default()
        },
        Template {
            auto_resume: true,
            ..Template::default()
        },
        Template {
            idle_action: Some(sandhub_api::hub::IdleAction::Pause),
            ..Template::default()
        },
    ] {
        let e = tenant_template(
            "a",
            "t",
            builtin_base(SANDBOXD),
            &t,
            SANDBOXD,
            PullPolicy::IfNotPresent,
        )
        .unwrap_err();
        assert_eq!(e.code, sandhub_api::error::Code::InvalidArgument, "{e}");
    }
}

#[test]
fn quantities_parse() {
    assert_eq!(parse_cpu("500m"), Some(0.5));
    assert_eq!(parse_cpu("2"), Some(2.0));
    assert_eq!(parse_mib("2Gi"), Some(2048));
    assert_eq!(parse_mib("1048576"), Some(1));
    assert_eq!(parse_mib("x"), None);
}

#[test]
fn an_egress_template_labels_its_pods_and_records_its_network() {
    use crate::kube::egress::{NETWORK_ANNOTATION, NETWORK_LABEL};
    let network: sandhub_api::hub::NetworkSpec = serde_json::from_value(
        serde_json::json!({"mode": "egress", "allow_out": ["pypi.test"], "deny_out": ["bad.test"]}),
    )
    .unwrap();
    let t = Template {
        network: network.clone(),
        egress_mb: Some(7),
        ..image_template()
    };
    let st = tenant_template(
        "a",
        "web",
        builtin_base(SANDBOXD),
        &t,
        SANDBOXD,
        PullPolicy::Never,
    )
    .unwrap();
    let meta = st.spec.blueprint.pod_template.metadata.as_ref().unwrap();
    assert_eq!(meta.labels.as_ref().unwrap()[NETWORK_LABEL], "egress");
    assert!(meta.annotations.as_ref().unwrap()[NETWORK_ANNOTATION].contains("pypi.test"));
    // Read back as the tenant wrote it.
    let back = template_of(&st.spec, SANDBOXD);
    assert_eq!((back.network, back.egress_mb), (network, Some(7)));
    // `none` carries neither, even over a base that had them.
    let mut base = st.spec.clone();
    base.blueprint.pod_template.spec = builtin_base(SANDBOXD).blueprint.pod_template.spec;
    let off = tenant_template(
        "a",
        "off",
        base,
        &image_template(),
        SANDBOXD,
        PullPolicy::Never,
    )
    .unwrap();
    let meta = off.spec.blueprint.pod_template.metadata.unwrap();
    assert!(!meta.labels.unwrap_or_default().contains_key(NETWORK_LABEL));
    assert!(!meta
        .annotations
        .unwrap_or_default()
        .contains_key(NETWORK_ANNOTATION));
    // Brokered secrets: recorded (no value exists here to record), read
    // back, and the Pod mounts the proxy's CA ConfigMap.
    let with_secret = Template {
        secrets: vec![serde_json::from_value(serde_json::json!({
            "name": "OPENAI_API_KEY", "hosts": ["api.test"], "header": "Authorization"
        }))
        .unwrap()],
        ..t
    };
    let st = tenant_template(
        "a",
        "s",
        builtin_base(SANDBOXD),
        &with_secret,
        SANDBOXD,
        PullPolicy::Never,
    )
    .unwrap();
    assert_eq!(template_of(&st.spec, SANDBOXD).secrets, with_secret.secrets);
    let pod = &st.spec.blueprint.pod_template.spec;
    let ca = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == crate::kube::egress::CA_VOLUME)
        .unwrap();
    let cm = ca.config_map.as_ref().unwrap();
    assert_eq!(
        (cm.name.as_str(), cm.optional),
        (crate::kube::egress::CA_CONFIGMAP, Some(true))
    );
    let main = &pod.containers[0];
    assert!(main
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path == crate::kube::egress::CA_DIR && m.read_only == Some(true)));
    // sandboxd writes the bundle (the image's roots and the CA) into an emptyDir.
    assert!(main
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path == crate::kube::egress::BUNDLE_DIR));
    let env: BTreeMap<_, _> = main
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        env[crate::kube::egress::SANDBOXD_BUNDLE_OUT_ENV],
        crate::kube::egress::BUNDLE_FILE
    );
    assert!(
        env[crate::kube::egress::SANDBOXD_EXTRA_CA_ENV].starts_with(crate::kube::egress::CA_DIR)
    );
    // Secrets without egress: refused.
    let offline = Template {
        network: Default::default(),
        ..with_secret
    };
    let e = tenant_template(
        "a",
        "s",
        builtin_base(SANDBOXD),
        &offline,
        SANDBOXD,
        PullPolicy::Never,
    )
    .unwrap_err();
    assert_eq!(e.code, sandhub_api::error::Code::InvalidArgument, "{e}");
}

/// The claim (and its read-only flag) of each of a Pod spec's volumes.
fn claims_of(pod: &PodSpec) -> Vec<(String, Option<bool>)> {
    pod.volumes
        .iter()
        .flatten()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| (c.claim_name.clone(), c.read_only))
        .collect()
}

#[test]
fn named_volumes_are_the_tenants_own_claims_and_read_back() {
    let mount = |name: &str, path: &str, read_only| sandhub_api::volumes::VolumeMount {
        name: name.into(),
        path: path.into(),
        read_only,
    };
    let t = Template {
        volumes: vec![
            mount("data", "/workspace/data", false),
            mount("models", "/models", true),
        ],
        ..image_template()
    };
    let out = tenant_template(
        "alice",
        "t",
        builtin_base(SANDBOXD),
        &t,
        SANDBOXD,
        PullPolicy::Never,
    )
    .unwrap();
    let pod = &out.spec.blueprint.pod_template.spec;
    let claims = claims_of(pod);
    // Named through the tenant's own suffix: bob's template naming the
    // same volume gets bob's claim, never alice's.
    assert_eq!(
        claims,
        [
            (owner::object_name("alice", "data"), Some(false)),
            (owner::object_name("alice", "models"), Some(true)),
        ]
    );
    let bob = tenant_template(
        "bob",
        "t",
        builtin_base(SANDBOXD),
        &t,
        SANDBOXD,
        PullPolicy::Never,
    )
    .unwrap();
    let bobs = bob
        .spec
        .blueprint
        .pod_template
        .spec
        .volumes
        .clone()
        .unwrap();
    assert!(bobs
        .iter()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .all(|c| c.claim_name.ends_with(&owner::object_name("bob", "x")[2..])));
    let main = &pod.containers[main_container(pod).unwrap()];
    let models = main
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/models")
        .unwrap();
    assert_eq!(models.read_only, Some(true));
    assert_eq!(template_of(&out.spec, SANDBOXD), t);
    // Applied again without them: none left behind.
    let again = tenant_template(
        "alice",
        "t",
        out.spec.clone(),
        &image_template(),
        SANDBOXD,
        PullPolicy::Never,
    )
    .unwrap();
    assert!(template_of(&again.spec, SANDBOXD).volumes.is_empty());

    // A volume the operator shares: bob's template points at alice's
    // claim, read-only, and still reads back as the volume's name.
    let mut shared = bob;
    use_shared_claim(&mut shared, 1, owner::object_name("alice", "models"));
    let pod = &shared.spec.blueprint.pod_template.spec;
    let claims = claims_of(pod);
    assert_eq!(
        claims,
        [
            (owner::object_name("bob", "data"), Some(false)),
            (owner::object_name("alice", "models"), Some(true)),
        ]
    );
    assert_eq!(template_of(&shared.spec, SANDBOXD), t);
}
