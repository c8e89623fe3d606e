"""Security review (high): ``LocalBackend.allowed_commands`` bypassed through the job's own ``env``:
``PATH=/evil:…`` ran ``/evil/sleep``, ``PYTHONPATH`` ran a ``sitecustomize.py``, ``LD_PRELOAD``
loaded a shared object, ``GPUBUDGET_WORKDIR`` pointed the job at the attacker's files.

Each attack is refused at submission (400 naming the variable) and never runs: the attacker's
programs would leave a marker file, and none appears."""

from __future__ import annotations

import os
import time

import pytest

from jupyter_gpubudget.ledger import Ledger, connect
from tests.fixtures.hub import http
from tests.fixtures.unixusers import shared_tmp

from .conftest import require_root, wait_state

ALLOWED = ["sleep [0-9]+", "/usr/bin/sleep [0-9]+", "python3 train\\.py"]


@pytest.fixture
def evil():
    """An attacker's directory: a fake ``sleep``, a ``sitecustomize.py`` and a ``train.py``
    that each write a marker when they run."""
    require_root()
    d = shared_tmp("gpubudget-evil-")
    marker = d / "pwned"
    (d / "sleep").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (d / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (d / "train.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    for f in d.iterdir():
        f.chmod(0o755)
    d.chmod(0o777)  # any job user may write the marker
    return d


ATTACKS = [
    ({"command": "sleep 1", "env": {"PATH": "{evil}:/usr/bin:/bin"}}, "env.PATH"),
    ({"command": "python3 train.py", "env": {"PYTHONPATH": "{evil}"}}, "env.PYTHONPATH"),
    ({"command": "sleep 1", "env": {"LD_PRELOAD": "{evil}/evil.so"}}, "env.LD_PRELOAD"),
    ({"command": "python3 train.py", "env": {"GPUBUDGET_WORKDIR": "{evil}"}},
     "env.GPUBUDGET_WORKDIR"),
    ({"command": "sleep 1", "env": {"BASH_ENV": "{evil}/sleep"}}, "env.BASH_ENV"),
    ({"command": "sleep 1", "env": {"ld_preload": "{evil}/evil.so"}}, "env.ld_preload"),
    ({"command": "sleep 1", "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}},
     "env.CUDA_VISIBLE_DEVICES"),
    ({"command": ["{evil}/sleep", "1"]}, "command"),
    ({"command": ["../../{evil}/sleep", "1"]}, "command[0]"),
    ({"command": ["sleep", "1", "; touch {evil}/pwned"]}, "command"),
]


def test_env_and_path_tricks_are_refused_and_never_run(service_factory, tokens, evil):
    svc = service_factory(*[f"--LocalBackend.allowed_commands={p}" for p in ALLOWED])
    bob = tokens["bob"]
    before = len(http("GET", svc.api + "/jobs", bob)[1]["jobs"])
    for body, field in ATTACKS:
        job = {"project": "lattice", "gpus": 0, **body}
        job = {k: (v.replace("{evil}", str(evil)) if isinstance(v, str) else
                   [x.replace("{evil}", str(evil)) for x in v] if isinstance(v, list) else
                   {k2: v2.replace("{evil}", str(evil)) for k2, v2 in v.items()}
                   if isinstance(v, dict) else v)
               for k, v in job.items()}
        status, out = http("POST", svc.api + "/jobs", bob, job)
        assert status == 400, (job, status, out)
        assert out["field"] == field, (job, out)
    assert len(http("GET", svc.api + "/jobs", bob)[1]["jobs"]) == before  # nothing stored
    time.sleep(1.0)  # several cycles: had anything been accepted, it would have run
    assert not (evil / "pwned").exists()


def test_a_program_name_is_resolved_before_matching_and_runs_from_there(service_factory,
                                                                         tokens, evil):
    svc = service_factory(*[f"--LocalBackend.allowed_commands={p}" for p in ALLOWED])
    bob = tokens["bob"]
    status, job = http("POST", svc.api + "/jobs", bob,
                       {"command": ["sleep", "0"], "project": "lattice", "gpus": 0})
    assert status == 201, job
    led = Ledger(connect(svc.db_url, read_only=True))
    try:  # what was matched is what is stored and run
        assert led.get(job["id"]).command == ["/usr/bin/sleep", "0"]
    finally:
        led.dispose()
    assert wait_state(svc, bob, job["id"], ("done", "failed"))["state"] == "done"
    # a job cannot pick its working directory: it starts in its user's home
    status, job = http("POST", svc.api + "/jobs", bob,
                       {"command": "python3 train.py", "project": "lattice", "gpus": 0})
    assert status == 201, job
    w = wait_state(svc, bob, job["id"], ("done", "failed"))
    assert w["state"] == "failed"  # no train.py in bob's home: the attacker's never ran
    assert not (evil / "pwned").exists()
    out = (svc.dir / "jobs" / job["id"] / "1" / "output.log").read_text()
    assert "train.py" in out and os.path.basename(str(evil)) not in out
