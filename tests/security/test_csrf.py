"""Cross-site request forgery (issue: a page on another origin auto-submitted a text/plain form
that created a job as the logged-in user). Real JupyterHub, the real service, real Chromium:

- bob logs in to the hub and opens the service (OAuth: the service's login cookie, whose token
  may submit jobs);
- a page on another origin auto-submits a text/plain form whose body is valid JSON to
  ``POST /api/v1/jobs``: it must be refused and create nothing;
- the same request from the service's own page, with JupyterHub's XSRF token from the
  ``_xsrf`` cookie, works (so the service's own pages can change state);
- the login cookie is ``SameSite=Lax`` and ``HttpOnly``."""

from __future__ import annotations

import http.server as httpserver
import os
import threading

import pytest

from jupyter_gpubudget.service.auth import CUSTOM_SCOPES
from tests.fixtures.hub import ServiceProc, free_port, http, start_hub
from tests.hub.hubproc import CHROMIUM, CHROMIUM_FLAGS, require_browser

FLAGS = CHROMIUM_FLAGS


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    require_browser()
    d = tmp_path_factory.mktemp("csrf")
    port, token = free_port(), "csrf-service-token-" + os.urandom(8).hex()
    service = {"name": "gpubudget", "url": f"http://127.0.0.1:{port}", "api_token": token,
               "oauth_no_confirm": True, "oauth_client_allowed_scopes": sorted(CUSTOM_SCOPES)}
    hub = start_hub(d / "hub", services=[service], service_port=port, service_token=token)
    svc = ServiceProc(hub, d / "svc", f"sqlite:///{d / 'ledger.sqlite'}")
    svc.start()
    yield hub, svc
    svc.stop()
    hub.stop()


def attacker_page(target: str) -> bytes:
    # a text/plain form: the browser sends  name=value  -> valid JSON, no CORS preflight
    name = '{"command": "touch /tmp/pwned", "project": "lattice", "gpus": 0, "name": "'
    return f"""<!doctype html><html><body>
<form id=f method=POST enctype="text/plain" action="{target}">
<input type=hidden name='{name}' value='csrf"}}'></form>
<script>document.getElementById('f').submit()</script></body></html>""".encode()


def serve_once(body: bytes) -> tuple[str, httpserver.HTTPServer]:
    class H(httpserver.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):  # noqa: ANN002
            pass

    srv = httpserver.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}/", srv


def bobs_jobs(hub, svc) -> list[str]:
    st, out = http("GET", svc.api + "/jobs", hub.token("bob"))
    assert st == 200, out
    return [j["name"] for j in out["jobs"]]


def test_a_forged_cross_site_form_creates_nothing_but_the_service_page_can(env):
    from playwright.sync_api import sync_playwright

    hub, svc = env
    base = hub.url + "/services/gpubudget"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            ctx = browser.new_context()
            page = ctx.new_page()
            page.set_default_timeout(30_000)
            page.goto(hub.url + "/hub/login")
            page.fill("#username_input", "bob")
            page.fill("#password_input", "any")
            page.click("#login_submit")
            page.wait_for_url("**/hub/**")
            page.goto(base + "/")  # OAuth with the service: sets its login cookie
            assert '"user": "bob"' in page.content()
            cookies = {c["name"]: c for c in ctx.cookies()}
            login = cookies["service-gpubudget"]
            assert login["sameSite"] == "Lax" and login["httpOnly"]

            url, srv = serve_once(attacker_page(base + "/api/v1/jobs"))
            try:
                with page.expect_response(lambda r: "/api/v1/jobs" in r.url) as resp:
                    page.goto(url)
                assert resp.value.status == 403, resp.value.text()
            finally:
                srv.shutdown()
            assert "=csrf" not in bobs_jobs(hub, svc)

            # the service's own page, with JupyterHub's XSRF token: allowed
            page.goto(base + "/")
            status = page.evaluate("""async () => {
                const xsrf = document.cookie.split('; ').find(c => c.startsWith('_xsrf='));
                const r = await fetch('api/v1/jobs', {method: 'POST',
                    headers: {'Content-Type': 'application/json',
                              'X-XSRFToken': decodeURIComponent(xsrf.slice(6))},
                    body: JSON.stringify({command: 'true', project: 'lattice', gpus: 0,
                                          name: 'same-origin'})});
                return r.status; }""")
            assert status == 201
            assert "same-origin" in bobs_jobs(hub, svc)
            # without the token, the same page's request is refused
            status = page.evaluate("""async () => (await fetch('api/v1/jobs', {method: 'POST',
                headers: {'Content-Type': 'application/json'},
                body: JSON.stringify({command: 'true', project: 'lattice', gpus: 0,
                                      name: 'no-token'})})).status""")
            assert status == 403
            assert "no-token" not in bobs_jobs(hub, svc)
        finally:
            browser.close()
