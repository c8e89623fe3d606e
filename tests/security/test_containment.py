"""Containment attacks, replayed against the real demo hub (as root, isolation on: the
service is its own unprivileged user and jobs run as ``demo-<user>`` through the sudo
launcher, notebook servers as their users through the hub).

4. A process that leaves its process group (``setsid``, a double fork into a new session)
   outlived its job: the job was marked done or cancelled, its charge ended, and the escaped
   process kept running as the user on the GPU given to someone else. Now every job and
   session has its own cgroup and is ended only once that cgroup is empty: when the ledger
   says a workload ended, none of its processes is left.
6. A job whose launcher monitor was SIGKILLed was marked failed while its processes still
   ran, its exit code lost, its charge cut short and nothing recorded. Now its cgroup says
   whether it runs: it stays running (and charged) until the cgroup is empty, its exit code is
   recorded as unknown, and ``lost`` decisions say what happened."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.hub.demo_setup import DEMO_PREFIX
from jupyter_gpubudget.ledger import Ledger, connect
from tests.hub.hubproc import http, require, start_demo_hub

from .conftest import require_root


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    require_root()
    hub = start_demo_hub(tmp_path_factory.mktemp("containment"))
    try:
        require("ISOLATION IS OFF" not in hub.log.read_text(),
                "an isolated demo hub (the hub's log says isolation is off: "
                + (re.findall(r"ISOLATION IS OFF \((.*?)\)", hub.log.read_text()) or [""])[0]
                + ")")
        yield hub
    finally:
        hub.stop()


@pytest.fixture(scope="module")
def alice(demo):
    st, out = http("POST", f"{demo.api}/users/alice/tokens", demo.token, {"note": "contain"})
    assert st == 201, out
    return out["token"]


def uid_of(user: str) -> int:
    return pwd.getpwnam(DEMO_PREFIX + user).pw_uid


def processes(uid: int, marker: str) -> list[int]:
    """Live (not zombie) processes of ``uid`` whose command line holds ``marker``."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            status = (p / "status").read_text()
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        real_uid = int(status.split("Uid:")[1].split()[0])
        if real_uid == uid and marker in cmd and "\nState:\tZ" not in status:
            out.append(int(p.name))
    return out


