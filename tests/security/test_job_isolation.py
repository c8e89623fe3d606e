"""Security review: a batch job took over the hub. It ran as the service's Unix user (root) with
the service's environment: it printed ``JUPYTERHUB_API_TOKEN``, read ``spawner-token`` (admin
on gpubudget), then the cookie secret and ``jupyterhub.sqlite``, and forged an admin login.

Here the real demo hub (``hub_config/jupyterhub_config.py``, as ``make run`` starts it, as root)
runs a real job that tries all of that from inside: it must run as its user's own Unix account,
never root, with an allow-listed environment, and read none of the hub's, the service's or
another user's files. The notebook servers run as their users too."""

from __future__ import annotations

import json
import os
import pwd
import re
import stat
from pathlib import Path

import pytest

from jupyter_gpubudget.hub.demo_setup import DEMO_PREFIX, SERVICE_USER, demo_home_root
from jupyter_gpubudget.launcher.policy import SERVICE_ENV
from tests.hub.hubproc import DemoHub, http, require, start_demo_hub

from .conftest import require_root
from .test_file_modes import as_user

JOB_ENV_OK = {"HOME", "USER", "LOGNAME", "SHELL", "PATH", "LANG", "PWD", "SHLVL", "_", "OLDPWD",
              *SERVICE_ENV}

PROBE = r"""
echo "UID=$(id -u)"
echo "GROUPS=$(id -G)"
for f in "$@"; do
  if cat "$f" > /dev/null 2>&1; then echo "READ $f"; else echo "DENIED $f"; fi
done
rec="$JOBS/$GPUBUDGET_WORKLOAD/$GPUBUDGET_ATTEMPT"
if echo '{"exit_code": 0, "ended_at": 0}' > "$rec/exit" 2>/dev/null; then echo "FORGED exit";
else echo "DENIED write $rec/exit"; fi
if kill -KILL "$PPID" 2>/dev/null; then echo "KILLED monitor"; else echo "DENIED kill"; fi
if ls "$HOME/../demo-bob" > /dev/null 2>&1; then echo "READ bob's home";
else echo "DENIED bob's home"; fi
echo "--- env"
env
echo "--- end"
exit 7
"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    require_root()
    hub = start_demo_hub(tmp_path_factory.mktemp("isolation"))
    try:
        require("ISOLATION IS OFF" not in hub.log.read_text(),
                "an isolated demo hub (the hub's log says isolation is off: "
                + (re.findall(r"ISOLATION IS OFF \((.*?)\)", hub.log.read_text()) or [""])[0]
                + ")")
        yield hub
    finally:
        hub.stop()


def state(hub: DemoHub) -> Path:
    return (hub.dir / "state").resolve()


def service_pid(hub: DemoHub) -> int:
    """This hub's service: its ledger URL is in its environment, never on its command line."""
    db = f"GPUBUDGET_DB_URL=sqlite:///{state(hub)}/".encode()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                argv = (p / "cmdline").read_bytes().split(b"\0")
                env = (p / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"jupyter_gpubudget.service" in argv and any(e.startswith(db) for e in env):
                return int(p.name)
    raise AssertionError("the gpubudget service process was not found")


def proc_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def user_token(hub: DemoHub, user: str) -> str:
    st, out = http("POST", f"{hub.api}/users/{user}/tokens", hub.token, {"note": "isolation"})
    assert st == 201, out
    return out["token"]


def wait_done(hub: DemoHub, token: str, wid: str) -> dict:
    import time

    deadline = time.monotonic() + 60
    while True:
        w = http("GET", f"{hub.svc}/workloads/{wid}", token)[1]
        if w["state"] not in ("pending", "running"):
            return w
        assert time.monotonic() < deadline, (w, hub.logtail())
        time.sleep(0.2)


def test_the_service_runs_as_its_own_unprivileged_user(demo):
    pid = service_pid(demo)
    uid = int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0])
    assert uid == pwd.getpwnam(SERVICE_USER).pw_uid and uid != 0
    assert "jobs run as their users' accounts through 'sudo -n" in demo.log.read_text()


