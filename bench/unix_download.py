"""Downloads over sandboxd's Unix socket (the hub's local backend's path):
two sandboxd builds side by side, in alternating rounds, each on a socket of
its own and a root holding the same files.

    python3 bench/unix_download.py BASELINE_SANDBOXD NEW_SANDBOXD [ROUNDS]

Prints, per build: 256 MiB downloads (MB/s, the median and range of the
rounds, and the daemon's own CPU per download from /proc/<pid>/task/*/schedstat)
and 4 KiB downloads (µs per request, 500 in a row on one kept-alive
connection per round); then new ÷ baseline. The client is a raw socket with
one reused buffer, so its own cost stays small and equal for both.
Standard library only.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LARGE = 256 << 20
SMALL = 4096
SMALL_RUN = 500


class Daemon:
    def __init__(self, binary: str, work: Path, name: str) -> None:
        self.root = work / f"{name}-root"
        self.sockets = work / f"{name}-sockets"
        self.root.mkdir()
        self.sockets.mkdir()
        self.proc = subprocess.Popen(
            [binary, "--unix-socket", str(self.sockets), "--legacy-port", "0", "--root-dir", str(self.root)],
            stdout=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": "warn"},
        )
        self.path = str(self.sockets / "rest.sock")
        deadline = time.monotonic() + 10
        while not os.path.exists(self.path):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"{binary} did not listen on {self.path}")
            time.sleep(0.02)
        self.conn = self.connect()

    def connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX)
        s.connect(self.path)
        return s

    def cpu_ms(self) -> float:
        total = 0
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            try:
                with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except OSError:
                pass
        return total / 1e6

    def get(self, name: str, length: int, buf: memoryview) -> None:
        s = self.conn
        s.sendall(f"GET /v1/files/{name} HTTP/1.1\r\nHost: sandboxd\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(65536)
            if not chunk:
                raise SystemExit("closed before a whole head")
            head += chunk
        top, rest = head.split(b"\r\n\r\n", 1)
        if not top.startswith(b"HTTP/1.1 200 "):
            raise SystemExit(top.decode(errors="replace"))
        got = len(rest)
        while got < length:
            n = s.recv_into(buf)
            if not n:
                raise SystemExit(f"closed {got} bytes into {length}")
            got += n
        if got != length:
            raise SystemExit(f"{got} bytes, expected {length}")

    def stop(self) -> None:
        self.conn.close()
        self.proc.terminate()
        self.proc.wait(timeout=10)


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    base_bin, new_bin = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 9
    work = Path(tempfile.mkdtemp(prefix="sandhub-bench-unix-"))
    daemons: list[Daemon] = []
    try:
        daemons = [Daemon(base_bin, work, "baseline"), Daemon(new_bin, work, "new")]
        large, small = os.urandom(LARGE), os.urandom(SMALL)
        for d in daemons:
            (d.root / "large.bin").write_bytes(large)
            (d.root / "small.bin").write_bytes(small)
        del large
        buf = memoryview(bytearray(4 << 20))
        rates: list[list[float]] = [[], []]
        cpu: list[list[float]] = [[], []]
        per_request: list[list[float]] = [[], []]
        for d in daemons:
            for _ in range(100):
                d.get("small.bin", SMALL, buf)
        for r in range(rounds):
            order = [0, 1] if r % 2 == 0 else [1, 0]
            for side in order:
                d = daemons[side]
                c, t = d.cpu_ms(), time.perf_counter()
                d.get("large.bin", LARGE, buf)
                t, c = time.perf_counter() - t, d.cpu_ms() - c
                rates[side].append(LARGE / t / 1e6)
                cpu[side].append(c)
                t = time.perf_counter()
                for _ in range(SMALL_RUN):
                    d.get("small.bin", SMALL, buf)
                per_request[side].append((time.perf_counter() - t) / SMALL_RUN * 1e6)
        med = statistics.median
        print(f"load average {os.getloadavg()[0]:.2f}; {rounds} alternating rounds")
        print("| build | 256 MiB MB/s (range) | daemon CPU ms per 256 MiB | 4 KiB µs/request (range) |")
        print("| --- | --- | --- | --- |")
        for side, name in enumerate(["baseline", "new"]):
            print(
                f"| {name} | {med(rates[side]):.0f} ({min(rates[side]):.0f}–{max(rates[side]):.0f}) "
                f"| {med(cpu[side]):.1f} | {med(per_request[side]):.1f} "
                f"({min(per_request[side]):.1f}–{max(per_request[side]):.1f}) |"
            )
        print(
            f"| new ÷ baseline | {med(rates[1]) / med(rates[0]):.2f}× | {med(cpu[1]) / med(cpu[0]):.2f}× "
            f"| {med(per_request[1]) / med(per_request[0]):.2f}× |"
        )
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