def wait_for(what: str, fn, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def submit(demo, token: str, script: str, **extra) -> str:
    st, job = http("POST", f"{demo.svc}/jobs", token, {
        "command": ["/bin/sh", "-c", script], "project": "lattice-qcd", "gpus": 1, **extra})
    assert st == 201, job
    return job["id"]


def workload(demo, token: str, wid: str) -> dict:
    return http("GET", f"{demo.svc}/workloads/{wid}", token)[1]


def ended(demo, token: str, wid: str) -> dict | None:
    w = workload(demo, token, wid)
    return w if w["state"] not in ("pending", "running") else None


def escaped_then(marker_cmd: str, marker: str, then: str) -> str:
    """A job that starts an escaping process, waits until it runs (so the escape really
    happened before the job ends), then does ``then``. The marker is never written out in
    the job's own command line (``2''39``, ``23[9]``): only the escaped process carries it."""
    pattern = f"{marker[:-1]}[{marker[-1]}]"
    return (f"{marker_cmd}\n"
            f"while ! pgrep -u \"$(id -u)\" -f '{pattern}' > /dev/null; do sleep 0.05; done\n"
            f"{then}\n")


ESCAPES = {
    # a new session: out of the job's process group
    "setsid": ("setsid sh -c 'exec sleep 2''39' &", "sleep 239"),
    # a double fork whose grandchild starts its own session (reparented to init)
    "double-fork": ("( ( setsid sh -c 'exec sleep 2''38' & ) & )", "sleep 238"),
    # nohup and a new session, output away: the classic daemon
    "daemon": ("nohup setsid sh -c 'exec sleep 2''37 < /dev/null > /dev/null 2>&1' "
               "> /dev/null 2>&1 &", "sleep 237"),
}


@pytest.mark.parametrize("how", sorted(ESCAPES))
def test_a_job_marked_done_leaves_no_process(demo, alice, how):
    cmd, marker = ESCAPES[how]
    wid = submit(demo, alice, escaped_then(cmd, marker, "exit 0"))
    w = wait_for(f"{wid} ends", lambda: ended(demo, alice, wid))
    # the moment the ledger says it ended (its GPU free for the next job), nothing is left
    left = processes(uid_of("alice"), marker)
    for pid in left:  # leave nothing behind even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert w["state"] == "done", w
    assert left == [], f"{how}: {left} still run after the job was marked done"


def test_a_cancelled_job_leaves_no_process(demo, alice):
    wid = submit(demo, alice, escaped_then("setsid sh -c 'exec sleep 2''36' &", "sleep 236",
                                           "exec sleep 100000"))
    uid = uid_of("alice")
    wait_for("the escaped process runs", lambda: processes(uid, "sleep 236"))
    st, out = http("DELETE", f"{demo.svc}/jobs/{wid}", alice)
    assert st == 200, out
    w = workload(demo, alice, wid)
    left = processes(uid, "sleep 236") + processes(uid, "sleep 100000")
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert w["state"] == "cancelled", w
    assert left == [], f"{left} still run after the job was cancelled"


def test_a_job_whose_monitor_is_killed_is_reconciled_from_its_cgroup(demo, alice):
    home = Path(pwd.getpwnam(DEMO_PREFIX + "alice").pw_dir)
    go1, go2 = home / f"go1-{os.getpid()}", home / f"go2-{os.getpid()}"
    for f in (go1, go2):
        f.unlink(missing_ok=True)
    # the job's main process waits for go1 and exits 3; a process it started in a new
    # session waits for go2 (the job's real end)
    script = escaped_then(
        f"setsid sh -c 'while [ ! -e {go2} ]; do sleep 0.1; done; exec sleep 0.01 # w2''35' &",
        "w235", f"while [ ! -e {go1} ]; do sleep 0.1; done; exit 3")
    wid = submit(demo, alice, script)
    uid = uid_of("alice")
    wait_for("the job runs", lambda: workload(demo, alice, wid)["state"] == "running")
    rec_path = demo.dir / "state" / "jobs" / wid / "1" / "pid"
    rec = wait_for("the pid record", lambda: rec_path.exists() and json.loads(
        rec_path.read_text()))
    wait_for("the escaped process runs", lambda: processes(uid, "w235"))
    os.kill(rec["monitor_pid"], signal.SIGKILL)  # as root: the job's monitor dies
    go1.touch()
    wait_for("the job's main process ends", lambda: not Path(f"/proc/{rec['pid']}").exists()
             or "\nState:\tZ" in Path(f"/proc/{rec['pid']}/status").read_text())
    # a job submitted now is started and settled by cycles that also look at ours
    probe = submit(demo, alice, "true")
    assert wait_for("the probe ends", lambda: ended(demo, alice, probe))["state"] == "done"
    try:
        w = workload(demo, alice, wid)
        assert processes(uid, "w235"), "the escaped process ended by itself"
        assert w["state"] == "running", \
            f"marked {w['state']} while its processes still run: {w}"
        led = Ledger(connect(demo.ledger_url, read_only=True))
        told = [d for d in led.decisions(workloads=[wid]) if d.kind == "lost"]
        assert told and told[0].detail.get("still_running"), told
    finally:
        before_end = time.time()
        go2.touch()  # the job's real end
    w = wait_for(f"{wid} ends", lambda: ended(demo, alice, wid))
    assert processes(uid, "w235") == []
    assert w["state"] == "failed" and w["exit_code"] is None, w  # unknown, never invented
    led = Ledger(connect(demo.ledger_url, read_only=True))
    charges = led.charges(workload=wid)
    assert charges and charges[-1].end is not None and charges[-1].end >= before_end, \
        "the charge must run to the job's real end"
    settled = [d for d in led.decisions(workloads=[wid]) if d.kind == "lost"]
    assert settled[0].detail["exit_code_known"] is False, settled
    assert "exit code unknown" in settled[0].reason and "monitor" in settled[0].reason
    for f in (go1, go2):
        f.unlink(missing_ok=True)


def run_in_kernel(server_url: str, token: str, code: str) -> None:
    """Run ``code`` in a new kernel of a user's real notebook server (as a notebook cell
    would), through Jupyter's REST and kernel websocket APIs."""
    import asyncio
    import uuid

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    st, kernel = http("POST", f"{server_url}/api/kernels", token, {"name": "python3"})
    assert st == 201, kernel

    async def go() -> None:
        ws_url = server_url.replace("http", "ws", 1) + f"/api/kernels/{kernel['id']}/channels"
        conn = await websocket_connect(HTTPRequest(
            ws_url, headers={"Authorization": f"token {token}"}))
        msg_id = uuid.uuid4().hex
        conn.write_message(json.dumps({
            "header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
        while True:
            raw = await asyncio.wait_for(conn.read_message(), 60)
            assert raw is not None, "the kernel's websocket closed"
            msg = json.loads(raw)
            if msg.get("msg_type") == "execute_reply" \
                    and msg["parent_header"].get("msg_id") == msg_id:
                assert msg["content"]["status"] == "ok", msg["content"]
                conn.close()
                return

    asyncio.run(go())


def test_a_stopped_session_leaves_no_process(demo):
    st, out = http("POST", f"{demo.api}/users/carol/server", demo.token,
                   {"project": "astro", "slice": "cpu"})
    assert st in (201, 202), out
    demo.wait_ready("carol")
    pid = http("GET", f"{demo.api}/users/carol", demo.token)[1]["servers"][""]["state"][
        "child_state"]["pid"]
    env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().decode(
        errors="replace").split("\0") if "=" in kv)
    # a notebook cell starts a process in a new session and a double-forked daemon
    run_in_kernel(f"{demo.url}/user/carol", env["JUPYTERHUB_API_TOKEN"], (
        "import os, subprocess\n"
        "subprocess.Popen(['setsid', 'sh', '-c', 'exec sleep 2' '34'])\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execvp('sleep', ['sleep', '2' '33'])\n"
        "    os._exit(0)\n"))
    uid = uid_of("carol")
    wait_for("the escaped processes run",
             lambda: processes(uid, "sleep 234") and processes(uid, "sleep 233"))
    st, _ = http("DELETE", f"{demo.api}/users/carol/server", demo.token)
    assert st in (202, 204), st
    wait_for("the server stops", lambda: not http("GET", f"{demo.api}/users/carol",
                                                  demo.token)[1]["servers"])
    left = processes(uid, "sleep 234") + processes(uid, "sleep 233")
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert left == [], f"{left} still run after the session ended"
