"""The fleet's pure parts: configuration checks, fail-fast verdicts, the
names the fleet and the reaper agree on (no hub needed)."""

from __future__ import annotations

import pickle

import pytest
import sandhub

from sandhub_rl import FailFastPolicy, FleetConfig, ResourceSpec, SandboxLostError, SandboxStartError, new_run_id
from sandhub_rl import naming
from sandhub_rl.failfast import StartVerdict, backoff, classify_entrypoint, classify_error, classify_state, should_retry


def test_resource_spec_reads_kubernetes_quantities() -> None:
    assert ResourceSpec(cpu_limit="500m", memory_limit="512Mi").template_fields() == {"cpu": 0.5, "memory_mb": 512}
    assert ResourceSpec(cpu_limit=2, memory_limit="2Gi", disk_mb=1024, pids=64).template_fields() == {
        "cpu": 2.0, "memory_mb": 2048, "disk_mb": 1024, "pids": 64,
    }
    assert ResourceSpec(memory_limit="1G").template_fields() == {"memory_mb": 954}
    assert ResourceSpec(memory_limit=300).template_fields() == {"memory_mb": 300}
    for bad in ({"cpu_limit": "lots"}, {"cpu_limit": -1}, {"memory_limit": "12Qi"}, {"memory_limit": "0"},
                {"disk_mb": 0}, {"pids": True}, {"cpu_limit": float("nan")}):
        with pytest.raises(ValueError):
            ResourceSpec(**bad)  # type: ignore[arg-type]


def test_fleet_config_checks() -> None:
    run = new_run_id()
    assert run.startswith("rl-") and FleetConfig(run_id=run).run_id == run
    assert FleetConfig().run_id != FleetConfig().run_id
    for bad in ({"run_id": "has space"}, {"run_id": "x" * 64}, {"warm_per_template": -1},
                {"ready_timeout_s": 0}, {"shutdown_after_s": 0}, {"extra_template_spec": {"image": "x"}}):
        with pytest.raises(ValueError):
            FleetConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        FailFastPolicy(grace_s=-1)
    with pytest.raises(ValueError):
        FailFastPolicy(unschedulable_grace_s=float("inf"))


@pytest.mark.parametrize(
    ("exc", "stage", "cause", "kind"),
    [
        (sandhub.NotFoundError("no image `x` in the store"), "template", "image_not_found", "fatal"),
        (sandhub.InvalidArgumentError("image reference `-x` must be"), "template", "invalid_image", "fatal"),
        (sandhub.InvalidArgumentError("memory_mb must be 32 to"), "template", "invalid_template", "fatal"),
        (sandhub.NotFoundError("template t not found"), "create", "template_not_found", "fatal"),
        (sandhub.ResourceExhaustedError("tenant quota"), "create", "unschedulable", "unschedulable"),
        (sandhub.UnavailableError("connection refused"), "create", "unavailable", "retry"),
        (sandhub.InternalError("boom"), "template", "unavailable", "retry"),
        (sandhub.PermissionDeniedError("no"), "create", "permission_denied", "fatal"),
        (sandhub.NotFoundError("gone"), "wait", "lost_at_start", "retry"),
        (sandhub.FailedPreconditionError("is Finished"), "wait", "exited_at_start", "fatal"),
        (RuntimeError("bug"), "create", "client_error", "fatal"),
        (sandhub.FailedPreconditionError("sandbox sb-1 failed to start: sandboxd: unknown user"), "create", "start_failed", "retry"),
        (sandhub.UnavailableError("sandbox sb-1 failed to start: the sandbox exited before it was ready (log: x)"),
         "create", "exited_at_start", "fatal"),
    ],
)
def test_classify_error(exc: BaseException, stage: str, cause: str, kind: str) -> None:
    verdict = classify_error(exc, stage)  # type: ignore[arg-type]
    assert (verdict.cause, verdict.kind) == (cause, kind)


def test_classify_state() -> None:
    assert classify_state("Ready") is None and classify_state("Pending") is None
    assert classify_state("Finished") == StartVerdict("exited_at_start", "fatal", classify_state("Finished").message)  # type: ignore[union-attr]
    assert classify_state("Expired").kind == "fatal"  # type: ignore[union-attr]


