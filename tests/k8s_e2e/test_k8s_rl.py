"""Issue #18 on the real cluster: the RL fleet (sandhub-rl) against the kubernetes hub,
Pods on the real node. One episode runs a task image end to end; a task whose image the
node lacks fails at once through the Pod's ErrImageNeverPull (the hub runs with
`--image-pull-policy Never`, as on nodes fed only by pre-pull), not at the ready timeout;
an image name kubelet cannot parse fails at once through InvalidImageName; a grading
sidecar running the task's own image (`{task_image}`) sees the agent's workspace and
takes `exec(container=...)`; and the fleet's pre-pull runs the hub's DaemonSets on the
node."""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests
import sandhub

from sandhub_rl import (
    TASK_IMAGE,
    FailFastPolicy,
    FleetConfig,
    ResourceSpec,
    SandboxFleet,
    SandboxStartError,
    SidecarSpec,
    Task,
    TemplateSpec,
    prepull,
)
from sandhub_testing import stop_process, wait_for
from sandhub_testing.hub_k8s import POOL, Cluster, import_layout_image
from sandhub_testing.registry import TEST_IMAGE_AMD64, test_image_layout

TEST_IMAGE = "docker.io/sandhub/test:amd64"
ABSENT_IMAGE = "docker.io/sandhub/absent-from-the-node:1"
READY_TIMEOUT = 180  # the hub's default --ready-timeout
TIMEOUT = 240


@pytest.fixture(scope="module")
def url(cluster: Cluster):
    import_layout_image(cluster, test_image_layout(), TEST_IMAGE_AMD64, TEST_IMAGE)
    hub, url = cluster.start_hub("--base-template", POOL, "--image-pull-policy", "Never")
    try:
        yield url
    finally:
        stop_process(hub)


def _claims_of(cluster: Cluster, fleet: SandboxFleet) -> list[str]:
    selector = ",".join(f"{k}={v}" for k, v in fleet.labels.items())
    return [c["metadata"]["name"] for c in cluster.claims(selector)]


def test_one_episode_on_the_real_node(cluster: Cluster, url: str):
    hub = sandhub.Hub(url, timeout=TIMEOUT)
    fleet = SandboxFleet(hub, FleetConfig(
        ready_timeout_s=TIMEOUT, resources=ResourceSpec(cpu_limit=1, memory_limit="512Mi")))
    task = Task(id="astropy-1", image=TEST_IMAGE, files={"repo/solve.py": "print(6 * 7)\n"},
                setup=("test -f /workspace/repo/solve.py",))
    t0 = time.monotonic()
    with fleet.episode(task) as h:
        print(f"acquired a sandbox of {TEST_IMAGE} in {time.monotonic() - t0:.1f}s")
        pod = cluster.core.read_namespaced_pod(cluster.pod_of(h.sandbox_id), cluster.ns)
        assert pod.spec.node_name == "localhost", pod.spec.node_name
        (main,) = pod.spec.containers
        assert main.image == TEST_IMAGE and main.image_pull_policy == "Never", main
        assert h.exec("python3 /workspace/repo/solve.py").stdout == "42\n"
        assert "app:x:1000" in h.exec("cat /etc/passwd").stdout  # the task image's own files
        reward = 1.0 if h.exec("python3 /workspace/repo/solve.py | grep -qx 42").exit_code == 0 else 0.0
        assert h.is_alive()
    assert reward == 1.0
    assert fleet.stats.acquired == 1 and fleet.stats.released == 1
    report = fleet.teardown(verify=True)
    assert report.clean, report
    assert hub.list(fleet.labels) == []
    wait_for("the episode's claim to go", lambda: not _claims_of(cluster, fleet), timeout=60)


