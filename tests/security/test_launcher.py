"""The privileged launcher as an attacker holding the service's Unix account would use it
(security review, high: the service runs unprivileged; only the launcher runs as root, through a
sudoers line that pins its config). The launcher must not let that account become root: no
job as root or a system account, no write outside the jobs root, the spec checked again, the
records unforgeable by jobs, and only process groups it launched are signalled."""

from __future__ import annotations

import json
import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.hub import demo_setup
from tests.fixtures.unixusers import PREFIX, ensure_accounts, shared_tmp

from .conftest import require_root
from .test_file_modes import as_user

PY = sys.executable
BOB = PREFIX + "bob"


@pytest.fixture(scope="module")
def setup():
    require_root()
    svc = demo_setup.ensure_service_user()
    ensure_accounts(["bob"])
    base = shared_tmp("gpubudget-launcher-")
    jobs = base / "jobs"
    cfg = demo_setup.launcher_config(base, jobs, demo_setup.SERVICE_USER)
    return {"base": base, "jobs": jobs, "cfg": cfg, "svc": svc}


def launcher(cfg: Path, verb: str, *args: str, spec: dict | None = None,
             env: dict | None = None) -> tuple[int, dict]:
    r = subprocess.run([PY, "-I", "-m", "jupyter_gpubudget.launcher", "--config", str(cfg),
                        verb, *args], input=json.dumps(spec or {}).encode(),
                       capture_output=True, timeout=60, env=env or {"PATH": "/usr/bin:/bin"})
    return r.returncode, json.loads(r.stdout.decode().strip().splitlines()[-1])


def job_spec(workload: str, **kw: object) -> dict:
    return {"workload": workload, "attempt": 1, "user": BOB, "command": ["/bin/sleep", "30"],
            **kw}


def test_no_job_as_root_a_system_account_or_the_service(setup):
    for user in ("root", "daemon", "nobody", demo_setup.SERVICE_USER, "no-such-user"):
        s = job_spec("u-" + user.replace("-", ""), user=user)
        rc, out = launcher(setup["cfg"], "launch", spec=s)
        assert rc == 2 and out["error"].startswith("user:"), (user, out)
    assert not any(setup["jobs"].glob("u-*/1/pid"))


def test_the_spec_is_checked_again(setup):
    bad = [
        job_spec("s1", env={"LD_PRELOAD": "/tmp/x.so"}),
        job_spec("s2", env={"PATH": "/tmp"}),
        job_spec("s3", env={"GPUBUDGET_WORKDIR": "/etc"}),
        job_spec("s4", job_env={"LD_PRELOAD": "/tmp/x.so"}),
        job_spec("s5", command=["sleep", "30"]),  # not absolute
        job_spec("s6", workdir="/etc"),  # the job never chooses its directory
        job_spec("../../etc"),
        job_spec("s8", attempt=0),
        job_spec("s9", command=["/bin/echo", "x" * 100_000]),
    ]
    for s in bad:
        rc, out = launcher(setup["cfg"], "launch", spec=s)
        assert rc == 2 and "error" in out, (s, out)
        assert not (setup["jobs"] / str(s["workload"])).exists()
    assert not Path("/etc/1").exists()


def test_records_are_roots_and_the_job_can_neither_forge_nor_signal_them(setup):
    rc, out = launcher(setup["cfg"], "launch", spec=job_spec("r1", command=[
        "/bin/sh", "-c", "echo secret-output; sleep 30"]))
    assert rc == 0, out
    adir = setup["jobs"] / "r1" / "1"
    gid = setup["svc"].pw_gid
    deadline = time.monotonic() + 10
    while "secret-output" not in (adir / "output.log").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for p in (setup["jobs"], setup["jobs"] / "r1", adir):
        st = os.stat(p)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, gid, 0o750), p
    for name in ("pid", "output.log", "launcher.log"):
        st = os.stat(adir / name)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, gid, 0o640), name
    rec = json.loads((adir / "pid").read_text())
    assert rec["user"] == BOB and rec["uid"] == pwd.getpwnam(BOB).pw_uid != 0
    # the job's user: cannot read its records, forge its exit, or stop its monitor
    for argv in (["cat", str(adir / "output.log")],
                 ["sh", "-c", f"echo '{{\"exit_code\": 0}}' > {adir / 'exit'}"],
                 ["kill", "-KILL", str(rec["monitor_pid"])]):
        r = as_user(BOB, argv)
        assert r.returncode != 0, (argv, r)
    assert not (adir / "exit").exists()
    # the service's user: reads them, but writes nothing there
    svc_user = demo_setup.SERVICE_USER
    assert "secret-output" in as_user(svc_user, ["cat", str(adir / "output.log")]).stdout
    for argv in (["sh", "-c", f"echo x > {adir / 'exit'}"],
                 ["sh", "-c", f"echo x > {setup['jobs'] / 'planted'}"],
                 ["kill", "-TERM", str(rec["pid"])]):
        r = as_user(svc_user, argv)
        assert r.returncode != 0, (argv, r)
    rc, out = launcher(setup["cfg"], "signal", "r1", "1", "2")
    assert rc == 0 and out["signalled"] and out["exit"]["signal"] == signal.SIGTERM, out
    rc, out = launcher(setup["cfg"], "launch", spec=job_spec("r1"))  # launched once only
    assert rc == 2 and "already" in out["error"]