def test_a_job_gets_no_token_no_secret_and_is_not_root(demo):
    st_dir = state(demo)
    jobs = st_dir / "jobs"
    bob, alice = user_token(demo, "bob"), user_token(demo, "alice")
    # another user's job writes something private first
    s, bobjob = http("POST", f"{demo.svc}/jobs", bob, {
        "command": "echo BOB-PRIVATE-7e3f", "project": "lattice-qcd", "gpus": 1})
    assert s == 201, bobjob
    assert wait_done(demo, bob, bobjob["id"])["state"] == "done"
    svc_pid = service_pid(demo)
    ledger = demo.ledger_path.resolve()
    targets = [st_dir / "spawner-token", st_dir / "jupyterhub_cookie_secret",
               st_dir / "jupyterhub.sqlite", ledger, Path(f"{ledger}-wal"),
               jobs / bobjob["id"] / "1" / "output.log", jobs / bobjob["id"] / "1" / "pid",
               f"/proc/{svc_pid}/environ", f"/proc/{demo.proc.pid}/environ"]
    s, job = http("POST", f"{demo.svc}/jobs", alice, {
        "command": ["/bin/sh", "-c", PROBE, "probe", *map(str, targets)],
        "project": "lattice-qcd", "gpus": 1, "env": {"JOBS": str(jobs)}})
    assert s == 201, job
    w = wait_done(demo, alice, job["id"])
    out = (jobs / job["id"] / "1" / "output.log").read_text()
    assert (w["state"], w["exit_code"]) == ("failed", 7), (w, out)  # its own exit, not forged

    alice_pw = pwd.getpwnam(DEMO_PREFIX + "alice")
    assert f"UID={alice_pw.pw_uid}\n" in out and alice_pw.pw_uid != 0
    groups = {int(g) for g in re.search(r"GROUPS=(.*)", out).group(1).split()}
    assert 0 not in groups and pwd.getpwnam(SERVICE_USER).pw_gid not in groups
    for t in targets:
        assert f"DENIED {t}\n" in out, (t, out)
    assert "READ" not in out and "FORGED" not in out and "KILLED" not in out, out
    for word in ("DENIED write", "DENIED kill", "DENIED bob's home"):
        assert word in out

    env_lines = out.split("--- env\n")[1].split("--- end")[0].splitlines()
    env = dict(line.split("=", 1) for line in env_lines if "=" in line)
    assert set(env) - JOB_ENV_OK == {"JOBS"}, sorted(env)
    assert env["GPUBUDGET_USER"] == "alice" and env["USER"] == DEMO_PREFIX + "alice"
    assert env["CUDA_VISIBLE_DEVICES"]
    secrets = [(st_dir / "spawner-token").read_text().strip(),
               (st_dir / "jupyterhub_cookie_secret").read_text().strip(), demo.token,
               proc_env(svc_pid)["JUPYTERHUB_API_TOKEN"], alice, bob]
    for secret in secrets:
        assert secret and secret not in out
    assert "BOB-PRIVATE" not in out


def test_files_are_private_to_their_owners(demo):
    st_dir = state(demo)
    svc = pwd.getpwnam(SERVICE_USER)
    for p in ("jupyterhub.sqlite", "jupyterhub_cookie_secret", "spawner-token"):
        st = os.stat(st_dir / p)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600, p
    st = os.stat(st_dir / "service")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (svc.pw_uid, 0o700)
    for p in (st_dir / "service").glob("ledger.sqlite*"):
        st = os.stat(p)
        assert st.st_uid == svc.pw_uid and stat.S_IMODE(st.st_mode) & 0o077 == 0, p
    st = os.stat(st_dir / "jobs")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, svc.pw_gid, 0o750)
    carol = DEMO_PREFIX + "carol"
    for p in ("jupyterhub.sqlite", "jupyterhub_cookie_secret", "spawner-token",
              "service/ledger.sqlite"):
        r = as_user(carol, ["cat", str(st_dir / p)])
        assert r.returncode != 0 and "Permission denied" in r.stderr, (p, r)


def test_notebook_servers_run_as_their_users_and_jupyterlab_loads(demo):
    st, out = http("POST", f"{demo.api}/users/carol/server", demo.token,
                   {"project": "astro", "slice": "cpu"})
    assert st in (201, 202), out
    demo.wait_ready("carol")
    pid = http("GET", f"{demo.api}/users/carol", demo.token)[1]["servers"][""]["state"][
        "child_state"]["pid"]
    uid = int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0])
    assert uid == pwd.getpwnam(DEMO_PREFIX + "carol").pw_uid != 0
    env = proc_env(pid)
    # the account's home of this checkout's demo (demo_setup.demo_home_root), its own
    home = demo_home_root() / (DEMO_PREFIX + "carol")
    assert env["HOME"] == str(home) and home.stat().st_uid == uid
    assert (state(demo) / "spawner-token").read_text().strip() not in "\0".join(env.values())
    import urllib.request

    req = urllib.request.Request(f"{demo.url}/user/carol/lab",
                                 headers={"Authorization": f"token {env['JUPYTERHUB_API_TOKEN']}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        page = r.read().decode()
    assert r.status == 200 and "JupyterLab" in page
    http("DELETE", f"{demo.api}/users/carol/server", demo.token)


def test_user_options_gpus_2_9_is_refused_by_the_hub(demo):
    st, out = http("POST", f"{demo.api}/users/dana/server", demo.token,
                   {"project": "genomics", "gpus": 2.9})
    assert st == 400 and "gpus" in json.dumps(out), (st, out)
