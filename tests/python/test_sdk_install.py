"""`pip install ./python` into a fresh venv, then `import sandhub`, and
`mypy --strict` on a sample file using the public API."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_fresh_venv_pip_install(tmp_path: Path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = dict(os.environ)
    # The dev profile reuses the test run's compiled dependencies (a release
    # build, pip's default, is minutes of LTO on a small machine); the
    # build itself is what a user's `pip install ./python` runs.
    env.setdefault("MATURIN_PEP517_ARGS", "--profile dev")
    proc = subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(REPO / "python")],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = subprocess.run(
        [str(py), "-c", "import sandhub; print(sandhub.__version__, sandhub.Hub.__doc__ is not None)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.split()
    assert out[1] == "True"
    assert out[0] == _workspace_version()


def _workspace_version() -> str:
    text = (REPO / "Cargo.toml").read_text()
    section = text.split("[workspace.package]", 1)[1]
    for line in section.splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError("no workspace version")


SAMPLE = '''
    from __future__ import annotations

    import asyncio

    import sandhub


    def sync_use(hub: sandhub.Hub) -> int:
        with hub.create(labels={"a": "b"}) as sb:
            r: sandhub.CommandResult = sb.commands.run(["true"], timeout=5.0)
            h: sandhub.ProcessHandle = sb.commands.start("echo hi")
            for ev in h.events():
                if isinstance(ev, sandhub.ProcessOutputEvent):
                    print(ev.data.decode())
                else:
                    print(ev.exit_code, ev.signal)
            sb.files.write("x", b"1", mode=0o600)
            data: bytes = sb.files.read("x")
            entries: list[sandhub.FileEntry] = sb.files.list(".")
            with sb.watcher.watch(".") as w:
                for batch in w:
                    _ = [e.path for e in batch]
                    break
            snap: sandhub.Snapshot = sb.snapshot()
            child: sandhub.Sandbox = sb.fork(snapshot=snap)
            child.delete()
            env = hub.gym.make(max_episode_steps=3)
            obs, info = env.reset(seed=1)
            step: sandhub.StepResult = env.step("ls")
            env.close()
            pools: list[sandhub.Pool] = hub.pools.list()
            return r.exit_code + len(data) + len(entries) + len(pools) + int(step.reward)


    async def async_use(hub: sandhub.AsyncHub) -> str:
        async with await hub.create() as sb:
            r = await sb.commands.run("echo hi")
            h = await sb.commands.start("echo hi")
            async for ev in h.events():
                _ = ev
            await sb.files.write("y", "text")
            return r.stdout + await sb.files.read_text("y")


    def direct(d: sandhub.Sandboxd) -> dict[str, object]:
        try:
            d.commands.run("true")
        except sandhub.UnavailableError as e:
            print(e.code, e.message, e.status)
        return d.health()


    if __name__ == "__main__":
        print(sync_use(sandhub.Hub()), asyncio.run(async_use(sandhub.AsyncHub())))
'''


def test_mypy_strict_accepts_a_sample(tmp_path: Path):
    mypy = shutil.which("mypy") or str(Path(sys.executable).parent / "mypy")
    if not Path(mypy).exists():
        pytest.skip("mypy is not installed (scripts/test-deps.sh installs it)")
    sample = tmp_path / "sample.py"
    sample.write_text(textwrap.dedent(SAMPLE))
    proc = subprocess.run(
        [mypy, "--strict", "--no-incremental", str(sample)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
