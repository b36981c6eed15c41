"""A stand-in for PyPI, for commands that `pip install` from a sandbox of the
`default` template (which is online: `network: egress`) without the real internet.

A network namespace of its own holds a DNS server that answers `pypi.org` and
`files.pythonhosted.org` with 198.18.0.2, and an HTTPS server there (a certificate of a
test CA made here) with a PEP 503 simple index of hand-made pure-Python wheels. It is
joined by a veth pair to the caller's network namespace (198.18.0.1/24 on that side),
never to the host's. Processes that should see it as "the internet" run under
`wrap()`: a private mount namespace in which `/etc/resolv.conf` names the stand-in DNS
server and the system CA bundle holds the test CA too, which is how a hub started there
(its egress gateway's resolver, the sandboxes' copy of `/etc`) and pip inside its
sandboxes find and trust it. Every request the HTTPS server answers is logged.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import TracebackType

SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
NAMES = ("pypi.org", "files.pythonhosted.org")
SERVER_ADDR = "198.18.0.2"
CLIENT_ADDR = "198.18.0.1"

# Runs inside the stand-in's namespace: DNS on :53 (UDP), HTTPS on :443; prints "ready".
SERVER = r"""
import functools, http.server, socket, ssl, sys, threading

www, cert, key, log_path = sys.argv[1:5]
names = set(sys.argv[5:])
addr = bytes(int(x) for x in "198.18.0.2".split("."))

def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("198.18.0.2", 53))
    while True:
        q, peer = s.recvfrom(1500)
        try:
            i, labels = 12, []
            while q[i]:
                labels.append(q[i + 1:i + 1 + q[i]].decode().lower())
                i += 1 + q[i]
            qtype = int.from_bytes(q[i + 1:i + 3], "big")
            question = q[12:i + 5]
        except (IndexError, UnicodeDecodeError):
            continue
        name = ".".join(labels)
        known, a = name in names, qtype == 1 and name in names
        flags = b"\x81\x80" if known else b"\x81\x83"
        answer = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + addr if a else b""
        s.sendto(q[:2] + flags + b"\x00\x01" + (b"\x00\x01" if a else b"\x00\x00") + b"\x00\x00\x00\x00"
                 + question + answer, peer)

threading.Thread(target=dns, daemon=True).start()
log = open(log_path, "a", buffering=1)

class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, fmt, *args):
        log.write(self.headers.get("Host", "") + " " + self.path + "\n")

srv = http.server.ThreadingHTTPServer(("198.18.0.2", 443), functools.partial(Handler, directory=www))
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print("ready", flush=True)
srv.serve_forever()
"""


def _run(*argv: str) -> None:
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {out.stderr}")


def _digest(b: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()


def write_wheel(packages: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of module `name` (whose `__version__` is `version`)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: sandhub-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},sha256={_digest(b)},{len(b)}\n" for n, b in files.items())
    files[f"{dist}/RECORD"] = (record + f"{dist}/RECORD,,\n").encode()
    path = packages / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, b in files.items():
            z.writestr(n, b)
    return path


class StandInPyPI:
    """The stand-in, joined to the network namespace `client_netns` (a path such as
    `/proc/PID/ns/net`); its files live under `tmp`. Use as a context manager."""

    def __init__(self, tmp: Path, client_netns: str, packages: dict[str, str]) -> None:
        self.dir = tmp / "pypi"
        self.client_netns = client_netns
        self.packages = packages
        self.ns = f"shpypi{os.getpid() % 100000}"
        self.server: subprocess.Popen[str] | None = None

    @property
    def bundle(self) -> Path:
        return self.dir / "ca-certificates.crt"

    @property
    def resolv_conf(self) -> Path:
        return self.dir / "resolv.conf"

    def requests(self) -> str:
        log = self.dir / "requests.log"
        return log.read_text() if log.exists() else ""

    def wrap(self) -> list[str]:
        """argv prefix: a private mount namespace that sees the stand-in as the internet."""
        script = (
            f"mount --bind {self.resolv_conf} /etc/resolv.conf && "
            f"mount --bind {self.bundle} {SYSTEM_BUNDLE} && exec \"$@\""
        )
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"]

    def __enter__(self) -> StandInPyPI:
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()

    def _certificates(self) -> tuple[Path, Path]:
        d = self.dir
        ca_key, ca, key, csr, cert, ext = (d / n for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem", "ext.cnf"))
        _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
             "-days", "2", "-subj", "/CN=sandhub stand-in PyPI CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
             "-subj", f"/CN={NAMES[0]}")
        ext.write_text(
            "subjectAltName=" + ",".join(f"DNS:{n}" for n in NAMES) + "\nbasicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        )
        _run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "2", "-extfile", str(ext))
        self.bundle.write_bytes(SYSTEM_BUNDLE.read_bytes() + b"\n" + ca.read_bytes())
        return cert, key

    def _index(self) -> Path:
        www = self.dir / "www"
        packages = www / "packages"
        packages.mkdir(parents=True)
        links = []
        for name, version in self.packages.items():
            wheel = write_wheel(packages, name, version)
            sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
            page = www / "simple" / name
            page.mkdir(parents=True)
            # As PyPI: the files on files.pythonhosted.org.
            href = f"https://{NAMES[1]}/packages/{wheel.name}#sha256={sha}"
            (page / "index.html").write_text(f'<!DOCTYPE html><html><body><a href="{href}">{wheel.name}</a></body></html>\n')
            links.append(f'<a href="{name}/">{name}</a>')
        (www / "simple" / "index.html").write_text("<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>\n")
        return www

    def _start(self) -> None:
        self.dir.mkdir(parents=True)
        self.resolv_conf.write_text(f"nameserver {SERVER_ADDR}\n")
        cert, key = self._certificates()
        www = self._index()
        ns, here, there = self.ns, f"{self.ns}a", f"{self.ns}b"
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # a killed run's leftover
        _run("ip", "netns", "add", ns)
        client = ["nsenter", f"--net={self.client_netns}", "--"]
        _run(*client, "ip", "link", "add", here, "type", "veth", "peer", "name", there, "netns", ns)
        _run(*client, "ip", "addr", "add", f"{CLIENT_ADDR}/24", "dev", here)
        _run(*client, "ip", "link", "set", here, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", ns, "addr", "add", f"{SERVER_ADDR}/24", "dev", there)
        _run("ip", "-n", ns, "link", "set", there, "up")
        # `ip netns exec` execs the program: the child is the server.
        self.server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", SERVER, str(www), str(cert), str(key),
             str(self.dir / "requests.log"), *NAMES],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
        )
        assert self.server.stdout is not None
        line = self.server.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"the stand-in PyPI did not start (said {line!r})")

    def _stop(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()
            self.server = None
        # The veth pair goes with the namespace.
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