def test_only_groups_it_launched_are_signalled(setup):
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        from jupyter_gpubudget.launcher.records import proc_starttime

        start = proc_starttime(victim.pid)
        # a record naming the victim with another start time (the pid was reused)
        adir = setup["jobs"] / "v1" / "1"
        adir.mkdir(parents=True)
        rec = {"pid": victim.pid, "pgid": victim.pid, "start": "1", "uid": 0,
               "monitor_pid": victim.pid, "monitor_start": "1"}
        (adir / "pid").write_text(json.dumps(rec))
        rc, out = launcher(setup["cfg"], "signal", "v1", "1", "1")
        assert rc == 0 and not out["signalled"], out
        # a record with the right start time, but not written by root (planted by the
        # service's account, were it able to write there)
        adir = setup["jobs"] / "v2" / "1"
        adir.mkdir(parents=True)
        rec.update(start=start, monitor_start=start)
        (adir / "pid").write_text(json.dumps(rec))
        os.chown(adir / "pid", setup["svc"].pw_uid, setup["svc"].pw_gid)
        rc, out = launcher(setup["cfg"], "signal", "v2", "1", "1")
        assert rc == 0 and not out["signalled"] and "launcher" in out["reason"], out
        assert victim.poll() is None  # untouched
    finally:
        victim.kill()
        victim.wait()


def test_config_and_arguments_come_from_root_only(setup, tmp_path):
    base = shared_tmp("gpubudget-badcfg-")
    svc = setup["svc"]
    cfg = base / "launcher.json"
    cfg.write_text(json.dumps({"jobs_root": "/etc/gpubudget-pwned"}))
    cfg.chmod(0o644)
    os.chown(cfg, svc.pw_uid, svc.pw_gid)  # the service's account wrote it
    rc, out = launcher(cfg, "launch", spec=job_spec("c1"))
    assert rc == 2 and "root" in out["error"], out
    os.chown(cfg, 0, 0)
    cfg.chmod(0o666)  # writable by anyone
    rc, out = launcher(cfg, "launch", spec=job_spec("c1"))
    assert rc == 2 and "root" in out["error"], out
    cfg.chmod(0o644)
    os.chown(base, svc.pw_uid, svc.pw_gid)  # in a directory the service's account owns
    rc, out = launcher(cfg, "launch", spec=job_spec("c1"))
    assert rc == 2 and "root" in out["error"], out
    assert not Path("/etc/gpubudget-pwned").exists()
    # under sudo, the jobs root never comes from the command line
    r = subprocess.run([PY, "-I", "-m", "jupyter_gpubudget.launcher", "--jobs-root",
                        "/etc/gpubudget-pwned", "launch"],
                       input=json.dumps(job_spec("c2")).encode(), capture_output=True,
                       env={"PATH": "/usr/bin:/bin", "SUDO_UID": "999"})
    assert r.returncode == 2 and b"config file" in r.stdout, r.stdout
    # arguments after the pinned ones cannot bring another config
    rc, out = launcher(setup["cfg"], "launch", "--config", str(cfg), spec=job_spec("c3"))
    assert rc == 2, out
    assert not Path("/etc/gpubudget-pwned").exists()


def test_through_sudo_as_the_service_user(setup):
    """The real path: the service's account runs the launcher with ``sudo -n``; the sudoers
    line allows exactly the pinned config, and ``python -I`` ignores a planted package in the
    working directory."""
    cfg = setup["cfg"]
    dropin = demo_setup.install_sudoers(demo_setup.SERVICE_USER, PY, cfg)
    plant = shared_tmp("gpubudget-plant-")
    marker = plant / "pwned"
    pkg = plant / "jupyter_gpubudget" / "launcher"
    pkg.mkdir(parents=True)
    (plant / "jupyter_gpubudget" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    os.chown(plant, setup["svc"].pw_uid, setup["svc"].pw_gid)
    svc_user = demo_setup.SERVICE_USER
    try:
        def sudo(*argv: str, stdin: dict | None = None) -> subprocess.CompletedProcess:
            return subprocess.run(
                ["setpriv", f"--reuid={svc_user}", f"--regid={svc_user}", "--init-groups",
                 "--", "sudo", "-n", PY, "-I", "-m", "jupyter_gpubudget.launcher", *argv],
                input=json.dumps(stdin or {}).encode(), capture_output=True, cwd=plant,
                timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(plant)})

        r = sudo("--config", str(cfg), "launch",
                 stdin=job_spec("sudo1", command=["/usr/bin/id", "-u"]))
        assert r.returncode == 0, (r.stdout, r.stderr)
        out = json.loads(r.stdout)
        assert out["user"] == BOB
        assert not marker.exists()  # the planted package never ran, as root or otherwise
        deadline = time.monotonic() + 10
        exit_rec = setup["jobs"] / "sudo1" / "1" / "exit"
        while not exit_rec.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert (setup["jobs"] / "sudo1" / "1" / "output.log").read_text().strip() == \
            str(pwd.getpwnam(BOB).pw_uid)
        # anything but the pinned config is refused by sudo itself
        for argv in (["--jobs-root", "/etc/gpubudget-pwned", "launch"],
                     ["--config", "/tmp/other.json", "launch"]):
            r = sudo(*argv, stdin=job_spec("sudo2"))
            assert r.returncode != 0 and not r.stdout, (argv, r.stdout, r.stderr)
        assert not Path("/etc/gpubudget-pwned").exists()
    finally:
        dropin.unlink(missing_ok=True)
