"""Issue #27 on the real cluster: `network: egress` through `sandhub egress-proxy`.

A hub and the proxy (the real binaries) run against the test cluster; the egress sandbox
is a real Pod on the real node. The test's "internet" is a network namespace this test
makes, joined to the host by a veth pair (198.18.0.1 host side, 198.18.0.2 inside, where
an HTTP server answers), under the cross-process lock the Rust tests take for the same
addresses; the proxy's resolver is a DNS responder of the test on loopback. Nothing is
sent anywhere else.

What is proven where: the test cluster enforces no NetworkPolicy, so for "a Pod that
ignores the proxy cannot connect" only the objects are asserted (the Pod carries the
label the shipped policy selects, and the policy admits DNS and the proxy only). The
proxy's enforcement is proven by driving requests through it: from inside the Pod with its
own environment (busybox wget), and from the test with the Pod's credential.

Brokered secrets: the test internet also serves HTTPS (a certificate of the test's own CA
for `api.test` and `plain.test`, which the proxy trusts through --egress-ca-file). The
value goes in with `PUT /v1/secrets`, lives in the tenant's Secret, and must reach the
server in the named header while the Pod, its claim and its files hold only the
placeholder; a host that is not the secret's gets the placeholder.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import os
import secrets
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
import yaml
from kubernetes import utils

from sandhub_testing import stop_process, wait_for
from sandhub_testing.binaries import binary
from sandhub_testing.hub_k8s import EXT, POOL, Cluster
from sandhub_testing.net import LOOPBACK, free_port

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 240
HOST_SIDE, INSIDE = "198.18.0.1", "198.18.0.2"
# The real node's CNI bridge address (dev/k8s/real-node.sh): the host as its Pods reach it,
# so the proxy listens there for the Pod's own requests.
CNI_GATEWAY = "10.88.0.1"
HTTP_PORT = 8080
HTTPS_PORT = 8443
# The Service the hub asks for counters (not `sandhub-egress`: the manifests' dry run
# creates that name in the same namespace).
PROXY_SERVICE = "sandhub-egress-test"
NAMES = {"allowed.test": INSIDE, "denied.test": INSIDE, "rebind.test": "127.0.0.1",
         "api.test": INSIDE, "plain.test": INSIDE}

SERVER = f"""
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("seen " + self.path).encode()
        if self.path.startswith("/bytes/"):
            body = b"x" * min(int(self.path[7:]), 1 << 24)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
import hashlib, ssl, sys, threading
class T(http.server.BaseHTTPRequestHandler):
    # What the server saw in Authorization: as sent, and its digest (the proxy masks
    # an echoed secret value, so the digest is what proves the value arrived).
    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        body = (auth + "\\n" + hashlib.sha256(auth.encode()).hexdigest()).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