def test_should_retry_follows_the_policy() -> None:
    policy = FailFastPolicy(grace_s=5, unschedulable_grace_s=20)
    fatal, retry, unsched = (StartVerdict("c", k) for k in ("fatal", "retry", "unschedulable"))
    assert not should_retry(fatal, policy, 0.0, 300)
    assert should_retry(retry, policy, 4.9, 300) and not should_retry(retry, policy, 5.0, 300)
    assert should_retry(unsched, policy, 19.9, 300) and not should_retry(unsched, policy, 20.0, 300)
    assert not should_retry(unsched, policy, 10, 10)  # the ready timeout bounds every grace
    off = FailFastPolicy(enabled=False)
    assert should_retry(fatal, off, 100, 300) and not should_retry(fatal, off, 300, 300)
    assert [backoff(policy, n) for n in (1, 2, 3)] == [0.05, 0.1, 0.2] and backoff(policy, 99) == 2.0


def test_names_round_trip() -> None:
    name = naming.pool_name("rl-run-1", "rl-img-0123456789abcdef", now=1_800_000_000)
    assert len(name) <= 63 and name.startswith(naming.POOL_PREFIX)
    assert naming.parse_pool_name(name) == (naming.run_hash("rl-run-1"), 1_800_000_000.0)
    assert naming.parse_pool_name("default") is None and naming.parse_pool_name("rlp-xyz") is None
    spec = {"image": "a:1", "memory_mb": 256}
    assert naming.image_template_name(spec) == naming.image_template_name(dict(reversed(spec.items())))
    assert naming.image_template_name(spec) != naming.image_template_name({**spec, "memory_mb": 512})
    labels = naming.sandbox_labels("run", "django__django-1", {"team": "x", naming.RUN_LABEL: "spoof"})
    assert labels == {"team": "x", naming.MANAGED_LABEL: "true", naming.RUN_LABEL: "run", naming.TASK_LABEL: "django__django-1"}
    assert naming.TASK_LABEL not in naming.sandbox_labels("run", "repo@" + "f" * 40)  # does not fit a label


def test_fleet_errors_pickle_and_subclass_the_sdk() -> None:
    lost = SandboxLostError("gone", sandbox_id="sb-1", task_id="t")
    assert isinstance(lost, sandhub.SandboxLostError) and isinstance(lost, sandhub.NotFoundError)
    back = pickle.loads(pickle.dumps(lost))
    assert (back.sandbox_id, back.task_id, str(back)) == ("sb-1", "t", str(lost))
    start = SandboxStartError("no image", cause="image_not_found", task_id="t", sandbox_id=None)
    back2 = pickle.loads(pickle.dumps(start))
    assert (back2.cause, back2.task_id, back2.retryable) == ("image_not_found", "t", False)


def test_entrypoint_verdicts() -> None:
    ep = sandhub.EntrypointStatus
    assert classify_entrypoint(None, 0.5) == 0.0
    assert classify_entrypoint(ep("Completed", exit_code=0), 0.5) == 0.0
    assert classify_entrypoint(ep("Running", running_seconds=0.2), 0.5) == pytest.approx(0.3)
    assert classify_entrypoint(ep("Running", running_seconds=9.0), 0.5) == 0.0
    oom = classify_entrypoint(ep("OOMKilled", signal=9), 0.5)
    assert isinstance(oom, StartVerdict) and (oom.cause, oom.kind) == ("oom_at_start", "fatal")
    crash = classify_entrypoint(ep("Error", exit_code=3), 0.5)
    assert isinstance(crash, StartVerdict) and crash.cause == "exited_at_start" and "exited 3" in crash.message
    killed = classify_entrypoint(ep("Error", signal=15), 0.5)
    assert isinstance(killed, StartVerdict) and "signal 15" in killed.message
    gone = classify_entrypoint(ep("StartError", message="No such file"), 0.5)
    assert isinstance(gone, StartVerdict) and gone.cause == "entrypoint_not_started"
    assert ep("OOMKilled").failed and not ep("Completed").failed and not ep("Running").failed
    with pytest.raises(ValueError):
        FailFastPolicy(settle_s=-1)


