"""`gpubudget` inside the lab: on the demo hub (the project's own hub_config, demo budgets and
inventory), a user's server is spawned; the CLI is then run exactly as a JupyterLab terminal
of that server runs it — the server process's own environment (read from /proc), its working
directory, `gpubudget` found on that environment's PATH, no other set-up — and the job example
of docs/service.md is submitted as written, listed, its output read and followed, and another
job cancelled."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.hub.hubproc import http, start_demo_hub

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    h = start_demo_hub(tmp_path_factory.mktemp("labcli"))
    yield h
    h.stop()


def docs_job_example() -> str:
    """The job YAML of docs/service.md, as written."""
    text = (ROOT / "docs" / "service.md").read_text()
    after = text[text.index("A job (REST body or `gpubudget submit job.yaml`)"):]
    return re.search(r"```yaml\n(.*?)```", after, re.S).group(1)


def test_the_cli_works_in_the_users_server_with_no_setup(demo, tmp_path):
    st, body = http("POST", f"{demo.api}/users/alice/server", demo.token,
                    {"project": "lattice-qcd", "slice": "mig:1g.10gb", "min_runtime": "1h"})
    assert st in (201, 202), body
    demo.wait_ready("alice")
    env = demo.server_env("alice")  # what a terminal of this server inherits
    st, u = http("GET", f"{demo.api}/users/alice", demo.token)
    pid = u["servers"][""]["state"]["child_state"]["pid"]
    cwd = Path(f"/proc/{pid}/cwd").resolve()
    exe = shutil.which("gpubudget", path=env["PATH"])
    assert exe, f"gpubudget is not on the server's PATH: {env['PATH']}"
    assert env.get("GPUBUDGET_URL") and env.get("JUPYTERHUB_API_TOKEN")

    def gpubudget(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([exe, *args], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=120)

    job = cwd / "job.yaml"
    job.write_text(docs_job_example())
    r = gpubudget("submit", "job.yaml")
    assert r.returncode == 0, r.stderr
    m = re.fullmatch(r"submitted (\S+) \((pending|running)\)\n", r.stdout)
    assert m, r.stdout
    wid = m.group(1)
    r = gpubudget("logs", wid, "--follow", "--interval=0.2")
    assert r.returncode == 0, r.stderr
    # the demo's declared inventory: stable declared ids, not CUDA indices
    assert re.fullmatch(r"training on GPUs GPU-[\w-]+-\d+,GPU-[\w-]+-\d+\n", r.stdout), r.stdout
    assert f"job {wid} done" in r.stderr
    r = gpubudget("jobs")
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith(wid))
    assert "done" in row and "lattice-qcd" in row and "sweep-3" in row and "exit 0" in row

    # the job ran as the user, charged to the project, with what the file asked for
    w = http("GET", f"{demo.svc}/workloads/{wid}", demo.token)[1]
    assert (w["user"], w["project"], w["request"]["gpus"], w["min_runtime"]) == \
        ("alice", "lattice-qcd", 2, 7200)

    # a long job: followed while it runs, then cancelled from another "terminal"
    (cwd / "long.yaml").write_text("command: 'for i in 1 2 3 4 5 6 7 8 9; do echo tick $i; "
                                   "sleep 1; done'\nproject: lattice-qcd\ngpus: 1\n"
                                   "name: long\n")
    r = gpubudget("submit", "long.yaml")
    assert r.returncode == 0, r.stderr
    long_id = r.stdout.split()[1]
    follow = subprocess.Popen([exe, "logs", long_id, "-f", "--interval=0.2"], env=env, cwd=cwd,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while "tick 2" not in (gpubudget("logs", long_id).stdout):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    r = gpubudget("cancel", long_id)
    assert r.returncode == 0 and r.stdout == f"cancelled {long_id}\n", r.stderr
    out, err = follow.communicate(timeout=30)
    assert follow.returncode == 0, err
    assert out.startswith("tick 1\ntick 2\n") and "tick 9" not in out, out
    assert f"job {long_id} cancelled" in err
    assert http("GET", f"{demo.svc}/workloads/{long_id}", demo.token)[1]["state"] == "cancelled"

    # the server's token is alice's: someone else's (dana's) job is refused, nothing changes
    st, tok = http("POST", f"{demo.api}/users/dana/tokens", demo.token, {"note": "test"})
    assert st == 201, tok
    st, other = http("POST", f"{demo.svc}/jobs", tok["token"],
                     {"command": "sleep 30", "project": "genomics", "gpus": 0, "name": "other"})
    assert st == 201, other
    for cmd in (("cancel", other["id"]), ("logs", other["id"])):
        r = gpubudget(*cmd)
        assert r.returncode == 1 and "403" in r.stderr and "another user" in r.stderr, r.stderr
    assert http("GET", f"{demo.svc}/workloads/{other['id']}", demo.token)[1]["state"] in (
        "pending", "running")
    http("DELETE", f"{demo.svc}/jobs/{other['id']}", demo.token)
    http("DELETE", f"{demo.api}/users/alice/server", demo.token)
