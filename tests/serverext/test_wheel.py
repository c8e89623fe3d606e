"""The wheel as a user gets it: built from this tree, installed with pip into a fresh venv with
no Node.js on PATH, JupyterLab lists the extension as enabled, the server extension is enabled,
and a JupyterLab started from that venv serves both."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.hub import free_port, wait_http
from tests.hub.hubproc import require

ROOT = Path(__file__).resolve().parents[2]
LAB = "share/jupyter/labextensions/jupyter-gpubudget"


def _run(cmd: list[str], env: dict | None = None, timeout: float = 600) -> str:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout + p.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    built = (ROOT / "jupyter_gpubudget" / "labextension" / "package.json").exists()
    require(built or shutil.which("npm") is not None,
            "the built lab extension (make lab) or npm to build it")
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)])
    (whl,) = out.glob("jupyter_gpubudget-*.whl")
    return whl


def test_the_wheel_carries_the_prebuilt_extension_and_the_server_config(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    data = [n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n]
    assert f"{LAB}/package.json" in data and f"{LAB}/install.json" in data
    assert any(re.fullmatch(rf"{LAB}/static/remoteEntry\.[0-9a-f]+\.js", n) for n in data)
    assert f"{LAB}/schemas/jupyter-gpubudget/plugin.json" in data
    assert "etc/jupyter/jupyter_server_config.d/jupyter_gpubudget.json" in data
    assert "jupyter_gpubudget/serverext/budget.py" in names
    assert not [n for n in names if "node_modules" in n or n.startswith("jupyter_gpubudget/labextension/")]
    pkg = json.loads(zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(f"{LAB}/package.json"))))
    assert pkg["name"] == "jupyter-gpubudget" and pkg["jupyterlab"]["_build"]["load"]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("venv") / "v"
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", str(d)])
    bin_ = d / "bin"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JUPYTER", "GPUBUDGET_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(PATH=str(bin_), HOME=str(d / "home"), JUPYTER_PLATFORM_DIRS="1")
    assert shutil.which("node", path=env["PATH"]) is None  # no Node.js, as a user may have
    assert shutil.which("npm", path=env["PATH"]) is None
    import jupyterlab

    _run([str(bin_ / "python"), "-m", "pip", "install", "-q", str(wheel),
          f"jupyterlab=={jupyterlab.__version__}"], env=env)
    return d, env


def test_pip_install_without_node_enables_both_extensions(venv):
    d, env = venv
    labs = _run([str(d / "bin" / "jupyter"), "labextension", "list"], env=env)
    line = next((ln for ln in labs.splitlines() if "jupyter-gpubudget" in ln), "")
    plain = re.sub(r"\x1b\[[0-9;]*m", "", line)
    assert re.search(r"jupyter-gpubudget v\d+\.\d+\.\d+ enabled OK \(python, jupyter-gpubudget\)",
                     plain), labs
    assert str(d) in labs  # installed into the fresh venv, not found elsewhere
    servers = re.sub(r"\x1b\[[0-9;]*m", "", _run([str(d / "bin" / "jupyter"), "server",
                                                   "extension", "list"], env=env))
    assert re.search(r"jupyter_gpubudget\.serverext enabled", servers), servers
    assert re.search(r"jupyter_gpubudget\.serverext\s+OK", servers), servers


def test_jupyterlab_from_that_venv_serves_the_extension_and_the_api(venv, tmp_path):
    d, env = venv
    port = free_port()
    args = [str(d / "bin" / "jupyter"), "lab", f"--port={port}", "--ip=127.0.0.1",
            "--no-browser", "--IdentityProvider.token=t0ken", f"--ServerApp.root_dir={tmp_path}"]
    if os.geteuid() == 0:
        args.append("--allow-root")
    log = tmp_path / "lab.log"
    proc = subprocess.Popen(args, env=env, stdout=open(log, "ab"),  # noqa: SIM115
                            stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}/"
        wait_http(base + "api/status", proc=proc, log=log)

        def get(path: str) -> bytes:
            req = urllib.request.Request(base + path, headers={"Authorization": "token t0ken"})
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.read()

        page = get("lab").decode()
        config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page,
                                      re.S).group(1))
        ext = next(e for e in config["federated_extensions"] if e["name"] == "jupyter-gpubudget")
        assert get(f"lab/extensions/jupyter-gpubudget/{ext['load']}").startswith(b"var ")
        info = json.loads(get("gpubudget/api/info"))
        # outside JupyterHub: the extension says so instead of failing
        assert info["service"]["configured"] is False and info["session"] is None
        assert "GPUBUDGET_URL" in info["service"]["message"]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
