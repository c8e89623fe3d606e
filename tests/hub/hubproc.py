"""Start the project's own hub_config/jupyterhub_config.py (real JupyterHub, real
configurable-http-proxy, the gpubudget service managed by the hub) on free ports, for tests.

``require(part)``: a missing part skips the test, except with CI=true where it fails."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from jupyter_gpubudget.hub.demo_setup import reachable
from tests.fixtures.ports import free_port
from tests.fixtures.unixusers import shared_tmp

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "hub_config" / "jupyterhub_config.py"


def require(ok: bool, what: str) -> None:
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing (CI=true: this must not be skipped)")
    pytest.skip(f"{what} is missing")


def require_hub_parts() -> None:
    try:
        import jupyterhub  # noqa: F401
        import jupyterlab  # noqa: F401
        have = True
    except ImportError:
        have = False
    require(have, "jupyterhub/jupyterlab (pip install '.[hub]')")
    require(shutil.which("configurable-http-proxy") is not None,
            "configurable-http-proxy (npm install -g configurable-http-proxy)")


def http(method: str, url: str, token: str | None = None, body: object = None,
         timeout: float = 60) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", f"token {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, (json.loads(raw) if raw else None)
    except ValueError:
        return status, raw.decode(errors="replace")


@dataclass
class DemoHub:
    dir: Path
    url: str
    token: str  # the "gpubudget-test" service: hub admin + gpubudget admin scopes
    proc: subprocess.Popen
    log: Path

    @property
    def api(self) -> str:
        return self.url + "/hub/api"

    @property
    def svc(self) -> str:
        return self.url + "/services/gpubudget/api/v1"

    @property
    def ledger_path(self) -> Path:
        """The ledger (in the service's own directory when it runs as its own user)."""
        state = self.dir / "state"
        own = state / "service" / "ledger.sqlite"
        return own if own.exists() else state / "ledger.sqlite"

    @property
    def ledger_url(self) -> str:
        return f"sqlite:///{self.ledger_path}"

    def logtail(self, n: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def wait_ready(self, user: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            st, u = http("GET", f"{self.api}/users/{user}", self.token)
            srv = (u or {}).get("servers", {}).get("") if isinstance(u, dict) else None
            if srv and srv.get("ready"):
                return srv
            if time.monotonic() > deadline:
                raise AssertionError(f"{user}'s server not ready:\n{self.logtail()}")
            time.sleep(0.2)

    def server_env(self, user: str) -> dict[str, str]:
        """The environment of the user's running single-user server process."""
        st, u = http("GET", f"{self.api}/users/{user}", self.token)
        state = u["servers"][""]["state"]  # type: ignore[index]
        pid = state["child_state"]["pid"]
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the hub stops its servers, service, proxy
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        try:  # anything left in the hub's own process group (proxy, service, servers)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _shared_state(d: Path, budgets: Path | None, inventory: Path | None
                  ) -> tuple[Path, Path | None, Path | None]:
    """The hub's state directory, and the budgets and inventory files, where the service's and
    the demo users' Unix accounts can reach them (pytest's temporary directory is 0700 to
    them): ``d/state`` links to a directory under /tmp; files the accounts cannot read are
    hard-linked there (the same file: a test editing it edits what the service reads)."""
    state = d / "state"
    if os.geteuid() != 0 or (state.exists() and not state.is_symlink()):
        return state, budgets, inventory  # isolation is off, or a state directory made before
    if not state.is_symlink():
        state.symlink_to(shared_tmp("gpubudget-hub-"))
    shared = state.resolve()
    out = []
    for f in (budgets, inventory):
        if f is not None and reachable(f) is not None:
            link = shared / f"input-{f.name}"
            if not link.exists():  # (a restarted hub finds it made)
                try:
                    os.link(f, link)
                except OSError:
                    shutil.copy(f, link)
                link.chmod(0o644)
            f = link
        out.append(f)
    return state, out[0], out[1]


#: the browser the end-to-end tests drive (playwright with the system's Chromium)
CHROMIUM = os.environ.get("GPUBUDGET_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]


def require_browser() -> None:
    """playwright and Chromium, or (under CI=true) a failure saying which is missing."""
    try:
        import playwright.sync_api  # noqa: F401
        have_pw = True
    except ImportError:
        have_pw = False
    require(have_pw, "the playwright Python package (pip install playwright)")
    require(os.path.exists(CHROMIUM), "Chromium (apt-get install -y chromium)")


def start_demo_hub(d: Path, budgets: Path | None = None, inventory: Path | None = None,
                   env: dict | None = None, via_cli: bool = False) -> DemoHub:
    require_hub_parts()
    d.mkdir(parents=True, exist_ok=True)
    state, budgets, inventory = _shared_state(d, budgets, inventory)
    port = free_port()
    token = secrets.token_hex(16)
    e = dict(os.environ)
    e.update({
        "GPUBUDGET_HUB_DIR": str(state.resolve()), "GPUBUDGET_HUB_PORT": str(port),
        "GPUBUDGET_SERVICE_PORT": str(free_port()), "GPUBUDGET_PROXY_API_PORT": str(free_port()),
        "GPUBUDGET_HUB_API_PORT": str(free_port()), "GPUBUDGET_TEST_TOKEN": token,
        "GPUBUDGET_CYCLE_INTERVAL": "1", "GPUBUDGET_QUEUE_POLL": "0.3",
        # a preempted server's lab is warned this long before it stops (the demo's 60 s
        # would only slow the tests that preempt through the spawner)
        "GPUBUDGET_PREEMPT_NOTICE": "3",
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    })
    if budgets:
        e["GPUBUDGET_BUDGETS"] = str(budgets)
    if inventory:
        e["GPUBUDGET_INVENTORY"] = str(inventory)
    e.update(env or {})
    port = int(e["GPUBUDGET_HUB_PORT"])
    token = e["GPUBUDGET_TEST_TOKEN"]
    if via_cli:
        cmd = [sys.executable, "-m", "jupyter_gpubudget.cli", "hub", "--port", str(port),
               "--dir", e["GPUBUDGET_HUB_DIR"]]
        if budgets:
            cmd += ["--budgets", str(budgets)]
        if inventory:
            cmd += ["--inventory", str(inventory)]
    else:
        cmd = [sys.executable, "-m", "jupyterhub", "-f", str(CONFIG)]
    return launch_hub(cmd, d, e, port, token)


def launch_hub(cmd: list[str], d: Path, env: dict, port: int, token: str,
               timeout: float = 90) -> DemoHub:
    """Start a hub (its output in ``d/hub.log``) and wait until its gpubudget service
    answers ``/healthz``; a hub that exits or is not up in time fails with its log."""
    log = d / "hub.log"
    proc = subprocess.Popen(cmd, cwd=d, env=env, stdout=open(log, "ab"),  # noqa: SIM115
                            stderr=subprocess.STDOUT, start_new_session=True)
    hub = DemoHub(d, f"http://127.0.0.1:{port}", token, proc, log)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"hub exited with {proc.returncode}:\n{hub.logtail()}")
        st, _ = http("GET", hub.svc + "/healthz", timeout=5) if _up(port) else (0, None)
        if st == 200:
            return hub
        if time.monotonic() > deadline:
            hub.stop()
            raise TimeoutError(f"hub not up in {timeout:g} s:\n{hub.logtail()}")
        time.sleep(0.2)


def _up(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class ProgressReader(threading.Thread):
    """Reads a spawn's progress event stream (server-sent events) in the background."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url, self.token = url, token
        self.events: list[dict] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        req = urllib.request.Request(self.url, headers={"Authorization": f"token {self.token}",
                                                        "Accept": "text/event-stream"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                for raw in r:
                    line = raw.decode(errors="replace").strip()
                    if line.startswith("data:"):
                        self.events.append(json.loads(line[5:]))
        except BaseException as e:  # noqa: BLE001
            self.error = e

    def wait_for(self, pred, timeout: float = 60) -> dict:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in list(self.events):
                if pred(ev):
                    return ev
            time.sleep(0.1)
        raise AssertionError(f"no matching progress event; got {self.events} ({self.error})")
