"""Attacks on batch jobs' transparent checkpoints (the launcher's ``checkpoint`` verb and a
launch that restores), with the real CRIU and the real launcher, jobs running as the attacker's
account of ``test_criu_helper`` (its fixture):

- a job holding a setuid child (``sleep | passwd``): never dumped, nothing left in /dev/shm,
  the job not left stopped, the reason in its log;
- a file the job held read-write swapped for a symlink to root's file between its dump and its
  restore: the restore is refused (CRIU opens the name as the job's account), root's file is
  unchanged, nothing of the attacker's holds it, and the job starts again saying why;
- another account's checkpoint handed to a job of the attacker: refused (the images' tasks
  must all be the job's account's); the attacker's job runs its own command from the start.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.hub import demo_setup
from tests.fixtures.unixusers import PREFIX, ensure_accounts, shared_tmp
from tests.hub.hubproc import require

from .test_criu_helper import USER, attacker, shm_dumps  # noqa: F401 - the fixture

PY = sys.executable


@pytest.fixture(scope="module")
def nodes(attacker):  # noqa: F811
    demo_setup.ensure_service_user()
    out = []
    for name in ("a", "b"):
        base = shared_tmp(f"gbt-job-attack-{name}-")
        jobs = base / "jobs"
        out.append({"jobs": jobs, "cfg": demo_setup.launcher_config(
            base, jobs, demo_setup.SERVICE_USER)})
    return out


#: (config, workload, attempt) of every launch: stopped after each test, whatever happened
LAUNCHED: list[tuple[Path, str, int]] = []


@pytest.fixture(autouse=True)
def _stop_jobs():
    yield
    while LAUNCHED:
        cfg, wid, attempt = LAUNCHED.pop()
        launcher(cfg, "signal", wid, str(attempt), "1")


def launcher(cfg: Path, verb: str, *args: str, spec: dict | None = None) -> tuple[int, dict]:
    if verb == "launch" and spec:
        LAUNCHED.append((cfg, spec["workload"], spec["attempt"]))
    r = subprocess.run([PY, "-I", "-m", "jupyter_gpubudget.launcher", "--config", str(cfg),
                        verb, *args], input=json.dumps(spec or {}).encode(),
                       capture_output=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    return r.returncode, json.loads(r.stdout.decode().strip().splitlines()[-1])


def wait_for(cond, timeout: float = 30.0):  # noqa: ANN001, ANN201
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def counts(path: Path) -> list[int]:
    return [int(x) for x in re.findall(r"^(\d+)$", path.read_text(), re.M)]


def counter(open_file: str | None = None) -> list[str]:
    pre = f"f = open({open_file!r}, 'r+')\n" if open_file else ""
    return ["/usr/bin/python3", "-c", pre + "import time\ni = 0\nwhile True:\n"
            "    print(i, flush=True)\n    i += 1\n    time.sleep(0.02)\n"]


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def holders(path: Path, uid: int) -> list[int]:
    """Processes of ``uid`` holding ``path`` open."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            if os.stat(f"/proc/{p}").st_uid != uid:
                continue
            for fd in os.listdir(f"/proc/{p}/fd"):
                if os.readlink(f"/proc/{p}/fd/{fd}") == str(path):
                    out.append(int(p))
        except OSError:
            continue
    return out


def test_a_job_with_a_setuid_child_is_never_dumped(nodes, attacker):  # noqa: F811
    require(os.path.exists("/usr/bin/passwd") and os.stat("/usr/bin/passwd").st_mode & 0o4000,
            "a setuid /usr/bin/passwd")
    a = nodes[0]
    before = shm_dumps()
    wid = f"as{os.getpid():x}"
    rc, out = launcher(a["cfg"], "launch", spec={
        "workload": wid, "attempt": 1, "user": USER, "grace": 1,
        "command": ["/bin/sh", "-c", "echo started; sleep 1000 | passwd"]})
    assert rc == 0, out
    adir = a["jobs"] / wid / "1"
    wait_for(lambda: "started" in (adir / "output.log").read_text())
    time.sleep(0.5)  # passwd has started (setuid root)
    rc, ck = launcher(a["cfg"], "checkpoint", wid, "1")
    assert rc == 0 and ck["checkpointed"] is False, ck
    assert "uids" in ck["reason"] and "not dumped" in ck["reason"], ck
    assert shm_dumps() == before  # nothing of root's memory written anywhere
    assert state(out["pid"]) != "T"  # not left stopped
    assert "could not be checkpointed" in (adir / "output.log").read_text()
    assert not (adir / "checkpointing").exists()
    rc, sig = launcher(a["cfg"], "signal", wid, "1", "1")
    assert rc == 0 and sig["signalled"] and not sig["exit"]["checkpointed"]