def test_an_image_the_node_lacks_fails_fast_through_err_image_never_pull(cluster: Cluster, url: str):
    # The hub's own answer: FAILED_PRECONDITION with the Pod's reason, the claim deleted.
    r = requests.put(f"{url}/v1/templates/absent", json={"image": ABSENT_IMAGE}, timeout=60)
    assert r.status_code == 200, r.text
    # On Kubernetes a sandbox is a claim on a pool: an empty one starts it cold.
    r = requests.put(f"{url}/v1/pools/absent", json={"template": "absent", "replicas": 0}, timeout=60)
    assert r.status_code == 200, r.text
    t0 = time.monotonic()
    r = requests.post(f"{url}/v1/sandboxes", json={"template": "absent", "labels": {"probe": "never-pull"}},
                      timeout=TIMEOUT)
    took = time.monotonic() - t0
    assert r.status_code == 412 and r.json()["code"] == "FAILED_PRECONDITION", r.text
    assert "failed to start: ErrImageNeverPull" in r.json()["message"], r.text
    assert took < READY_TIMEOUT / 3, took
    print(f"ErrImageNeverPull answered in {took:.1f}s (ready timeout {READY_TIMEOUT}s)")
    left = requests.get(f"{url}/v1/sandboxes", params={"labels": "probe=never-pull"}, timeout=60)
    assert left.status_code == 200 and left.json()["sandboxes"] == [], left.text
    assert requests.delete(f"{url}/v1/pools/absent", timeout=60).status_code == 204
    assert requests.delete(f"{url}/v1/templates/absent", timeout=60).status_code == 204

    # The fleet's verdict: image_not_found, not retried for its grace.
    hub = sandhub.Hub(url, timeout=TIMEOUT)
    fleet = SandboxFleet(hub, FleetConfig(ready_timeout_s=TIMEOUT, fail_fast=FailFastPolicy(grace_s=120)))
    t0 = time.monotonic()
    with pytest.raises(SandboxStartError) as info:
        fleet.acquire(Task(id="ghost", image=ABSENT_IMAGE))
    took = time.monotonic() - t0
    err = info.value
    assert err.cause == "image_not_found" and not err.retryable, err
    assert "ErrImageNeverPull" in err.message and err.task_id == "ghost"
    assert took < READY_TIMEOUT / 3 and fleet.stats.start_retries == 0, (took, fleet.stats)
    wait_for("the failed claim to go", lambda: not _claims_of(cluster, fleet), timeout=60)
    assert fleet.teardown(verify=True).clean


def test_a_create_whose_caller_hangs_up_still_deletes_its_claim_that_cannot_start(cluster: Cluster, url: str):
    """A create runs to its end without its caller: the claim whose Pod cannot start
    (ErrImageNeverPull) is deleted as when the caller waits. Before, a caller that hung up
    while the hub waited for Ready left that claim behind for good, holding its Pod."""
    assert requests.put(f"{url}/v1/templates/absent-hangup", json={"image": ABSENT_IMAGE},
                        timeout=60).status_code == 200
    assert requests.put(f"{url}/v1/pools/absent-hangup", json={"template": "absent-hangup", "replicas": 0},
                        timeout=60).status_code == 200

    def claims() -> list[str]:
        return [c["metadata"]["name"] for c in cluster.claims("probe=hang-up")]

    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(f"{url}/v1/sandboxes", json={"template": "absent-hangup", "labels": {"probe": "hang-up"}},
                      timeout=(10, 0.5))
    # The hub made the claim before the caller went (its Pod needs seconds to fail) ...
    wait_for("the claim to be made", lambda: claims() != [], timeout=30, every=0.05)
    # ... and deletes it once the Pod says it cannot start, though nobody waits for the answer.
    wait_for("the claim to go", lambda: claims() == [], timeout=READY_TIMEOUT / 3)
    left = requests.get(f"{url}/v1/sandboxes", params={"labels": "probe=hang-up"}, timeout=60)
    assert left.status_code == 200 and left.json()["sandboxes"] == [], left.text
    assert requests.delete(f"{url}/v1/pools/absent-hangup", timeout=60).status_code == 204
    assert requests.delete(f"{url}/v1/templates/absent-hangup", timeout=60).status_code == 204


