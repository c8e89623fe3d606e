"""binder/ (repo2docker): the files are complete, and they start — the equivalent of a
`repo2docker --no-build` check without Docker: binder/start is run here as Binder runs it
(`start jupyter lab ...`, with Binder's own JupyterHub variables in the environment), the lab
answers with the extension and its server extension connected to the gpubudget service on the
demo inventory with a session, and the example notebook runs in a kernel with the lab's
environment (nbclient), producing the simulator's plots and running a job through the CLI.

postBuild's `pip install .` (building the extension with npm) is what tests/serverext/
test_wheel.py checks for a wheel: here the checkout's installed package is used."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest
import yaml

from tests.hub.hubproc import free_port, require

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"


def test_the_binder_files_are_complete():
    env = yaml.safe_load((BINDER / "environment.yml").read_text())
    deps = env["dependencies"]
    assert any(str(d).startswith("python=3.1") for d in deps)
    assert "nodejs=20" in deps  # the extension is built with Node 20 (postBuild)
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    assert any(p.startswith("jupyterlab>=4") for p in pip)
    for name in ("postBuild", "start"):
        f = BINDER / name
        assert os.access(f, os.X_OK), f"binder/{name} is not executable"
        assert f.read_text().startswith("#!/bin/bash\n")
        r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert re.search(r'pip install [^\n]*"\.\[hub\]"', (BINDER / "postBuild").read_text())
    start = (BINDER / "start").read_text()
    assert start.rstrip().endswith('exec "$@"')  # repo2docker's contract: run the command
    for ref in re.findall(r'\$REPO/([\w./-]+)', start):
        assert (ROOT / ref).is_file(), ref
    nb = nbformat.read(ROOT / "examples" / "tour.ipynb", as_version=4)
    nbformat.validate(nb)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code")  # stored clean


@pytest.fixture(scope="module")
def binder_lab(tmp_path_factory):
    try:
        import jupyterlab  # noqa: F401
        import nbclient  # noqa: F401
        have = True
    except ImportError:
        have = False
    require(have, "jupyterlab and nbclient (pip install '.[hub]')")
    require((ROOT / "jupyter_gpubudget" / "labextension" / "package.json").exists(),
            "the built JupyterLab extension (make lab)")
    # Binder runs everything as one unprivileged account (jovyan): so does this test when it
    # runs as root (the service then runs jobs as that same account, as on Binder)
    demote = None
    if os.geteuid() == 0:
        import pwd

        from tests.fixtures.unixusers import PREFIX, ensure_accounts, shared_tmp

        ensure_accounts(["binder"])
        pw = pwd.getpwnam(PREFIX + "binder")
        home = shared_tmp("gpubudget-binder-") / "home"
        home.mkdir()
        os.chown(home, pw.pw_uid, pw.pw_gid)

        def demote() -> None:
            os.setgid(pw.pw_gid)
            os.initgroups(pw.pw_name, pw.pw_gid)
            os.setuid(pw.pw_uid)
    else:
        home = tmp_path_factory.mktemp("binder-home")
    port, token = free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUBUDGET_", "JUPYTER"))}
    env.update({
        "HOME": str(home), "GPUBUDGET_BINDER_DIR": str(home / "state"),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
        "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
        # what Binder's own hub puts in the server's environment: not for the service
        "JUPYTERHUB_API_TOKEN": "binders-own-hub-token",
        "JUPYTERHUB_SERVICE_PREFIX": "/user/binder-x/",
        "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api",
    })
    cmd = [str(BINDER / "start"), sys.executable, "-m", "jupyterlab", "--no-browser",
           "--ip=127.0.0.1", f"--port={port}", f"--ServerApp.token={token}",
           f"--ServerApp.root_dir={ROOT}", "--LabApp.news_url=None"]
    log = home / "lab.log"
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "ab"),  # noqa: SIM115
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=demote)  # noqa: PLW1509
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"binder/start exited with {proc.returncode}:\n"
                                 f"{log.read_text()[-4000:]}")
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2).read()
            break
        except OSError:
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.3)
    yield url, token, proc, home
    os.killpg(proc.pid, signal.SIGTERM)  # the lab and the service the script started
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(0.5)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_binder_start_runs_the_lab_with_the_extension_and_the_service(binder_lab):
    url, token, proc, home = binder_lab
    page = urllib.request.urlopen(f"{url}/lab?token={token}", timeout=30).read().decode()
    config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">'
                                  r"(.*?)</script>", page, re.S).group(1))
    assert "jupyter-gpubudget" in [e["name"] for e in config["federated_extensions"]]
    info = _get(f"{url}/gpubudget/api/info?token={token}")
    assert info["service"]["reachable"], info
    assert info["features"]["usage_daily"] and info["features"]["job_log"]
    assert info["project"] == "lattice-qcd" and info["session"]
    s = _get(f"{url}/gpubudget/api/v1/sessions/{info['session']}?token={token}")
    assert s["state"] == "running" and s["user"] == "alice" and s["backed"]
    assert s["placement"][0]["profile"] == "1g.10gb" and s["inventory"] == "declared"
    acct = _get(f"{url}/gpubudget/api/v1/accounts/lattice-qcd?token={token}")
    assert acct["effective_grant_hours"] == 800
    # the service only knows the start script's token, not Binder's hub token
    tokens = home / "state" / "tokens.json"
    assert oct(tokens.stat().st_mode & 0o777) == "0o600"
    svc = info["service"]["url"]
    req = urllib.request.Request(f"{svc}/api/v1/accounts",
                                 headers={"Authorization": "token binders-own-hub-token"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 403


def test_the_example_notebook_runs_and_shows_the_simulators_plots(binder_lab):
    from nbclient import NotebookClient

    url, token, proc, home = binder_lab
    raw = Path(f"/proc/{proc.pid}/environ").read_bytes()  # the lab's environment (exec'd)
    env = dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)
    assert env.get("GPUBUDGET_URL") and env.get("GPUBUDGET_TOKEN")
    nb = nbformat.read(ROOT / "examples" / "tour.ipynb", as_version=4)
    work = home / "examples"
    work.mkdir()
    (work / "budgets-sim.yaml").write_text((ROOT / "examples" / "budgets-sim.yaml").read_text())
    client = NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(work)}})
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the kernel starts with the lab's environment
    try:
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 3  # waits, delivered vs grant, utilisation
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                   for o in outputs)
    assert "2000 workloads on 64 GPUs" in text
    assert "Share of grant delivered" in text
    assert re.search(r"submitted \S+ \((pending|running)\)", text), text
    # a declared inventory: stable declared ids (docs/backends.md "Devices"), not CUDA indices
    assert re.search(r"training on GPUs GPU-[\w-]+-\d+,GPU-[\w-]+-\d+", text), text
    assert "tour" in text and "done" in text


def test_a_tokens_file_others_may_read_or_that_is_malformed_is_refused(tmp_path):
    from jupyter_gpubudget.service.app import load_tokens

    f = tmp_path / "tokens.json"
    good = {"a" * 24: {"name": "alice", "scopes": ["custom:gpubudget:read"]}}
    f.write_text(json.dumps(good))
    f.chmod(0o644)
    with pytest.raises(OSError, match="readable by others"):
        load_tokens(str(f))
    f.chmod(0o600)
    assert load_tokens(str(f))["a" * 24]["name"] == "alice"
    for bad in ({"short": {"name": "x"}}, {"b" * 24: {"scopes": []}}, ["x"], "nope"):
        f.write_text(json.dumps(bad))
        with pytest.raises(OSError):
            load_tokens(str(f))


def test_a_terminal_opened_from_the_menu_runs_the_cli(binder_lab):
    """On Binder, as a user meets it: File > New > Terminal in the lab, then `gpubudget
    submit` and `gpubudget jobs` with no set-up (the terminal's login shell resets PATH)."""
    from playwright.sync_api import sync_playwright

    from tests.e2e.test_new_user import terminal_runs_the_cli
    from tests.hub.hubproc import CHROMIUM, CHROMIUM_FLAGS, require_browser

    require_browser()
    url, token, proc, home = binder_lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(60_000)
            page.goto(f"{url}/lab?token={token}")
            page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
            terminal_runs_the_cli(page, home)
            page.screenshot(path=str(home / "binder-terminal.png"))
        finally:
            browser.close()
