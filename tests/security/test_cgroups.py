"""Containment (``jupyter_gpubudget/launcher/cgroups.py``): its pure helpers
on their own, the real cgroup v2 filesystem as root, and the launcher failing closed when no
cgroup can be made (nothing starts, and the error says why and what to configure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpubudget.hub import demo_setup
from jupyter_gpubudget.launcher import cgroups
from jupyter_gpubudget.launcher.config import LauncherError, make_config
from tests.fixtures.unixusers import PREFIX, ensure_accounts, shared_tmp

from .conftest import require_root

HYBRID = """\
25 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
35 33 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,memory
"""
PURE_V2 = ("35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 "
           "cgroup2 rw,nsdelegate,memory_recursiveprot\n")
ESCAPED = r"36 24 0:31 / /srv/my\040cgroups rw,relatime - cgroup2 none rw" + "\n"


def test_the_cgroup2_mount_is_found_in_mountinfo():
    assert cgroups.cgroup2_mounts(HYBRID) == ["/sys/fs/cgroup/unified"]
    assert cgroups.default_root(HYBRID) == "/sys/fs/cgroup/unified/gpubudget"
    assert cgroups.default_root(PURE_V2) == "/sys/fs/cgroup/gpubudget"
    assert cgroups.cgroup2_mounts(ESCAPED) == ["/srv/my cgroups"]
    v1_only = "\n".join(line for line in HYBRID.splitlines() if "cgroup2" not in line)
    assert cgroups.default_root(v1_only) is None
    with pytest.raises(cgroups.ContainmentError, match="no cgroup v2 filesystem"):
        cgroups.find_root("", mountinfo=v1_only)
    with pytest.raises(cgroups.ContainmentError, match="cgroup_root: 'rel' is not an absolute path"):
        cgroups.find_root("rel")
    assert cgroups.find_root("/x/y/", mountinfo="") == Path("/x/y")


def test_names_events_and_procs():
    assert cgroups.job_name("a1b2", 3) == "job.a1b2.3"
    assert cgroups.session_name(1001, "ab12") == "session.1001.ab12"
    for bad in ("../x", "a/b", "a b"):
        with pytest.raises(cgroups.ContainmentError):
            cgroups.job_name(bad, 1)
    assert cgroups.parse_events("populated 1\nfrozen 0\n") == {"populated": 1, "frozen": 0}
    assert cgroups.parse_procs("12\n345\n") == [12, 345]


def test_the_launcher_config_names_the_field():
    assert make_config("/j").contain and make_config("/j").cgroup_root == ""
    with pytest.raises(LauncherError, match="cgroup_root: expected an absolute path"):
        make_config("/j", {"cgroup_root": "relative"})
    with pytest.raises(LauncherError, match="contain: expected true or false"):
        make_config("/j", {"contain": "no"})


def test_a_real_cgroup_holds_and_kills_a_process_that_left_its_session(tmp_path):
    require_root()
    root = cgroups.find_root() / f"test-{os.getpid()}"
    cg = cgroups.prepare(root, "job.t.1")
    try:
        proc = subprocess.Popen(["sh", "-c", "setsid sleep 300 & setsid -f sleep 301"],
                                preexec_fn=lambda: cgroups.join(cg))
        proc.wait()  # the shell is gone; what it started in new sessions is not
        assert cgroups.populated(cg) and cgroups.pids(cg)
        assert cgroups.end(cg, timeout=30)
        assert not cgroups.populated(cg) and not cg.exists()
    finally:
        cgroups.end(cg, timeout=30)
        os.rmdir(root)


def test_the_launcher_fails_closed_without_a_cgroup():
    require_root()
    ensure_accounts(["bob"])
    base = shared_tmp("gpubudget-cgroups-")
    cfg = demo_setup.launcher_config(base, base / "jobs", demo_setup.SERVICE_USER)
    raw = json.loads(cfg.read_text())
    raw["cgroup_root"] = str(base / "not-a-cgroup")  # a plain directory: no cgroup there
    cfg.write_text(json.dumps(raw))
    spec = {"workload": "nocg", "attempt": 1, "user": PREFIX + "bob",
            "command": ["/bin/sleep", "30"]}
    r = subprocess.run([sys.executable, "-I", "-m", "jupyter_gpubudget.launcher", "--config",
                        str(cfg), "launch"], input=json.dumps(spec).encode(),
                       capture_output=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    out = json.loads(r.stdout.decode().strip().splitlines()[-1])
    assert r.returncode == 2, out
    assert out["error"].startswith("containment: the job was not started")
    assert "not in a cgroup v2 filesystem" in out["error"] and "UNSAFE" in out["error"]
    assert not (base / "jobs" / "nocg" / "1").exists()
