"""Security review (medium): another Unix user read a job's output and a ``WANDB_API_KEY`` from
``ledger.sqlite`` / ``-wal``. The ledger (with -wal and -shm), the job folders and their logs
are created 0600/0700 (0640/0750 for the service's group when it has one); checked by reading
them as another Unix account."""

from __future__ import annotations

import os
import stat
import subprocess

from tests.fixtures.hub import http
from tests.fixtures.unixusers import PREFIX, ensure_accounts, shared_tmp

from .conftest import require_root, wait_state

SECRET = "wandb-secret-4b1d"


def as_user(user: str, argv: list[str]) -> subprocess.CompletedProcess:
    """Run ``argv`` as another Unix account (no supplementary groups)."""
    return subprocess.run(["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups",
                           "--", *argv], capture_output=True, text=True, timeout=30)


def test_ledger_and_job_files_are_private(service_factory, tokens):
    require_root()
    ensure_accounts(["mallory"])
    d = shared_tmp("gpubudget-modes-")  # every directory above is searchable by others
    svc = service_factory(directory=d)
    bob = tokens["bob"]
    status, job = http("POST", svc.api + "/jobs", bob, {
        "command": "echo my output is $WANDB_API_KEY", "project": "lattice", "gpus": 0,
        "env": {"WANDB_API_KEY": SECRET}})
    assert status == 201, job
    assert wait_state(svc, bob, job["id"], ("done", "failed"))["state"] == "done"
    adir = d / "jobs" / job["id"] / "1"
    assert SECRET in (adir / "output.log").read_text()

    ledger = [d / "ledger.sqlite", d / "ledger.sqlite-wal", d / "ledger.sqlite-shm"]
    files = [p for p in ledger if p.exists()] + [adir / "output.log", adir / "exit", adir / "pid"]
    assert d / "ledger.sqlite" in files and d / "ledger.sqlite-wal" in files
    for p in files:
        mode = stat.S_IMODE(os.stat(p).st_mode)
        assert mode & 0o077 == 0, f"{p} is {mode:04o}"
    for p in (d / "jobs", d / "jobs" / job["id"], adir):
        mode = stat.S_IMODE(os.stat(p).st_mode)
        assert mode & 0o077 == 0, f"{p} is {mode:04o}"

    mallory = PREFIX + "mallory"
    for p in files:
        r = as_user(mallory, ["cat", str(p)])
        assert r.returncode != 0 and "Permission denied" in r.stderr, (p, r)
        assert SECRET not in r.stdout
    r = as_user(mallory, ["ls", str(d / "jobs")])
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    r = as_user(mallory, ["grep", "-r", SECRET, str(d)])
    assert SECRET not in r.stdout, r.stdout
