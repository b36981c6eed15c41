"""The web console (issue #31) in a real browser: Debian's chromium, driven
by Playwright for Python, against a real `sandhub serve` on the local
backend with two tenants' keys.

Everything the console does goes through the public API, so each test acts
in the page (click, type, drop) and checks the outcome through the API or in
the sandbox itself. A screenshot of each view is saved under
`$SANDHUB_TEST_ARTIFACTS/console/` (default `target/test-artifacts/console/`);
docs/console.md shows them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import sandhub
from sandhub_testing import REPO_ROOT, Hub, binary, need, start_hub, stop_hub, wait_for

ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef00"
CAROL = "carol-key-0123456789abcdef"
HOSTILE_LABEL = "<img src=x onerror=alert(1)>"
HOSTILE_FILE = '"><script>alert(3)<img src=x onerror=alert(3)>'
ARTIFACTS = Path(os.environ.get("SANDHUB_TEST_ARTIFACTS") or REPO_ROOT / "target" / "test-artifacts") / "console"
WIDE = {"width": 1280, "height": 900}
NARROW = {"width": 390, "height": 844}


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    need(path is not None, "chromium is needed (scripts/test-deps.sh installs it)")
    assert path
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need(False, "playwright is needed (tests/requirements.txt)")
        raise
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    base = Path(tempfile.mkdtemp(prefix="sandhub-console-"))
    h = start_hub(
        binary("sandhub"), base, "--admin-tenants", "carol", api_keys={ALICE: "alice", BOB: "bob", CAROL: "carol"}
    )
    try:
        yield h
    finally:
        stop_hub(h)
        log = h.log_path.read_text(errors="replace")
        shutil.rmtree(base, ignore_errors=True)
        # The key never reaches the hub's log (it travels only as a header).
        assert not any(key in log for key in (ALICE, BOB, CAROL))


@pytest.fixture(scope="module")
def open_hub() -> Iterator[Hub]:
    """A hub without keys: the console opens straight in."""
    base = Path(tempfile.mkdtemp(prefix="sandhub-console-open-"))
    h = start_hub(binary("sandhub"), base)
    try:
        yield h
    finally:
        stop_hub(h)
        shutil.rmtree(base, ignore_errors=True)


def api(hub: Hub, method: str, path: str, body: object | None = None, key: str | None = ALICE) -> Any:
    status, data = hub.request(method, path, body, api_key=key)
    assert status < 300, (status, data)
    return json.loads(data) if data else None


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


class Session:
    """A signed-in browser tab that records every dialog (none may open)."""

    def __init__(self, browser: Any, hub: Hub, key: str | None, viewport: dict[str, int] = WIDE):
        self.context = browser.new_context(viewport=viewport)
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.errors: list[str] = []

        def on_dialog(d: Any) -> None:
            self.dialogs.append(d.message)
            d.dismiss()

        self.page.on("dialog", on_dialog)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(hub.url + "/")
        if key is not None:
            self.page.get_by_label("API key").fill(key)
            self.page.get_by_role("button", name="Sign in").click()
        self.page.get_by_role("heading", name="Sandboxes").wait_for()

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def alice(browser: Any, hub: Hub) -> Iterator[Session]:
    s = Session(browser, hub, ALICE)
    try:
        yield s
        assert s.dialogs == [], "a script ran a dialog"
    finally:
        s.close()


def create_in_page(page: Any, labels: str) -> str:
    """Creates a sandbox through the form; returns its id."""
    before = set(page.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.id)"))
    page.get_by_label("Labels").fill(labels)
    page.get_by_role("button", name="Create sandbox").click()
    wait_for(
        "the new sandbox's row",
        lambda: set(page.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.id)")) - before,
        timeout=60,
    )
    (new,) = set(page.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.id)")) - before
    return str(new)


def test_the_console_is_served_with_a_strict_policy(hub: Hub) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=10)
    try:
        conn.request("GET", "/")
        r = conn.getresponse()
        html = r.read().decode()
        assert r.status == 200, "the console's page needs no key"
        csp = r.getheader("content-security-policy") or ""
        for rule in ("script-src 'self'", "frame-ancestors 'none'", "connect-src 'self'", "default-src 'none'"):
            assert rule in csp, csp
        assert "unsafe-eval" not in csp and "script-src 'self';" in csp
        assert r.getheader("x-content-type-options") == "nosniff"
        assert r.getheader("cache-control") == "no-cache"
        # No inline script: every <script> names a file.
        assert re.findall(r"<script[^>]*>", html) and all("src=" in t for t in re.findall(r"<script[^>]*>", html))
        script = re.search(r'src="(/assets/[^"]+\.js)"', html)
        assert script
        conn.request("GET", script[1])
        r = conn.getresponse()
        r.read()
        assert r.status == 200 and "immutable" in (r.getheader("cache-control") or "")
        assert (r.getheader("content-type") or "").startswith("text/javascript")
        etag = r.getheader("etag")
        conn.request("GET", script[1], headers={"If-None-Match": etag or ""})
        r = conn.getresponse()
        r.read()
        assert r.status == 304
        # The data is not open: the API still needs the key.
        conn.request("GET", "/v1/sandboxes")
        r = conn.getresponse()
        assert r.status == 401, r.read()
        r.read()
        conn.request("GET", "/assets/no-such-file.js")
        r = conn.getresponse()
        assert r.status == 404 and json.loads(r.read())["code"] == "NOT_FOUND"
    finally:
        conn.close()


def test_sign_in_create_and_hostile_label(browser: Any, hub: Hub) -> None:
    # A wrong key is refused, and nothing is shown.
    context = browser.new_context(viewport=WIDE)
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        page.goto(hub.url + "/")
        shot(page, "sign-in")
        page.get_by_label("API key").fill("not-a-key-0123456789")
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("alert").filter(has_text="not accepted").wait_for()
        page.get_by_label("API key").fill(ALICE)
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("heading", name="Sandboxes").wait_for()
        # Kept in this tab's sessionStorage only: no cookie, not in the URL.
        assert page.evaluate("sessionStorage.getItem('sandhub.api-key')") == ALICE
        assert context.cookies() == []
        assert ALICE not in page.url

        # The hub refuses markup in a label, and its error, which quotes
        # the label, is shown as text.
        page.get_by_label("Labels").fill(f"xss={HOSTILE_LABEL}")
        page.get_by_role("button", name="Create sandbox").click()
        alert = page.get_by_role("alert").filter(has_text="label xss=")
        alert.wait_for()
        assert HOSTILE_LABEL in alert.inner_text()
        assert page.locator("img[src='x']").count() == 0

        sid = create_in_page(page, "agent=demo, run=r-1")
        row = page.locator(f"tr[data-id='{sid}']")
        assert "agent=demo" in row.inner_text() and "run=r-1" in row.inner_text()
        assert api(hub, "GET", f"/v1/sandboxes/{sid}")["labels"] == {"agent": "demo", "run": "r-1"}
        shot(page, "sandboxes")
        page.set_viewport_size(NARROW)
        shot(page, "sandboxes-390px")
        assert dialogs == []
    finally:
        context.close()


def row_ids(page: Any) -> set[str]:
    return set(page.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.id)"))


def list_fetches(page: Any) -> list[float]:
    """Times at which the page fetches the sandbox list, from now on."""
    seen: list[float] = []

    def on_request(r: Any) -> None:
        if r.method == "GET" and r.url.endswith("/v1/sandboxes"):
            seen.append(time.monotonic())

    page.on("request", on_request)
    return seen


def test_the_list_follows_the_event_stream(alice: Session, hub: Hub) -> None:
    """A sandbox created, then deleted, through the API (not the page) comes
    and goes in the open list without a reload, well inside the old 2 s
    poll; and idle, the list is no longer fetched every 2 s, so it was the
    event stream that brought the change."""
    page = alice.page
    page.get_by_test_id("updates").filter(has_text="live").wait_for(timeout=15_000)
    fetches = list_fetches(page)
    for _ in range(2):
        sid = api(hub, "POST", "/v1/sandboxes", {"labels": {"via": "api"}})["id"]
        t0 = time.monotonic()
        page.locator(f"tr[data-id='{sid}']").wait_for(timeout=10_000)
        appeared = time.monotonic() - t0
        api(hub, "DELETE", f"/v1/sandboxes/{sid}")
        t0 = time.monotonic()
        page.locator(f"tr[data-id='{sid}']").wait_for(state="detached", timeout=10_000)
        gone = time.monotonic() - t0
        assert appeared < 1.5 and gone < 1.5, (appeared, gone)
    page.wait_for_timeout(1000)  # the last events' reloads
    fetches.clear()
    page.wait_for_timeout(6000)
    assert len(fetches) <= 1, f"the idle list was fetched {len(fetches)} times in 6 s"

    # Away from the live views long enough for the stream to close, then
    # back: the new stream resumes after the last event this tab saw.
    streams: list[tuple[str, dict[str, str]]] = []

    def on_stream(r: Any) -> None:
        if "/v1/events" in r.url:
            streams.append((r.url, r.headers))

    page.on("request", on_stream)
    page.get_by_role("link", name="Templates").click()
    page.wait_for_timeout(6500)
    page.get_by_role("link", name="Sandboxes").click()
    page.get_by_test_id("updates").filter(has_text="live").wait_for(timeout=15_000)
    assert streams, "no new stream"
    url, sent = streams[-1]
    assert int(sent.get("last-event-id", "0")) > 0, sent
    # The key goes as a header, never in the URL.
    assert sent.get("authorization") == f"Bearer {ALICE}" and ALICE not in url


def test_without_the_event_stream_the_list_polls(alice: Session, hub: Hub) -> None:
    """A hub that refuses the stream (a backend without an event log answers
    501) still gets a current list: the console falls back to polling."""
    page = alice.page
    page.route(
        "**/v1/events*",
        lambda route: route.fulfill(
            status=501, content_type="application/json", body='{"code":"UNIMPLEMENTED","message":"no event log"}'
        ),
    )
    page.reload()
    page.get_by_test_id("updates").filter(has_text="polling").wait_for(timeout=15_000)
    sid = api(hub, "POST", "/v1/sandboxes", {})["id"]
    page.locator(f"tr[data-id='{sid}']").wait_for(timeout=10_000)
    api(hub, "DELETE", f"/v1/sandboxes/{sid}")


def test_another_tenant_never_sees_the_first_tenants_sandboxes(browser: Any, hub: Hub) -> None:
    mine = api(hub, "POST", "/v1/sandboxes", {"labels": {"owner": "alice"}})["id"]
    bob = Session(browser, hub, BOB)
    try:
        page = bob.page
        page.wait_for_selector("[data-testid=count]:not(:has-text('loading'))")
        page.get_by_test_id("updates").filter(has_text="live").wait_for(timeout=15_000)
        # Nor does bob's event stream bring alice's next one.
        later = api(hub, "POST", "/v1/sandboxes", {"labels": {"owner": "alice"}})["id"]
        page.wait_for_timeout(2500)
        assert mine not in page.content() and later not in page.content()
        page.goto(f"{hub.url}/#/sandboxes/{mine}")
        page.get_by_role("alert").wait_for()
        # The same answer as for a sandbox that does not exist.
        assert "not found" in page.get_by_role("alert").inner_text().lower()
        assert page.get_by_test_id("state").count() == 0
    finally:
        bob.close()


def open_detail(page: Any, hub: Hub, sid: str) -> None:
    page.goto(f"{hub.url}/#/sandboxes/{sid}")
    page.get_by_role("heading", name=sid).wait_for()
    wait_for("Ready", lambda: page.get_by_test_id("state").inner_text() == "Ready", timeout=60)


def terminal_text(page: Any) -> str:
    return str(page.locator(".xterm-rows").inner_text())


def test_terminal_echo_and_escape_sequences(alice: Session, hub: Hub) -> None:
    sid = api(hub, "POST", "/v1/sandboxes", {})["id"]
    page = alice.page
    open_detail(page, hub, sid)
    page.get_by_role("button", name="Open terminal").click()
    wait_for("the terminal", lambda: page.get_by_test_id("terminal-status").inner_text().startswith("open"), timeout=30)
    page.locator(".xterm").click()
    page.keyboard.type("echo hi\n")
    wait_for("hi echoed", lambda: re.search(r"^hi\s*$", terminal_text(page), re.M), timeout=15)
    # Output that tries to be markup or to retitle/reprogram the terminal is drawn as text.
    page.keyboard.type("printf '\\033]0;pwned\\007<img src=x onerror=alert(2)>\\033[31mred\\033[0m\\n'\n")
    wait_for("hostile output", lambda: "<img src=x onerror=alert(2)>red" in terminal_text(page), timeout=15)
    assert page.locator("img[src='x']").count() == 0
    assert page.title() == "Sandhub"
    shot(page, "terminal")


def test_terminal_reattaches_to_its_shell_after_a_reload(alice: Session, hub: Hub) -> None:
    """The hub keeps a dropped terminal's shell for a while; the reloaded
    page re-attaches to it (a fresh ticket, the shell's id from this tab's
    sessionStorage) and the same shell answers: same pid, same variable."""
    sid = api(hub, "POST", "/v1/sandboxes", {})["id"]
    page = alice.page
    open_detail(page, hub, sid)
    page.get_by_role("button", name="Open terminal").click()
    wait_for("the terminal", lambda: page.get_by_test_id("terminal-status").inner_text().startswith("open"), timeout=30)
    page.locator(".xterm").click()
    page.keyboard.type("X=kept-7; echo pid-$$-end\n")
    found = wait_for("the pid", lambda: re.search(r"^pid-(\d+)-end", terminal_text(page), re.M), timeout=15)
    assert found
    pid = found.group(1)
    page.reload()
    page.get_by_role("heading", name=sid).wait_for()
    # No click: the kept shell's terminal opens by itself.
    wait_for("re-attached", lambda: "re-attached" in page.get_by_test_id("terminal-status").inner_text(), timeout=30)
    page.locator(".xterm").click()
    page.keyboard.type("echo v=$X pid-$$-again\n")
    wait_for("the same shell", lambda: re.search(rf"^v=kept-7 pid-{pid}-again", terminal_text(page), re.M), timeout=15)
    # The hub lists it as the terminal it is.
    procs = api(hub, "GET", f"/v1/sandboxes/{sid}/processes")["processes"]
    assert [p["running"] for p in procs if p["kind"] == "terminal"] == [True], procs


def test_processes_are_listed_and_killed_from_the_page(alice: Session, hub: Hub) -> None:
    sid = api(hub, "POST", "/v1/sandboxes", {})["id"]
    page = alice.page
    with sandhub.Hub(hub.url, api_key=ALICE) as client:
        sleeper = client.get(sid).commands.start(["sleep", "600"])
        try:
            open_detail(page, hub, sid)
            section = page.locator("section[aria-labelledby=processes-title]")
            row = section.locator("tbody tr").filter(has_text="sleep 600")
            row.wait_for(timeout=15_000)
            assert row.get_attribute("data-running") == "true"
            pid = row.get_attribute("data-pid")
            shot(page, "processes")
            section.get_by_role("button", name=f"Kill {pid}").click()
            row.filter(has_text="exited").wait_for(timeout=15_000)
            assert row.get_attribute("data-running") == "false"
            procs = api(hub, "GET", f"/v1/sandboxes/{sid}/processes")["processes"]
            assert [p for p in procs if p["running"]] == [], procs
        finally:
            with contextlib.suppress(Exception):  # killed from the page already
                sleeper.kill()


def test_entrypoint_status_and_log(alice: Session, hub: Hub) -> None:
    api(
        hub,
        "PUT",
        "/v1/templates/talker",
        {"entrypoint": ["/bin/sh", "-c", f"echo 'started: {HOSTILE_LABEL}'; sleep 600"]},
    )
    sid = api(hub, "POST", "/v1/sandboxes", {"template": "talker"})["id"]
    page = alice.page
    open_detail(page, hub, sid)
    assert page.get_by_test_id("entrypoint-state").inner_text().startswith("Running")
    log = page.get_by_test_id("entrypoint-log")
    wait_for("the entrypoint's line", lambda: f"started: {HOSTILE_LABEL}" in log.inner_text(), timeout=30)
    # Its output is text: the markup in it is not an element.
    assert page.locator("img[src='x']").count() == 0
    shot(page, "entrypoint")


def test_upload_shows_in_exec_and_reset_removes_it(alice: Session, hub: Hub, tmp_path: Path) -> None:
    sid = api(hub, "POST", "/v1/sandboxes", {})["id"]
    page = alice.page
    open_detail(page, hub, sid)
    (tmp_path / "notes.txt").write_text("uploaded from the console\n")
    (tmp_path / HOSTILE_FILE).write_text("hostile name\n")
    page.locator("input[type=file]").set_input_files([str(tmp_path / "notes.txt"), str(tmp_path / HOSTILE_FILE)])
    files = page.locator("section[aria-labelledby=files-title] tbody")
    files.get_by_text("notes.txt", exact=True).wait_for()
    files.get_by_text(HOSTILE_FILE, exact=True).wait_for()
    out = api(hub, "POST", f"/v1/sandboxes/{sid}/exec", {"command": "cat notes.txt"})
    assert out["stdout"] == "uploaded from the console\n"
    page.get_by_role("button", name="View notes.txt").click()
    assert "uploaded from the console" in page.locator(".viewer").inner_text()
    assert page.locator("script:has-text('alert(3)')").count() == 0
    assert page.locator("img[src='x']").count() == 0
    shot(page, "sandbox-detail")

    page.get_by_role("button", name="Reset").click()
    page.get_by_role("status").filter(has_text="Reset: done").wait_for(timeout=60_000)
    wait_for("Ready after reset", lambda: api(hub, "GET", f"/v1/sandboxes/{sid}")["state"] == "Ready", timeout=60)
    out = api(hub, "POST", f"/v1/sandboxes/{sid}/exec", {"command": "ls -A"})
    assert "notes.txt" not in out["stdout"], out


def test_memory_plot_rises_under_a_workload(alice: Session, hub: Hub) -> None:
    sid = api(hub, "POST", "/v1/sandboxes", {})["id"]
    page = alice.page
    open_detail(page, hub, sid)
    last = page.get_by_test_id("last-Memory")
    wait_for("a first memory sample", lambda: last.inner_text() != "–", timeout=90)
    assert float(last.inner_text()) < 60
    with sandhub.Hub(hub.url, api_key=ALICE) as client:
        workload = client.get(sid).commands.start(
            ["python3", "-c", "import time; x = bytearray(96 << 20); x[::4096] = b'1' * len(x[::4096]); time.sleep(120)"]
        )
        try:
            wait_for("memory above 60 MiB in the plot", lambda: float(last.inner_text()) > 60, timeout=90)
            assert page.locator("figure[data-chart=Memory] canvas").count() == 1
            shot(page, "usage")
        finally:
            workload.kill()


def test_pool_set_to_three_shows_three_ready(alice: Session, hub: Hub) -> None:
    page = alice.page
    page.get_by_role("link", name="Pools").click()
    page.get_by_role("heading", name="Pools").wait_for()
    form = page.get_by_role("form", name="Create a pool")
    form.get_by_label("Name").fill("warm")
    form.get_by_role("button", name="Create pool").click()
    card = page.locator("li[data-pool=warm]")
    card.wait_for()
    card.get_by_label("Replicas").fill("3")
    card.get_by_role("button", name="Set").click()
    wait_for("3 ready", lambda: card.get_by_test_id("fill").inner_text() == "3 ready of 3", timeout=120)
    assert api(hub, "GET", "/v1/pools/warm")["ready"] == 3
    # The fill level over the time the page watched it.
    card.locator("figure[data-chart=Ready] canvas").wait_for()
    shot(page, "pools")
    api(hub, "PUT", "/v1/pools/warm", {"template": "default", "replicas": 0})


def test_events_feed_shows_lifecycle_events(alice: Session, hub: Hub) -> None:
    page = alice.page
    page.get_by_role("link", name="Events").click()
    page.get_by_role("heading", name="Events").wait_for()
    sid = api(hub, "POST", "/v1/sandboxes", {})["id"]
    other = api(hub, "POST", "/v1/sandboxes", {})["id"]
    page.locator("tbody").get_by_text(other).first.wait_for(timeout=30_000)
    page.locator("tbody").get_by_text(sid).first.wait_for()
    shot(page, "events")
    # Filtered to one sandbox, the feed holds only its events.
    page.get_by_label("Sandbox").fill(sid)
    page.get_by_role("button", name="Filter").click()
    page.locator("tbody").get_by_text(sid).first.wait_for(timeout=30_000)
    time.sleep(1)
    assert page.locator("tbody").get_by_text(other).count() == 0
    assert page.locator("tbody tr").count() >= 1


PAGE_PORT = 8000
#: Served by a sandbox through the path route, on the hub's own host.
ATTACK = """<!doctype html><title>loading</title>
<iframe id="console" src="/"></iframe>
<script>
const results = {origin: self.origin};
try { results.key = sessionStorage.getItem("sandhub.api-key"); }
catch (e) { results.key = "refused: " + e.name; }
(async () => {
  try {
    const key = typeof results.key === "string" && !results.key.startsWith("refused") ? results.key : "";
    const r = await fetch("/v1/sandboxes", {headers: {Authorization: "Bearer " + key}});
    results.fetch = r.status;
  } catch (e) { results.fetch = "refused by the browser"; }
  await new Promise((ok) => setTimeout(ok, 1500));
  try { results.frame = document.getElementById("console").contentWindow.sessionStorage.getItem("sandhub.api-key"); }
  catch (e) { results.frame = "refused: " + e.name; }
  document.title = "done " + JSON.stringify(results);
})();
</script>"""


def test_a_sandbox_page_cannot_read_the_key_call_the_api_or_frame_the_console(browser: Any, open_hub: Hub) -> None:
    """The path route shares the hub's host with the console. On a hub
    without keys (where a browser can open that route), a secret planted in
    the console's sessionStorage stays out of a sandbox page's reach in the
    same tab, its API calls are refused, and the console refuses to be framed."""
    sid = api(open_hub, "POST", "/v1/sandboxes", {}, key=None)["id"]
    status, _ = open_hub.request("POST", f"/v1/sandboxes/{sid}/exec", {
        "command": ["sh", "-c", "mkdir -p site && cat > site/page.html"],
        "stdin": ATTACK,
    })
    assert status == 200
    client = sandhub.Hub(open_hub.url)
    server = client.get(sid).commands.start(f"cd site && exec python3 -m http.server {PAGE_PORT} --bind 127.0.0.1")
    client.get(sid).ports.wait(PAGE_PORT, timeout=30)

    context = browser.new_context(viewport=WIDE)
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        page.goto(open_hub.url + "/")
        page.get_by_role("heading", name="Sandboxes").wait_for()  # no keys: straight in
        page.evaluate("sessionStorage.setItem('sandhub.api-key', 'planted-secret-0123456789')")
        response = page.goto(f"{open_hub.url}/v1/sandboxes/{sid}/ports/{PAGE_PORT}/page.html")
        assert response is not None and response.status == 200
        page.wait_for_function("document.title.startsWith('done')", timeout=30_000)
        results = json.loads(page.title()[len("done "):])
        frame_urls = [f.url for f in page.frames]
    finally:
        context.close()
        server.kill()
        client.close()
    assert results["origin"] == "null", results
    assert str(results["key"]).startswith("refused"), results
    assert results["fetch"] in (403, "refused by the browser"), results
    assert str(results["frame"]).startswith("refused"), results
    # The console refused to be framed (frame-ancestors 'none'): Chromium
    # shows its error page in the frame instead.
    assert frame_urls[1:] == ["chrome-error://chromewebdata/"], frame_urls
    assert dialogs == []


def upgrade(hub: Hub, path: str, origin: str | None = None, key: str | None = None) -> int:
    """The status a WebSocket upgrade of `path` gets (101: opened)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=20)
    try:
        headers = {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        }
        if origin:
            headers["Origin"] = origin
        if key:
            headers["Authorization"] = f"Bearer {key}"
        conn.request("GET", path, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_terminal_tickets_open_one_sandbox_once_for_its_tenant(hub: Hub) -> None:
    """The terminal's WebSocket carries a ticket, not the key: good once, for
    the sandbox and tenant it was minted for, and only from the hub's origin."""
    mine = api(hub, "POST", "/v1/sandboxes", {})["id"]
    other = api(hub, "POST", "/v1/sandboxes", {})["id"]
    bobs = api(hub, "POST", "/v1/sandboxes", {}, key=BOB)["id"]
    origin = hub.url

    def ticket(sid: str, key: str = ALICE) -> str:
        got = api(hub, "POST", f"/v1/sandboxes/{sid}/pty-tickets", key=key)
        assert got["expires_in_seconds"] <= 60
        return str(got["ticket"])

    assert upgrade(hub, f"/v1/sandboxes/{mine}/pty", origin) == 401, "no key, no ticket"
    t = ticket(mine)
    assert upgrade(hub, f"/v1/sandboxes/{other}/pty?ticket={t}", origin) == 401, "another sandbox"
    assert upgrade(hub, f"/v1/sandboxes/{mine}/pty?ticket={t}", origin) == 401, "spent by the wrong try"
    t = ticket(mine)
    assert upgrade(hub, f"/v1/sandboxes/{mine}/pty?ticket={t}", origin) == 101
    assert upgrade(hub, f"/v1/sandboxes/{mine}/pty?ticket={t}", origin) == 401, "single use"
    t = ticket(mine)
    assert upgrade(hub, f"/v1/sandboxes/{mine}/pty?ticket={t}", "http://evil.example") == 403, "Origin checked"
    # Bob cannot mint one for alice's sandbox (404, as if it did not exist),
    # and his own ticket opens only his.
    status, body = hub.request("POST", f"/v1/sandboxes/{mine}/pty-tickets", api_key=BOB)
    assert status == 404 and json.loads(body)["code"] == "NOT_FOUND"
    t = ticket(bobs, BOB)
    assert upgrade(hub, f"/v1/sandboxes/{mine}/pty?ticket={t}", origin) == 401
    # Unused tickets are bounded per tenant (carol's, so alice's other tests still get some).
    carols = api(hub, "POST", "/v1/sandboxes", {}, key=CAROL)["id"]
    codes = [hub.request("POST", f"/v1/sandboxes/{carols}/pty-tickets", api_key=CAROL)[0] for _ in range(40)]
    assert codes[:32] == [200] * 32 and set(codes[32:]) == {429}, codes
    assert hub.request("POST", f"/v1/sandboxes/{mine}/pty-tickets", api_key=ALICE)[0] == 200


#: Keystrokes timed through the terminal's WebSocket in the page.
ECHOES = 200

ECHO_BENCH = """async ([id, n]) => {
  const key = sessionStorage.getItem("sandhub.api-key");
  const r = await fetch(`/v1/sandboxes/${id}/pty-tickets`, {method: "POST", headers: {Authorization: `Bearer ${key}`}});
  if (!r.ok) throw new Error(`ticket: ${r.status}`);
  const {ticket} = await r.json();
  const ws = new WebSocket(`ws://${location.host}/v1/sandboxes/${id}/pty?command=cat&ticket=${ticket}`);
  ws.binaryType = "arraybuffer";
  await new Promise((ok, fail) => { ws.onopen = ok; ws.onerror = fail; });
  let waiting = null;
  ws.onmessage = (m) => { if (waiting && m.data instanceof ArrayBuffer && new Uint8Array(m.data).includes(120)) { const w = waiting; waiting = null; w(); } };
  const times = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await new Promise((ok) => { waiting = ok; ws.send(new Uint8Array([120])); });
    times.push(performance.now() - t0);
  }
  ws.close();
  times.sort((a, b) => a - b);
  return {n: times.length, p50: times[Math.floor(n / 2)], p99: times[Math.floor(n * 0.99)]};
}"""


def test_terminal_keystroke_echo_p50(alice: Session, hub: Hub) -> None:
    """Issue #31's benchmark: a keystroke's echo through the hub's PTY
    WebSocket, timed in the browser (loopback; the target is 10 ms)."""
    sid = api(hub, "POST", "/v1/sandboxes", {})["id"]
    open_detail(alice.page, hub, sid)
    got = alice.page.evaluate(ECHO_BENCH, [sid, ECHOES])
    print(f"terminal keystroke echo over {got['n']} keys: p50 {got['p50']:.2f} ms, p99 {got['p99']:.2f} ms")
    assert got["n"] == ECHOES


def test_operators_see_every_tenants_usage_against_quotas(browser: Any, hub: Hub) -> None:
    """`--admin-tenants carol`: carol's key also sees every tenant's use
    against its quotas; anyone else's gets 404 and no Operators view."""
    api(hub, "POST", "/v1/sandboxes", {}, key=BOB)
    status, body = hub.request("GET", "/v1/admin/tenants", api_key=ALICE)
    assert status == 404 and json.loads(body)["code"] == "NOT_FOUND"
    got = api(hub, "GET", "/v1/admin/tenants", key=CAROL)
    by_tenant = {t["tenant"]: t for t in got["tenants"]}
    # Bob has no pool, so his count is his list (alice's may hold warm members).
    listed = api(hub, "GET", "/v1/sandboxes", key=BOB)["sandboxes"]
    assert by_tenant["bob"]["sandboxes"] == len(listed) >= 1, (by_tenant["bob"], len(listed))
    assert by_tenant["bob"]["sandboxes_quota"] == 128
    assert "alice" in by_tenant

    plain = Session(browser, hub, ALICE)
    try:
        assert plain.page.get_by_role("link", name="Operators").count() == 0
    finally:
        plain.close()
    operator = Session(browser, hub, CAROL)
    try:
        page = operator.page
        page.get_by_role("link", name="Operators").click()
        page.get_by_role("heading", name="Operators").wait_for()
        row = page.locator("tr[data-tenant=bob]")
        row.wait_for()
        assert f"{by_tenant['bob']['sandboxes']} of 128" in row.inner_text()
        shot(page, "operators")
    finally:
        operator.close()


#: Issue #31's benchmark: the sandbox list's first render with this many sandboxes.
LIST_BENCH = int(os.environ.get("SANDHUB_CONSOLE_BENCH_SANDBOXES") or 500)


def test_sandbox_list_first_render_with_many_sandboxes(browser: Any, tmp_path: Path) -> None:
    """Time from navigation to the first rendered page of rows (and the
    count of all) with LIST_BENCH real sandboxes, in a real browser."""
    from concurrent.futures import ThreadPoolExecutor

    # Small memory limits, so LIST_BENCH of them fit the tenant memory quota.
    h = start_hub(
        binary("sandhub"), tmp_path, "--tenant-max-sandboxes", str(LIST_BENCH + 10), "--default-memory-mb", "64"
    )
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            ids = list(pool.map(lambda i: api(h, "POST", "/v1/sandboxes", {"labels": {"n": str(i)}}, key=None)["id"],
                                range(LIST_BENCH)))
        created = time.monotonic() - started
        context = browser.new_context(viewport=WIDE)
        page = context.new_page()
        try:
            page.goto(h.url + "/")
            page.wait_for_function(
                # A function, not an expression: the console's CSP forbids eval.
                f"() => document.querySelector('[data-testid=count]')?.textContent === '{LIST_BENCH} of {LIST_BENCH}'",
                timeout=120_000,
            )
            rendered_ms = page.evaluate("performance.now()")
            rows = page.locator("tbody tr").count()
            # Sorting all of them by memory re-renders one page.
            t0 = page.evaluate("performance.now()")
            page.get_by_role("button", name="Memory").click()
            page.wait_for_function("() => document.querySelector('th[aria-sort=ascending] button')?.textContent === 'Memory'")
            sort_ms = page.evaluate("performance.now()") - t0
            shot(page, f"sandboxes-{LIST_BENCH}")
        finally:
            context.close()
        print(
            f"sandbox list with {LIST_BENCH} sandboxes: first render {rendered_ms:.0f} ms after navigation "
            f"({rows} rows on the first page), sort {sort_ms:.0f} ms; creating them took {created:.1f} s"
        )
        assert rows == 100 and len(set(ids)) == LIST_BENCH
    finally:
        h.delete_everything()
        stop_hub(h)


def test_template_errors_are_shown_at_the_field(alice: Session, hub: Hub) -> None:
    page = alice.page
    page.get_by_role("link", name="Templates").click()
    page.get_by_role("heading", name="Templates").wait_for()
    page.get_by_role("form", name="New template").get_by_label("Name").fill("small")
    page.get_by_role("button", name="New template").click()
    editor = page.get_by_label("Template small (JSON)")
    editor.fill('{"memory_mb": "lots", "cpu": 0.5}')
    page.get_by_role("button", name="Save small").click()
    alert = page.get_by_role("alert").filter(has_text="memory_mb")
    alert.wait_for()
    assert page.get_by_test_id("field").inner_text() == "memory_mb"
    assert editor.get_attribute("aria-invalid") == "true"
    shot(page, "templates-error")
    editor.fill('{"memory_mb": 256, "cpu": 0.5}')
    page.get_by_role("button", name="Save small").click()
    page.get_by_role("status").filter(has_text="Saved.").wait_for()
    got = api(hub, "GET", "/v1/templates/small")
    assert got["memory_mb"] == 256 and got["cpu"] == 0.5
    shot(page, "templates")


def test_gym_view_shows_an_episodes_reward_after_env_step(alice: Session, hub: Hub) -> None:
    """An RL run through the Gymnasium adapter (`sandhub_gymnasium`); the
    Gym view shows the env, its running return, and the finished episode's."""
    from sandhub_gymnasium import SandhubEnv

    env = SandhubEnv(
        hub.url,
        api_key=ALICE,
        task={"files": {"counter": "0\n"}},
        reward=[{"kind": "regex", "pattern": "^[0-9]+$", "stream": "stdout", "weight": 0.5}],
        termination=[{"kind": "file", "path": "counter", "equals": "2\n"}],
        max_episode_steps=10,
    )
    try:
        env.reset(seed=1)
        env.step("n=$(cat counter); n=$((n+1)); echo $n > counter; echo $n")
        page = alice.page
        page.get_by_role("link", name="Gym").click()
        page.get_by_role("heading", name="Gym").wait_for()
        card = page.locator("li.card", has=page.get_by_test_id("running-return"))
        wait_for("the running return", lambda: card.get_by_test_id("running-return").inner_text() == "0.5", timeout=30)
        _, reward, terminated, _, _ = env.step("n=$(cat counter); n=$((n+1)); echo $n > counter; echo $n")
        assert reward == 0.5 and terminated
        wait_for("the finished episode's return", lambda: card.get_by_test_id("last-return").inner_text() == "1", timeout=30)
        env.reset()
        env.step("cat counter")
        env.step("n=$(cat counter); n=$((n+1)); echo $n > counter; echo $n")
        env.step("n=$(cat counter); n=$((n+1)); echo $n > counter; echo $n")
        wait_for("two episodes plotted", lambda: card.get_by_test_id("last-return").inner_text() == "1.5", timeout=30)
        assert card.locator("figure[data-chart=Return] canvas").count() == 1
        shot(page, "gym")
        # Another tenant sees none of it.
        status, body = hub.request("GET", "/gym/v1/envs", api_key=BOB)
        assert status == 200 and json.loads(body)["envs"] == []
    finally:
        env.close()


def test_an_image_pull_from_the_page_shows_its_progress(browser: Any, tmp_path: Path) -> None:
    """A pull started from the Templates view reads the hub's NDJSON stream:
    the layers it resolved, each one's progress, and the image at the end."""
    from sandhub_testing import Registry, running_hub, test_image_layout

    with Registry(tmp_path / "registry") as reg:
        reg.push(test_image_layout(), "console/pulled:1", ref="sandhub/test:amd64")
        with running_hub(binary("sandhub"), tmp_path / "hub", "--insecure-registry", reg.addr) as h:
            s = Session(browser, h, None)
            try:
                page = s.page
                page.get_by_role("link", name="Templates").click()
                form = page.get_by_role("form", name="Pull an image")
                form.get_by_label("Reference").fill(f"{reg.addr}/console/pulled:1")
                form.get_by_label("Store as").fill("console/pulled:local")
                form.get_by_role("button", name="Pull").click()
                status = page.get_by_test_id("pull-status")
                status.filter(has_text="Pulled: console/pulled:local").wait_for(timeout=60_000)
                # It resolved three layers, each now done, and the bar is full.
                layers = page.locator("li[data-layer-done]")
                assert layers.count() == 3
                assert layers.evaluate_all("ls => ls.every(l => l.dataset.layerDone === 'true')")
                bar = page.get_by_test_id("pull-progress")
                assert bar.get_attribute("value") == bar.get_attribute("max")
                # And the store's list shows it without a reload.
                page.locator("tbody").get_by_text("console/pulled:local").wait_for(timeout=10_000)
                shot(page, "images-pull")
                assert s.dialogs == []
            finally:
                s.close()
