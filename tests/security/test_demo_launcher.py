"""Found by attacking the demo hub: its launcher config allowed no groups in particular, so the
service's Unix account (through its sudoers line) could start a job as *any* account with
uid >= 1000 on the machine, not only the demo's users. The demo's config allows only the
demo users' group (``gpubudget-users``); an account outside it is refused by the launcher.

Against the real demo hub run as root (``hub_config/jupyterhub_config.py``), as the service's
account would attack it: ``sudo`` the launcher with a job for another account."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from jupyter_gpubudget.hub.demo_setup import DEMO_PREFIX, SERVICE_USER, USERS_GROUP
from tests.fixtures.unixusers import PREFIX, ensure_accounts
from tests.hub.hubproc import require, start_demo_hub

from .conftest import require_root

OUTSIDER = PREFIX + "outsider"  # a regular account (uid >= 1000), not a demo user


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    require_root()
    ensure_accounts(["outsider"])
    hub = start_demo_hub(tmp_path_factory.mktemp("demolauncher"))
    try:
        require("ISOLATION IS OFF" not in hub.log.read_text(),
                "an isolated demo hub (the hub's log says isolation is off: "
                + (re.findall(r"ISOLATION IS OFF \((.*?)\)", hub.log.read_text()) or [""])[0]
                + ")")
        yield hub
    finally:
        hub.stop()


def launch_as_service(config: str, spec: dict) -> tuple[int, dict]:
    """What the service's account may run as root: its sudoers line, the pinned config."""
    r = subprocess.run(["setpriv", f"--reuid={SERVICE_USER}", f"--regid={SERVICE_USER}",
                        "--init-groups", "--", "sudo", "-n", sys.executable, "-I", "-m",
                        "jupyter_gpubudget.launcher", "--config", config, "launch"],
                       input=json.dumps(spec), capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin"})
    lines = r.stdout.strip().splitlines()
    assert lines, (r.returncode, r.stderr)
    return r.returncode, json.loads(lines[-1])


def test_the_service_account_starts_jobs_only_as_demo_users(demo):
    config = str((demo.dir / "state").resolve() / "launcher.json")
    rc, out = launch_as_service(config, {"workload": "outsider-1", "attempt": 1,
                                         "user": OUTSIDER, "command": ["/bin/true"]})
    assert rc == 2 and out["error"].startswith("user:") and USERS_GROUP in out["error"], out
    assert not ((demo.dir / "state").resolve() / "jobs" / "outsider-1").exists()
    with open(config) as f:
        assert json.load(f).get("allowed_groups") == [USERS_GROUP]

    # the demo's own users still run jobs
    rc, out = launch_as_service(config, {"workload": "demo-user-1", "attempt": 1,
                                         "user": DEMO_PREFIX + "bob", "command": ["/bin/true"]})
    assert rc == 0, out