def test_a_gym_env_whose_creator_hangs_up_is_closed_with_its_sandbox(cluster: Cluster, url: str):
    """An env create runs to its end without its caller, and an env whose creator never learnt
    its id is closed with its sandbox as soon as it is made: nobody else can use it. Before, it
    was recorded and held its Pod until its idle timeout; and before that, its sandbox was left
    behind with no env to close it."""
    assert requests.put(f"{url}/v1/templates/gym-cold", json={"image": TEST_IMAGE},
                        timeout=60).status_code == 200
    # An empty pool: the env's sandbox starts cold, seconds on the real node.
    assert requests.put(f"{url}/v1/pools/gym-cold", json={"template": "gym-cold", "replicas": 0},
                        timeout=60).status_code == 200

    def claims() -> list[dict[str, Any]]:
        return cluster.claims("sandhub.dev/gym-env")

    def listed() -> set[str]:
        r = requests.get(f"{url}/gym/v1/envs", timeout=60)
        assert r.status_code == 200, r.text
        return {e["env_id"] for e in r.json()["envs"]}

    before = {c["metadata"]["name"] for c in claims()}
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(f"{url}/gym/v1/envs", json={"pool": "gym-cold"}, timeout=(10, 0.5))
    claim = wait_for("the env's claim", lambda: [c for c in claims() if c["metadata"]["name"] not in before],
                     timeout=60, every=0.05)[0]
    env = claim["metadata"]["labels"]["sandhub.dev/gym-env"]
    name = claim["metadata"]["name"]
    # The sandbox starts, the env is made, and then closed with it, though nobody asks.
    wait_for("the env's claim to go", lambda: all(c["metadata"]["name"] != name for c in claims()),
             timeout=TIMEOUT + 120)
    assert env not in listed()
    r = requests.delete(f"{url}/gym/v1/envs/{env}", timeout=60)
    assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND", r.text
    # A creator that waits keeps its env.
    r = requests.post(f"{url}/gym/v1/envs", json={"pool": "gym-cold"}, timeout=TIMEOUT)
    assert r.status_code == 201, r.text
    kept = r.json()["env_id"]
    assert kept in listed()
    assert requests.delete(f"{url}/gym/v1/envs/{kept}", timeout=60).status_code == 204
    assert requests.delete(f"{url}/v1/pools/gym-cold", timeout=60).status_code == 204
    assert requests.delete(f"{url}/v1/templates/gym-cold", timeout=60).status_code == 204


def test_an_invalid_image_name_fails_fast_through_invalid_image_name(cluster: Cluster, url: str):
    """The kubernetes hub passes image names to the cluster as given; kubelet refuses one
    it cannot parse (InvalidImageName) and the hub ends the create on that at once."""
    hub = sandhub.Hub(url, timeout=TIMEOUT)
    fleet = SandboxFleet(hub, FleetConfig(ready_timeout_s=TIMEOUT, fail_fast=FailFastPolicy(grace_s=120)))
    t0 = time.monotonic()
    with pytest.raises(SandboxStartError) as info:
        fleet.acquire(Task(id="bad", image="Upper/Case:1"))
    took = time.monotonic() - t0
    print(f"InvalidImageName answered in {took:.1f}s")
    err = info.value
    assert err.cause == "invalid_image" and not err.retryable and "InvalidImageName" in err.message, err
    assert took < READY_TIMEOUT / 3 and fleet.stats.start_retries == 0, (took, fleet.stats)
    wait_for("the failed claim to go", lambda: not _claims_of(cluster, fleet), timeout=60)
    assert fleet.teardown(verify=True).clean


def test_the_fleets_prepull_runs_on_the_node(cluster: Cluster, url: str):
    hub = sandhub.Hub(url, timeout=TIMEOUT)
    tasks = [Task(id=f"t{i}", image=TEST_IMAGE) for i in range(3)]
    result = prepull(hub, tasks, template=POOL)
    assert result.ok, result
    assert [i.reference for i in result.images] == [TEST_IMAGE]
    wait_for("the pre-pull DaemonSets to be gone", lambda: not cluster.apps.list_namespaced_daemon_set(
        cluster.ns, label_selector="sandhub.io/prepull").items, timeout=60)