tls = http.server.ThreadingHTTPServer(("{INSIDE}", {HTTPS_PORT}), T)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
http.server.ThreadingHTTPServer(("{INSIDE}", {HTTP_PORT}), H).serve_forever()
"""


def make_pki(dir: Path) -> tuple[Path, Path, Path]:
    """The test internet's CA and a server certificate for api.test and plain.test:
    (ca.pem, cert.pem, key.pem)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandhub test internet CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "api.test")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("api.test"), x509.DNSName("plain.test")]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = (dir / "ca.pem", dir / "cert.pem", dir / "key.pem")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def internet(pki: tuple[Path, Path, Path]) -> Iterator[str]:
    """The test's own internet; yields the namespace name."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a network namespace and a veth pair)")
    lock = open("/run/sandhub-test-internet.lock", "a")
    fcntl.flock(lock, fcntl.LOCK_EX)
    tag = secrets.token_hex(3)
    ns, veth, peer = f"shk8s-{tag}", f"shk8s{tag}", f"shk8p{tag}"
    server = None
    try:
        ip("netns", "add", ns)
        ip("link", "add", veth, "type", "veth", "peer", "name", peer, "netns", ns)
        ip("addr", "add", f"{HOST_SIDE}/24", "dev", veth)
        ip("link", "set", veth, "up")
        ip("-n", ns, "addr", "add", f"{INSIDE}/24", "dev", peer)
        ip("-n", ns, "link", "set", peer, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SERVER,
                                   str(pki[1]), str(pki[2])])

        def up() -> bool:
            for p in (HTTP_PORT, HTTPS_PORT):
                with socket.create_connection((INSIDE, p), timeout=1):
                    pass
            return True

        wait_for("the test internet's HTTP server", up, timeout=20)
        yield ns
    finally:
        if server is not None:
            stop_process(server)
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def dns_answer(query: bytes) -> bytes | None:
    """An `A` answer for NAMES, NXDOMAIN otherwise (one question, no compression in)."""
    if len(query) < 12:
        return None
    qid = query[:2]
    labels, i = [], 12
    while i < len(query) and query[i] != 0:
        n = query[i]
        labels.append(query[i + 1:i + 1 + n].decode(errors="replace"))
        i += 1 + n
    question = query[12:i + 5]
    name = ".".join(labels).lower()
    addr = NAMES.get(name)
    if addr is None:
        return qid + b"\x81\x83\x00\x01\x00\x00\x00\x00\x00\x00" + question
    answer = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x01\x00\x04" + socket.inet_aton(addr)
    return qid + b"\x81\x80\x00\x01\x00\x01\x00\x00\x00\x00" + question + answer


@pytest.fixture(scope="module")
def resolver() -> Iterator[int]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((LOOPBACK, 0))
    s.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                msg, peer = s.recvfrom(1500)
            except OSError:
                continue
            a = dns_answer(msg)
            if a:
                s.sendto(a, peer)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield s.getsockname()[1]
    stop.set()
    t.join()
    s.close()


@pytest.fixture(scope="module")
def stack(cluster: Cluster, internet: str, resolver: int,
          pki: tuple[Path, Path, Path]) -> Iterator[tuple[str, int, int]]:
    """The proxy and a hub that points Pods at it; yields (hub URL, proxy port, metrics port)."""
    port, metrics = free_port(), free_port()
    proxy = cluster.spawn("egress-proxy", [
        str(binary("sandhub")), "egress-proxy",
        # Metrics where the hub asks for counters (the EndpointSlice below names it).
        "--listen", f"{CNI_GATEWAY}:{port}", "--metrics-listen", f"{CNI_GATEWAY}:{metrics}",
        "--kubeconfig", cluster.kubeconfig, "--namespace", cluster.ns,
        "--sandboxd-token-key-file", str(cluster.token_key_file),
        "--egress-dns", f"{LOOPBACK}:{resolver}",
        # The test internet's HTTPS server is signed by the test's own CA.
        "--egress-ca-file", str(pki[0]),
    ])

    def healthy() -> bool:
        if proxy.poll() is not None:
            raise AssertionError(f"egress-proxy exited; see {cluster.logs}/egress-proxy.log")
        with urllib.request.urlopen(f"http://{CNI_GATEWAY}:{metrics}/healthz", timeout=2) as r:
            return bool(r.status == 200)

    wait_for("the egress proxy", healthy, timeout=30)
    # The proxy runs on the host here, not as Pods: its Service's EndpointSlice (what the hub
    # asks for a sandbox's counters) is written by hand, naming it on the CNI bridge.
    utils.create_from_dict(cluster.api, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": PROXY_SERVICE},
        "spec": {"ports": [{"name": "proxy", "port": 3128}, {"name": "metrics", "port": 9464}]}},
        namespace=cluster.ns)
    utils.create_from_dict(cluster.api, {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "sandhub-egress-test",
                     "labels": {"kubernetes.io/service-name": PROXY_SERVICE}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [CNI_GATEWAY], "conditions": {"ready": True}}],
        "ports": [{"name": "proxy", "port": port, "protocol": "TCP"},
                  {"name": "metrics", "port": metrics, "protocol": "TCP"}]}, namespace=cluster.ns)
    hub, url = cluster.start_hub("--base-template", POOL, "--egress-proxy", f"{CNI_GATEWAY}:{port}",
                                 "--egress-proxy-service", PROXY_SERVICE)
    try:
        yield url, port, metrics
    finally:
        stop_process(hub)
        stop_process(proxy)


def ok(r: requests.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json() if r.content else {}


def credential(cluster: Cluster, sid: str) -> str:
    """As api/src/sandboxd_token.rs derives it (the proxy's own domain)."""
    key = cluster.token_key_file.read_bytes().rstrip()
    msg = b"".join(p + b"\0" for p in (b"sandhub-egress-proxy/v1", cluster.ns.encode(), sid.encode()))
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def test_an_egress_pod_gets_its_proxy_and_the_proxy_enforces_its_policy(
    cluster: Cluster, stack: tuple[str, int, int]
) -> None:
    url, port, metrics = stack
    network = {"mode": "egress", "allow_out": ["allowed.test", "denied.test", "rebind.test"],
               "deny_out": ["denied.test"]}
    put = ok(requests.put(f"{url}/v1/templates/webx", json={"network": network}, timeout=60))
    assert put["network"] == network, put
    # Secrets need egress: refused on an offline template, not ignored.
    r = requests.put(f"{url}/v1/templates/withsecret", timeout=60, json={
        "network": "none",
        "secrets": [{"name": "K", "hosts": ["allowed.test"], "header": "Authorization"}]})
    assert r.status_code == 400 and "secrets" in r.json()["message"], r.text
    ok(requests.put(f"{url}/v1/pools/webx", json={"template": "webx", "replicas": 1}, timeout=60))
    sb = ok(requests.post(f"{url}/v1/sandboxes", json={
        "pool": "webx", "network": {"mode": "egress", "allow_out": ["allowed.test", "rebind.test"]}},
        timeout=TIMEOUT), 201)
    sid = sb["id"]
    assert sb["network"] == {"mode": "egress", "allow_out": ["allowed.test", "rebind.test"]}, sb

    # The objects: the template labels its Pods, the claim records the policy, the Pod
    # has the proxy environment with its own credential (never its sandboxd token).
    (tpl,) = [t for t in cluster.custom.list_namespaced_custom_object(*EXT, cluster.ns, "sandboxtemplates")["items"]
              if t["metadata"]["name"].startswith("webx-")]
    assert tpl["spec"]["podTemplate"]["metadata"]["labels"]["sandhub.io/network"] == "egress"
    claim = cluster.claim(sid)
    assert "allowed.test" in claim["metadata"]["annotations"]["sandhub.io/egress-policy"]
    pod = cluster.core.read_namespaced_pod(cluster.pod_of(sid), cluster.ns)
    assert pod.metadata.labels["sandhub.io/network"] == "egress"
    env = {e.name: e.value for e in pod.spec.containers[0].env or []}
    cred = credential(cluster, sid)
    proxy_url = f"http://{sid}:{cred}@{CNI_GATEWAY}:{port}"
    assert env["HTTP_PROXY"] == env["http_proxy"] == env["HTTPS_PROXY"] == proxy_url, env
    assert env["ALL_PROXY"] == f"socks5h://{sid}:{cred}@{CNI_GATEWAY}:{port}"
    assert env["NO_PROXY"] == "localhost,127.0.0.1,::1"
    assert cluster.sandboxd_token(pod.metadata.name) not in str(env)
    # The shipped policy selects this Pod and lets it reach DNS and the proxy only; the
    # apiserver takes it as it is (a dry run; the test cluster would not enforce it).
    shipped = yaml.safe_load((REPO / "deploy/egress/sandbox-networkpolicy.yaml").read_text())
    utils.create_from_dict(cluster.api, shipped, namespace=cluster.ns, dry_run="All")
    sel = shipped["spec"]["podSelector"]["matchLabels"]
    assert all(pod.metadata.labels.get(k) == v for k, v in sel.items())
    assert shipped["spec"]["policyTypes"] == ["Egress"]
    peers = [p for rule in shipped["spec"]["egress"] for p in rule["to"]]
    assert [p["podSelector"]["matchLabels"] for p in peers] == [
        {"k8s-app": "kube-dns"}, {"app.kubernetes.io/name": "sandhub-egress"}]

    # From inside the Pod: its own environment takes a plain HTTP client (busybox wget)
    # through the proxy to the allowed host; the denied one gets the proxy's 403.
    def run(*argv: str) -> Any:
        return ok(requests.post(f"{url}/v1/sandboxes/{sid}/exec", json={"command": list(argv)}, timeout=60))

    out = run("/bin/busybox", "wget", "-q", "-O", "-", f"http://allowed.test:{HTTP_PORT}/from-the-pod")
    assert out["exit_code"] == 0 and out["stdout"] == "seen /from-the-pod", out
    out = run("/bin/busybox", "wget", "-q", "-O", "-", f"http://denied.test:{HTTP_PORT}/")
    assert out["exit_code"] != 0 and "403" in out["stderr"], out

    # The rest from the test, with the Pod's own credential.
    via = {"http": env["HTTP_PROXY"]}
    r = requests.get(f"http://allowed.test:{HTTP_PORT}/pkg", proxies=via, timeout=30)
    assert r.status_code == 200 and r.text == "seen /pkg", r.text
    with socket.create_connection((CNI_GATEWAY, port), timeout=30) as s:
        auth = base64.b64encode(f"{sid}:{cred}".encode()).decode()
        s.sendall(f"CONNECT allowed.test:{HTTP_PORT} HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
        assert s.recv(1024).startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /tunnel HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        assert got.endswith(b"seen /tunnel"), got
    # Denied by the template (deny wins), outside the sandbox's narrowing, rebinding to
    # loopback: each refused with its reason.
    for host, why in [("denied.test", "deny_out"), ("rebind.test", "always-closed")]:
        r = requests.get(f"http://{host}:{HTTP_PORT}/", proxies=via, timeout=30)
        assert r.status_code == 403 and why in r.text, (host, r.text)
    bad = {"http": f"http://{sid}:{'0' * 64}@{CNI_GATEWAY}:{port}"}
    assert requests.get(f"http://allowed.test:{HTTP_PORT}/", proxies=bad, timeout=30).status_code == 407

    # PATCH .../network applies to the next connection (a watch event away).
    patched = ok(requests.patch(f"{url}/v1/sandboxes/{sid}/network", json={"mode": "none"}, timeout=60))
    assert patched["network"] == "none", patched

    def closed() -> bool:
        r = requests.get(f"http://allowed.test:{HTTP_PORT}/", proxies=via, timeout=30)
        return r.status_code == 403

    wait_for("the proxy to follow the PATCH", closed, timeout=30)
    r = requests.patch(f"{url}/v1/sandboxes/{sid}/network", json={"allow_out": ["example.org"]}, timeout=60)
    assert r.status_code == 400, r.text

    # Metered, by tenant.
    text = requests.get(f"http://{CNI_GATEWAY}:{metrics}/metrics", timeout=10).text
    opened = [line for line in text.splitlines() if line.startswith("sandhub_egress_connections_opened_total{")]
    assert opened and int(opened[0].rsplit(" ", 1)[1]) >= 3, text
    requests.delete(f"{url}/v1/sandboxes/{sid}", timeout=60)


def test_a_secret_reaches_its_host_in_its_header_and_never_the_pod(
    cluster: Cluster, stack: tuple[str, int, int], pki: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    url, port, _ = stack
    value = "sk-" + secrets.token_hex(16)
    # The value goes in write-only and lives in the tenant's Secret (labelled for the proxy).
    info = ok(requests.put(f"{url}/v1/secrets/API_KEY", json={"value": value}, timeout=60))
    assert info["name"] == "API_KEY" and info["source"] == "tenant" and value not in str(info), info
    listed = ok(requests.get(f"{url}/v1/secrets", timeout=60))
    assert [s["name"] for s in listed["secrets"]] == ["API_KEY"] and value not in str(listed)
    stored = cluster.core.list_namespaced_secret(cluster.ns, label_selector="sandhub.io/secrets=tenant").items
    assert len(stored) == 1 and base64.b64decode(stored[0].data["API_KEY"]).decode() == value
    network = {"mode": "egress", "allow_out": ["api.test", "plain.test"]}
    spec = {"name": "API_KEY", "hosts": [f"api.test:{HTTPS_PORT}"], "header": "Authorization",
            "format": "Bearer {value}"}
    tpl = ok(requests.put(f"{url}/v1/templates/brokered", json={"network": network, "secrets": [spec]},
                          timeout=60))
    assert tpl["secrets"][0]["name"] == "API_KEY", tpl
    ok(requests.put(f"{url}/v1/pools/brokered", json={"template": "brokered", "replicas": 0}, timeout=60))
    # A secret without a value is refused at create, naming it.
    r = requests.post(f"{url}/v1/sandboxes", timeout=TIMEOUT, json={
        "pool": "brokered", "secrets": [{"name": "NOPE", "hosts": ["api.test"], "header": "X-Key"}]})
    assert r.json()["code"] == "FAILED_PRECONDITION" and "NOPE" in r.text, r.text
    sid = ok(requests.post(f"{url}/v1/sandboxes", json={"pool": "brokered"}, timeout=TIMEOUT), 201)["id"]
    try:
        pod = cluster.core.read_namespaced_pod(cluster.pod_of(sid), cluster.ns)
        env = {e.name: e.value for e in pod.spec.containers[0].env or []}
        placeholder = env["API_KEY"]
        assert placeholder.startswith("sandhub-secret-"), env
        bundle = "/etc/sandhub/ca-bundle/ca-bundle.crt"
        assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == env["CURL_CA_BUNDLE"] == bundle, env
        assert env["NODE_EXTRA_CA_CERTS"] == "/etc/sandhub/egress-ca/ca.crt"
        # The value is nowhere the Pod or its objects can show it.
        claim = cluster.claim(sid)
        assert placeholder in claim["metadata"]["annotations"]["sandhub.io/egress-policy"]
        for what, text in [("pod", str(cluster.api.sanitize_for_serialization(pod))), ("claim", str(claim))]:
            assert value not in text, what

        def run(*argv: str) -> Any:
            return ok(requests.post(f"{url}/v1/sandboxes/{sid}/exec", json={"command": list(argv)}, timeout=60))

        out = run("/bin/busybox", "sh", "-c", "env; cat /proc/1/environ")
        assert out["exit_code"] == 0 and placeholder in out["stdout"] and value not in out["stdout"], out
        out = run("/bin/busybox", "grep", "-rl", value, "/etc", "/tmp", "/workspace", "/root")
        assert out["exit_code"] == 1 and out["stdout"] == "", out
        # The Pod mounts the proxy's CA, as the proxy published it (no key in it), and its
        # sandboxd wrote the bundle: the image's own roots (this image has none), then the CA.
        cm = cluster.core.read_namespaced_config_map("sandhub-egress-ca", cluster.ns)
        assert list(cm.data) == ["ca.crt"] and "PRIVATE KEY" not in str(cm.data)
        out = run("/bin/busybox", "cat", "/etc/sandhub/egress-ca/ca.crt")
        assert out["stdout"] == cm.data["ca.crt"], out
        roots = run("/bin/busybox", "sh", "-c", "cat /etc/ssl/certs/ca-certificates.crt "
                    "/etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem 2>/dev/null; true")["stdout"]
        assert run("/bin/busybox", "cat", bundle)["stdout"] == (
            roots.rstrip() + "\n" if roots.strip() else "") + cm.data["ca.crt"]

        # Through the proxy with the Pod's own credential and environment: the secret's
        # host sees the value in the named header (its digest; the answer's echo is masked),
        # over TLS the Pod's bundle verifies.
        ca_file = tmp_path / "pod-ca.crt"
        ca_file.write_text(cm.data["ca.crt"])
        via = {"https": env["HTTPS_PROXY"]}
        r = requests.get(f"https://api.test:{HTTPS_PORT}/brokered", proxies=via, verify=str(ca_file),
                         headers={"Authorization": f"Bearer {placeholder}"}, timeout=30)
        assert r.status_code == 200, r.text
        echoed, digest = r.text.split("\n")
        assert digest == hashlib.sha256(f"Bearer {value}".encode()).hexdigest(), r.text
        assert value not in r.text and placeholder not in echoed, r.text
        # Another host (not the secret's): the tunnel is the server's own TLS, and the
        # server sees the placeholder as the workload wrote it.
        r = requests.get(f"https://plain.test:{HTTPS_PORT}/plain", proxies=via, verify=str(pki[0]),
                         headers={"Authorization": f"Bearer {placeholder}"}, timeout=30)
        assert r.status_code == 200 and r.text.split("\n")[0] == f"Bearer {placeholder}", r.text
        # Deleted: the next connection carries the placeholder, never a stale value.
        assert requests.delete(f"{url}/v1/secrets/API_KEY", timeout=60).status_code == 204

        def gone() -> bool:
            r = requests.get(f"https://plain.test:{HTTPS_PORT}/", proxies=via, verify=str(pki[0]), timeout=30)
            r2 = requests.get(f"https://api.test:{HTTPS_PORT}/", proxies=via, verify=str(pki[0]),
                              headers={"Authorization": f"Bearer {placeholder}"}, timeout=30)
            return r.status_code == 200 and r2.text.split("\n")[0] == f"Bearer {placeholder}"

        wait_for("the proxy to follow the deleted value", gone, timeout=30)
        assert requests.get(f"{url}/v1/secrets", timeout=60).json()["secrets"] == []
    finally:
        requests.delete(f"{url}/v1/sandboxes/{sid}", timeout=60)


def test_the_hub_shows_what_the_proxy_counted_and_the_cap_refuses(
    cluster: Cluster, stack: tuple[str, int, int]
) -> None:
    url, port, _ = stack
    network = {"mode": "egress", "allow_out": ["allowed.test"]}
    ok(requests.put(f"{url}/v1/templates/metered", json={"network": network, "egress_mb": 1}, timeout=60))
    ok(requests.put(f"{url}/v1/pools/metered", json={"template": "metered", "replicas": 0}, timeout=60))
    sid = ok(requests.post(f"{url}/v1/sandboxes", json={"pool": "metered"}, timeout=TIMEOUT), 201)["id"]
    try:
        cred = credential(cluster, sid)
        size = 600_000

        def download() -> tuple[int, int]:
            """A CONNECT tunnel carrying one plain request: (bytes sent, bytes received)."""
            req = (f"GET /bytes/{size} HTTP/1.1\r\nHost: allowed.test\r\n"
                   "Connection: close\r\n\r\n").encode()
            with socket.create_connection((CNI_GATEWAY, port), timeout=30) as s:
                auth = base64.b64encode(f"{sid}:{cred}".encode()).decode()
                s.sendall(f"CONNECT allowed.test:{HTTP_PORT} HTTP/1.1\r\n"
                          f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode())
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    head += s.recv(1)
                assert head.startswith(b"HTTP/1.1 200"), head
                s.sendall(req)
                got = b""
                while chunk := s.recv(65536):
                    got += chunk
            assert got.endswith(b"x" * 100) and len(got) > size, len(got)
            return len(req), len(got)

        sent, received = download()

        # The hub asks the proxy (every replica its Service lists) and shows the payload
        # bytes exactly: what the client wrote into the tunnel and what it read from it.
        def counted() -> Any:
            sb = ok(requests.get(f"{url}/v1/sandboxes/{sid}", timeout=30))
            return sb if (sb.get("egress") or {}).get("bytes_in") == received else None

        sb = wait_for("the hub to show the proxy's count", counted, timeout=30)
        assert sb["egress"] == {"bytes_out": sent, "bytes_in": received,
                                "connections_opened": 1, "connections_refused": 0}, sb
        log = ok(requests.get(f"{url}/v1/sandboxes/{sid}/egress", timeout=30))["decisions"]
        assert [(d["name"], d["port"], d["allowed"], d["bytes_out"], d["bytes_in"]) for d in log] == [
            ("allowed.test", HTTP_PORT, True, sent, received)], log

        # egress_mb 1: a second download passes the cap (checked as each connection opens),
        # the next connection is refused with its reason, and the log says so.
        download()
        via = {"http": f"http://{sid}:{cred}@{CNI_GATEWAY}:{port}"}
        r = requests.get(f"http://allowed.test:{HTTP_PORT}/", proxies=via, timeout=30)
        assert r.status_code == 403 and "egress_mb" in r.text, r.text
        log = ok(requests.get(f"{url}/v1/sandboxes/{sid}/egress", timeout=30))["decisions"]
        assert [d["allowed"] for d in log] == [True, True, False], log
        assert "egress_mb" in log[-1]["reason"], log
        usage = ok(requests.get(f"{url}/v1/sandboxes/{sid}", timeout=30))["egress"]
        assert usage["connections_refused"] == 1 and usage["bytes_in"] > 1 << 20, usage
        # Another tenant's hub call sees nothing of it; a sandbox without egress has no log.
        assert requests.get(f"{url}/v1/sandboxes/sb-nope/egress", timeout=30).status_code == 404
    finally:
        requests.delete(f"{url}/v1/sandboxes/{sid}", timeout=60)


def test_the_egress_manifests_pass_a_server_side_dry_run(cluster: Cluster) -> None:
    deploy = REPO / "deploy" / "egress"
    kinds = []
    for name in yaml.safe_load((deploy / "kustomization.yaml").read_text())["resources"]:
        for doc in yaml.safe_load_all((deploy / name).read_text()):
            if doc:
                utils.create_from_dict(cluster.api, doc, namespace=cluster.ns, dry_run="All")
                kinds.append(doc["kind"])
    assert sorted(kinds) == ["Deployment", "NetworkPolicy", "NetworkPolicy", "Role", "RoleBinding",
                             "Service", "ServiceAccount"]
    role = yaml.safe_load_all((deploy / "rbac.yaml").read_text())
    (rules,) = [d["rules"] for d in role if d and d["kind"] == "Role"]
    # Reads claims (never writes a policy); reads Secrets (values, its CA) and may create
    # one (the CA), never update or delete; writes only its own ConfigMap by name.
    assert rules == [
        {"apiGroups": ["extensions.agents.x-k8s.io"], "resources": ["sandboxclaims"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch", "create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["sandhub-egress-ca"],
         "verbs": ["get", "update"]},
    ]