@pytest.mark.parametrize(
    ("exc", "cause", "kind"),
    [
        (sandhub.FailedPreconditionError("sandbox sb-1 failed to start: ErrImageNeverPull: container sandboxd: not present"),
         "image_not_found", "fatal"),
        (sandhub.FailedPreconditionError("sandbox sb-1 failed to start: InvalidImageName: container sandboxd: bad"),
         "invalid_image", "fatal"),
        (sandhub.FailedPreconditionError("sandbox sb-1 failed to start: OOMKilled: container sandboxd OOMKilled"),
         "oom_at_start", "fatal"),
        (sandhub.FailedPreconditionError("sandbox sb-1 failed to start: ExitedAtStart: container sandboxd Error"),
         "exited_at_start", "fatal"),
        (sandhub.UnavailableError("sandbox sb-1 was not Ready within 180s: ImagePullBackOff: container x: back-off"),
         "image_pull_backoff", "retry"),
        (sandhub.UnavailableError("sandbox sb-1 was not Ready within 180s: CreateContainerConfigError: no cm"),
         "config_error", "retry"),
        (sandhub.UnavailableError("sandbox sb-1 was not Ready within 180s: CrashLoopBackOff: container x: back-off"),
         "crash_loop", "retry"),
        (sandhub.UnavailableError("sandbox sb-1 was not Ready within 180s: Unschedulable: 0/1 nodes"),
         "unschedulable", "unschedulable"),
        # no reason word: as before
        (sandhub.UnavailableError("sandbox sb-1 was not Ready within 180s"), "unavailable", "retry"),
    ],
)
def test_kubernetes_pod_reasons(exc: Exception, cause: str, kind: str) -> None:
    verdict = classify_error(exc, "create")
    assert (verdict.cause, verdict.kind) == (cause, kind), verdict


def test_template_spec_fills_the_task_image_into_sidecars() -> None:
    from sandhub_rl import TASK_IMAGE, SidecarSpec, TemplateSpec
    from sandhub_rl._core import image_template_spec

    grader = SidecarSpec("grader", TASK_IMAGE, command=("sh", "-c", "echo {task_image}; sleep infinity"),
                         env={"MODE": "grade"}, resources=ResourceSpec(cpu_limit="250m", memory_limit="128Mi"))
    spec = TemplateSpec(resources=ResourceSpec(memory_limit=512), extra_template_spec={"env": {"A": "1"}},
                        sidecars=[grader], target_container="grader")
    assert spec.template_fields("swe/task:1") == {
        "env": {"A": "1"}, "memory_mb": 512, "image": "swe/task:1",
        "sidecars": [{"name": "grader", "image": "swe/task:1", "command": ["sh", "-c", "echo swe/task:1; sleep infinity"],
                      "env": {"MODE": "grade"}, "cpu": 0.25, "memory_mb": 128}],
    }
    assert image_template_spec("x:1", FleetConfig(template=spec))["sidecars"][0]["image"] == "x:1"
    # the shorthand fields make the same spec
    assert image_template_spec("x:1", FleetConfig(resources=ResourceSpec(memory_limit=64))) == {"memory_mb": 64, "image": "x:1"}
    for bad in (lambda: SidecarSpec("Bad_Name", "x"), lambda: SidecarSpec("sandboxd", "x"),
                lambda: SidecarSpec("ok", ""), lambda: TemplateSpec(sidecars=(grader, grader)),
                lambda: TemplateSpec(target_container="nope"), lambda: TemplateSpec(extra_template_spec={"sidecars": []}),
                lambda: FleetConfig(template=spec, resources=ResourceSpec(memory_limit=64))):
        with pytest.raises(ValueError):
            bad()
    with pytest.raises(ValueError, match="names a template"):
        grader.template_fields(None)


def test_fake_fleet_targets_the_template_specs_container() -> None:
    from sandhub_rl import SidecarSpec, TemplateSpec, Task
    from sandhub_rl.testing import FakeFleet

    spec = TemplateSpec(sidecars=(SidecarSpec("grader", "{task_image}"),), target_container="grader")
    fleet = FakeFleet(None, FleetConfig(template=spec))
    h = fleet.acquire(Task(id="t", image="swe/task:1"))
    assert h.target_container == "grader"
    h.exec("true")
    h.exec("true", container="grader")
    with pytest.raises(sandhub.InvalidArgumentError):
        h.exec("true", container="db")
    assert h.execs == ["[grader] true", "[grader] true"]
    fleet.release(h)