def test_a_grading_sidecar_of_the_task_image_grades_the_workspace(cluster: Cluster, url: str):
    # A PID 1 that ends on SIGTERM: `sleep` alone would hold the Pod's deletion
    # for its whole grace period.
    waits = ("sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait")
    grader = SidecarSpec("grader", TASK_IMAGE, command=waits,
                         resources=ResourceSpec(cpu_limit="250m", memory_limit="128Mi"))
    spec = TemplateSpec(resources=ResourceSpec(cpu_limit=1, memory_limit="512Mi"), sidecars=(grader,))
    hub = sandhub.Hub(url, timeout=TIMEOUT)
    fleet = SandboxFleet(hub, FleetConfig(ready_timeout_s=TIMEOUT, template=spec))
    with fleet.episode(Task(id="graded", image=TEST_IMAGE)) as h:
        assert h.target_container is None
        pod = cluster.core.read_namespaced_pod(cluster.pod_of(h.sandbox_id), cluster.ns)
        containers = {c.name: c for c in pod.spec.containers}
        assert set(containers) == {"sandboxd", "grader"}, containers
        assert containers["grader"].image == TEST_IMAGE
        assert containers["grader"].resources.limits == {"cpu": "250m", "memory": "128Mi"}
        # The agent works in the sandbox's own container; the grader sees its workspace.
        assert h.exec("printf 'print(6 * 7)\\n' > /workspace/solve.py").exit_code == 0
        graded = h.exec(["python3", "/workspace/solve.py"], container="grader")
        assert (graded.exit_code, graded.stdout) == (0, "42\n"), graded
        assert h.exec("exit 3", container="grader").exit_code == 3
        assert h.exec(["cat"], container="grader", stdin="piped").stdout == "piped"
        # Only the template's sidecars, and no env or cwd there.
        with pytest.raises(sandhub.InvalidArgumentError, match="no sidecar db"):
            h.exec("true", container="db")
        with pytest.raises(sandhub.InvalidArgumentError):
            h.exec("true", container="sandboxd")
        with pytest.raises(sandhub.InvalidArgumentError, match="env and cwd"):
            h.exec("true", container="grader", cwd="/tmp")
        timed = h.exec("sleep 30", container="grader", timeout=1)
        assert timed.timed_out, timed
    # The hub shows the sidecar as it was put.
    (name,) = set(fleet._core._templates.values())
    assert hub.templates.get(name).spec["sidecars"] == [
        {"name": "grader", "image": TEST_IMAGE, "command": list(waits), "cpu": 0.25, "memory_mb": 128}]
    assert fleet.teardown(verify=True).clean


def test_an_entrypoint_that_exits_at_start_fails_fast_on_kubernetes_too(cluster: Cluster, url: str):
    """sandboxd records its entrypoint child on Kubernetes as it does locally; the hub's
    GET carries it, and the fleet fails a sandbox whose entrypoint exited non-zero."""
    hub = sandhub.Hub(url, timeout=TIMEOUT)
    crashing = TemplateSpec(extra_template_spec={"entrypoint": ["sh", "-c", "sleep 0.3; exit 3"]})
    fleet = SandboxFleet(hub, FleetConfig(ready_timeout_s=TIMEOUT, template=crashing,
                                          fail_fast=FailFastPolicy(settle_s=2.0)))
    with pytest.raises(SandboxStartError) as info:
        fleet.acquire(Task(id="crash", image=TEST_IMAGE))
    assert info.value.cause == "exited_at_start" and "exited 3" in info.value.message, info.value
    assert fleet.teardown(verify=True).clean

    serving = TemplateSpec(extra_template_spec={"entrypoint": ["sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait"]})
    fleet = SandboxFleet(hub, FleetConfig(ready_timeout_s=TIMEOUT, template=serving))
    with fleet.episode(Task(id="serves", image=TEST_IMAGE)) as h:
        ep = h.sandbox.refresh().entrypoint
        assert ep is not None and ep.state == "Running" and ep.running_seconds >= 0, ep
    assert fleet.teardown(verify=True).clean