def test_a_swapped_symlink_is_refused_at_restore_and_roots_file_is_unchanged(nodes,
                                                                            attacker):  # noqa: F811
    pw = attacker
    a, b = nodes
    d = shared_tmp("gbt-job-symlink-")
    victim = d / "root-owned.conf"
    victim.write_text("root's own configuration line\n")
    os.chmod(victim, 0o644)
    before = victim.read_bytes()
    own = d / "mine"
    own.mkdir()
    os.chown(own, pw.pw_uid, pw.pw_gid)
    mine = own / "notes.txt"
    mine.write_text("x" * len(before))
    os.chown(mine, pw.pw_uid, pw.pw_gid)
    wid = f"al{os.getpid():x}"
    rc, out = launcher(a["cfg"], "launch", spec={
        "workload": wid, "attempt": 1, "user": USER, "command": counter(str(mine))})
    assert rc == 0, out
    log1 = a["jobs"] / wid / "1" / "output.log"
    wait_for(lambda: len(counts(log1)) > 3)
    rc, ck = launcher(a["cfg"], "checkpoint", wid, "1")
    assert rc == 0 and ck["checkpointed"], ck
    rc, _ = launcher(a["cfg"], "checkpoint-end", wid, "1", "kill")
    assert rc == 0
    # the attack: the file its job held read-write is now a symlink to root's file
    mine.unlink()
    os.symlink(victim, mine)
    os.lchown(mine, pw.pw_uid, pw.pw_gid)
    try:
        rc, out = launcher(b["cfg"], "launch", spec={
            "workload": wid, "attempt": 2, "user": USER, "command": counter(str(mine)),
            "restore": {"images_dir": ck["images_dir"], "log": str(log1)}})
    finally:
        subprocess.run(["rm", "-rf", ck["images_dir"]], check=False)
    adir2 = b["jobs"] / wid / "2"
    wait_for(lambda: (adir2 / "exit").exists())  # started again: its open() is refused
    assert "could not be restored" in (adir2 / "output.log").read_text()
    assert "not restored" in (adir2 / "launcher.log").read_text()
    assert holders(victim, pw.pw_uid) == []
    assert victim.read_bytes() == before


def test_another_accounts_checkpoint_is_not_restored_as_the_attackers_job(nodes,
                                                                          attacker):  # noqa: F811
    a, b = nodes
    ensure_accounts(["bob"])
    wid = f"ao{os.getpid():x}"
    rc, out = launcher(a["cfg"], "launch", spec={
        "workload": wid, "attempt": 1, "user": PREFIX + "bob", "command": counter()})
    assert rc == 0, out
    log1 = a["jobs"] / wid / "1" / "output.log"
    wait_for(lambda: len(counts(log1)) > 50)
    rc, ck = launcher(a["cfg"], "checkpoint", wid, "1")
    assert rc == 0 and ck["checkpointed"], ck
    launcher(a["cfg"], "checkpoint-end", wid, "1", "kill")
    try:  # bob's images handed to a job of the attacker
        rc, out = launcher(b["cfg"], "launch", spec={
            "workload": wid, "attempt": 2, "user": USER, "command": counter(),
            "restore": {"images_dir": ck["images_dir"], "log": str(log1)}})
        assert rc == 0, out
    finally:
        subprocess.run(["rm", "-rf", ck["images_dir"]], check=False)
    log2 = b["jobs"] / wid / "2" / "output.log"
    wait_for(lambda: len(counts(log2)) > 2)
    # its own command from its start: nothing of bob's count (past 50 when it was dumped)
    assert counts(log2)[0] < 50 <= counts(log1)[-1], log2.read_text()[:600]
    assert "not only" in (b["jobs"] / wid / "2" / "launcher.log").read_text()
    assert os.stat(f"/proc/{out['pid']}").st_uid == attacker.pw_uid
    launcher(b["cfg"], "signal", wid, "2", "1")
