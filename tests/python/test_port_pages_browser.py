"""A sandbox's web page, opened in a real browser (Debian's chromium through
Playwright), cannot drive the hub's API (issue #26, finding 2).

On a hub without keys (the README's quick tour), a page served through the
path route ``/v1/sandboxes/{id}/ports/{port}/page.html`` used to be on the
hub's own origin: its ``fetch()`` was same-origin, needed no preflight, and
ran a command in another sandbox. The page here tries exactly that, and
more, in every way a script can send a request; the test then checks in the
victim sandbox and the sandbox list that none of it happened.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest
import sandhub
from sdk_fixtures import hub_url, running_hub  # noqa: F401 (fixtures)

PORT = 8000

#: Each attempt records what came back (or that the browser refused it).
ATTACK = """<!doctype html>
<title>loading</title>
<form id="f" method="POST" enctype="text/plain" target="sink"
      action="/v1/sandboxes/VICTIM/exec"><input name='{"command":"touch /workspace/form","x":"' value='"}'></form>
<iframe name="sink"></iframe>
<script>
const victim = "VICTIM";
const exec = (cmd) => JSON.stringify({command: cmd});
async function attempt(name, url, init) {
  try {
    const r = await fetch(url, init);
    results[name] = r.type === "opaque" ? "opaque" : r.status;
  } catch (e) {
    results[name] = "refused by the browser";
  }
}
const results = {origin: self.origin};
(async () => {
  await attempt("json", `/v1/sandboxes/${victim}/exec`,
    {method: "POST", headers: {"content-type": "application/json"}, body: exec("touch /workspace/json")});
  await attempt("plain", `/v1/sandboxes/${victim}/exec`,
    {method: "POST", headers: {"content-type": "text/plain"}, body: exec("touch /workspace/plain")});
  await attempt("no-cors", `/v1/sandboxes/${victim}/exec`,
    {method: "POST", mode: "no-cors", body: exec("touch /workspace/nocors")});
  await attempt("create", "/v1/sandboxes",
    {method: "POST", mode: "no-cors", body: "{}"});
  await attempt("list", "/v1/sandboxes", {});
  try { document.getElementById("f").submit(); results.form = "submitted"; }
  catch (e) { results.form = "refused by the browser"; }
  await new Promise((ok) => setTimeout(ok, 1000));
  document.title = "done " + JSON.stringify(results);
})();
</script>
"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_a_sandbox_page_cannot_drive_the_hub(hub_url: str) -> None:
    browser_path = chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None  # type: ignore[assignment]
    if browser_path is None or sync_playwright is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium and playwright are needed (scripts/test-deps.sh installs them)")
        pytest.skip("no chromium or playwright here")

    with sandhub.Hub(hub_url) as hub, hub.create() as victim, hub.create() as attacker:
        before = {s.id for s in hub.list()}
        attacker.files.write("site/page.html", ATTACK.replace("VICTIM", victim.id))
        server = attacker.commands.start(
            f"cd site && exec python3 -m http.server {PORT} --bind 127.0.0.1"
        )
        try:
            page_url = attacker.ports.wait(PORT, timeout=30) + "page.html"
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
                try:
                    page = browser.new_page()
                    response = page.goto(page_url)
                    assert response is not None and response.status == 200
                    csp = response.headers.get("content-security-policy", "")
                    page.wait_for_function("document.title.startsWith('done')", timeout=30_000)
                    results: dict[str, Any] = json.loads(page.title()[len("done ") :])
                finally:
                    browser.close()
        finally:
            server.kill()

        # None of its requests was answered by the API...
        for name in ("json", "plain", "list"):
            assert results[name] in (403, "refused by the browser"), results
        # ...and none of them did anything.
        done = victim.commands.run("ls /workspace").stdout.split()
        assert not {"json", "plain", "nocors", "form"} & set(done), (done, results)
        assert {s.id for s in hub.list()} == before, results
        # The page ran, in an opaque origin.
        assert results["origin"] == "null", results
        # What made it so: the page was served sandboxed.
        assert csp.startswith("sandbox"), csp
