"""Hibernation, and a snapshot that fails, end to end on the project's demo hub (one GPU).

Hibernate: alice's session goes idle past the limit (``BudgetSpawner.idle_action =
"hibernate"``): her server saves its kernel and stops, the session ends (its charge closed,
"hibernate"), the hub forgets the server at once, and the GPU is free — carol's queued session
takes it. When alice comes back (starts her server: no form, it resumes), she waits in the
queue until carol stops, then her server starts and restores the kernel before the spawn
completes ("Restoring your kernels..." on the spawn page), every value there.

A snapshot that fails: alice's kernel is busy in a long cell when she is preempted, so the
namespace backend cannot save it. Her server is not stopped before the grace period ends
(``policy.stop_grace``); then it is, the loss is recorded in the ledger and in her notices, and
nothing is requeued."""

from __future__ import annotations

import threading
import time

import pytest

from tests.hub.hubproc import ProgressReader, http, start_demo_hub

from .hubflow import (
    Notebook,
    ledger,
    ready_session_id,
    server_model,
    session,
    sessions,
    stop_everything,
    user_token,
    users_dir,
    wait,
    write_config,
)
from .state import CHECKS, cells

GRACE = 12.0
IDLE = 6.0
BUDGETS = f"""\
window: 7d
admins: [admin]
policy:
  stop_grace: {GRACE:g}s
accounts:
  physics:
    grant: 100
    children:
      lattice: {{grant: 50, members: [alice]}}
      scratch: {{grant: 0.01, members: [alice]}}
      astro: {{grant: 40, members: [carol]}}
"""
INVENTORY = "nodes:\n  - {name: solo, model: H100-80GB, gpus: 1}\n"


def _start(tmp_path_factory, name: str):  # noqa: ANN001, ANN202
    d = tmp_path_factory.mktemp(name)
    budgets, inventory = write_config(d, BUDGETS, INVENTORY)
    return start_demo_hub(d, budgets, inventory, env={
        "GPUBUDGET_SLOW_SPAWN": "0.5", "GPUBUDGET_HEARTBEAT": "0.5",
        "GPUBUDGET_POLL_INTERVAL": "1", "GPUBUDGET_IDLE_LIMIT": str(IDLE),
        "GPUBUDGET_IDLE_ACTION": "hibernate", "GPUBUDGET_SNAPSHOT_METHODS": "namespace"})


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = _start(tmp_path_factory, "hibernate")
    yield h
    h.stop()


@pytest.fixture
def fresh_hub(tmp_path_factory):
    """A hub with no history: the sessions the other tests ran for a minute or two would
    make the core predict any session to end within a minute or two, and a preemption that
    buys so little does not pay for the restart (the core waits instead)."""
    h = _start(tmp_path_factory, "hibernate-fresh")
    yield h
    h.stop()


class Active(threading.Thread):
    """Keeps a user's server active (as a browser at work would) until stopped."""

    def __init__(self, hub, user: str) -> None:  # noqa: ANN001
        super().__init__(daemon=True)
        self.hub, self.user, self.halt = hub, user, threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            now = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
            http("POST", f"{self.hub.api}/users/{self.user}/activity", self.hub.token,
                 {"last_activity": now, "servers": {"": {"last_activity": now}}})
            self.halt.wait(0.5)


def test_idle_session_hibernates_frees_its_slice_and_comes_back_restored(hub, tmp_path):
    alice, carol = user_token(hub, "alice"), user_token(hub, "carol")
    active = Active(hub, "alice")
    active.start()
    try:
        st, body = http("POST", f"{hub.api}/users/alice/server", hub.token,
                        {"project": "lattice", "slice": "gpu:1", "min_runtime": "1h"})
        assert st in (201, 202), body
        first = ready_session_id(hub, "alice")
        nb = Notebook(hub, "alice", alice)
        nb.open()
        for c in cells(str(users_dir(hub, "alice", "notes")), 64):
            nb.run(c)
        # carol waits for the only GPU
        st, body = http("POST", f"{hub.api}/users/carol/server", hub.token,
                        {"project": "astro", "slice": "gpu:1", "min_runtime": "1h"})
        assert st in (201, 202), body
        active.halt.set()  # alice leaves

        a = wait(lambda: (x := session(hub, first))["state"] == "done" and x,
                 "alice's idle session did not hibernate", hub, timeout=120)
        assert a["hibernated"]["snapshot"] == a["snapshot"]["id"]
        assert a["snapshot"]["reason"] == "hibernate" and a["snapshot"]["saved"] == 1
        led = ledger(hub)
        ch = [c for c in led.charges() if c.workload == first]
        assert len(ch) == 1 and ch[0].end is not None and ch[0].closed_by == "hibernate"
        # the hub forgot the server, and the GPU went to carol
        wait(lambda: server_model(hub, "alice") is None, "the hub still lists alice's server",
             hub)
        c_sid = ready_session_id(hub, "carol")
        assert session(hub, c_sid)["state"] == "running"

        # alice comes back: no form, her server resumes; she waits for the GPU
        st, body = http("POST", f"{hub.api}/users/alice/server", hub.token)
        assert st in (201, 202), body
        reader = ProgressReader(f"{hub.api}/users/alice/server/progress", hub.token)
        reader.start()
        reader.wait_for(lambda e: "Resuming your session (hibernated" in e.get("message", ""))
        queued = wait(lambda: [s for s in sessions(hub, "alice") if s["state"] == "pending"],
                      "alice not queued", hub)[0]
        assert queued["resumes"] == {**queued["resumes"], "session": first,
                                     "snapshot": a["snapshot"]["id"]}
        http("DELETE", f"{hub.api}/users/carol/server", hub.token)
        sid = ready_session_id(hub, "alice", not_=first)
        assert sid == queued["id"]
        reader.wait_for(lambda e: "Restoring your kernels" in e.get("message", ""))
        done = reader.wait_for(lambda e: e.get("message", "").startswith("Restored:"))
        assert "work.ipynb" in done["message"] and "lost handle" in done["message"]
        out = nb.run(CHECKS)
        assert out.splitlines()[0] == f"big ok {64 << 20}"
        restored = session(hub, sid)["restored"]
        assert restored["snapshot"] == a["snapshot"]["id"]
        assert "handle" in restored["kernels"][0]["lost"]
    finally:
        active.halt.set()
        stop_everything(hub, ["alice", "carol"], {"alice": alice, "carol": carol})
        wait(lambda: server_model(hub, "alice") is None and server_model(hub, "carol") is None,
             "servers still running", hub)


def test_a_snapshot_that_fails_waits_for_the_grace_period_and_records_the_loss(fresh_hub):
    hub = fresh_hub
    alice, carol = user_token(hub, "alice"), user_token(hub, "carol")
    active = Active(hub, "alice")  # not idle: this session must not hibernate
    active.start()
    try:
        st, body = http("POST", f"{hub.api}/users/alice/server", hub.token,
                        {"project": "scratch", "slice": "gpu:1", "min_runtime": "5s"})
        assert st in (201, 202), body
        first = ready_session_id(hub, "alice")
        nb = Notebook(hub, "alice", alice, path="busy.ipynb")
        nb.open()
        nb.run("answer = 42")
        kc = nb.client()  # a long cell: the namespace backend cannot run while it runs
        kc.execute("import time\ntime.sleep(600)")
        time.sleep(6)  # past alice's protected time
        st, body = http("POST", hub.svc + "/jobs", carol,
                        {"command": "sleep 600", "project": "astro", "gpus": 1,
                         "name": "urgent", "min_runtime": "1h"})
        assert st == 201, body
        asked = wait(lambda: session(hub, first)["preempt_deadline"], "no preemption", hub)
        a = wait(lambda: (x := session(hub, first))["state"] != "running" and x,
                 "alice's session was not stopped", hub, timeout=120)
        kc.stop_channels()
        assert a["state"] == "preempted"
        # not stopped before the grace period ended
        assert a["ended_at"] >= asked - 0.5, (a["ended_at"], asked)
        assert a["snapshot_lost"] and "grace period" in a["snapshot_lost"]["reason"]
        assert not [s for s in sessions(hub, "alice") if s["state"] == "pending"]
        led = ledger(hub)
        lost = [d for d in led.decisions(workloads=[first]) if d.kind == "snapshot_lost"]
        assert len(lost) == 1 and lost[0].at >= asked - 0.5
        st, notices = http("GET", hub.svc + "/notices", alice)
        assert any(n["kind"] == "snapshot_lost" and n["workload"] == first
                   for n in notices["notices"]), notices
    finally:
        active.halt.set()
        stop_everything(hub, ["alice", "carol"], {"alice": alice, "carol": carol})


def gpubudget(hub, token: str, *args: str) -> tuple[int, str]:  # noqa: ANN001
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "jupyter_gpubudget.cli", *args, "--url",
           f"{hub.url}/services/gpubudget", "--token", token]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:  # what the sessions were doing, and the hub's log
        st, sessions = http("GET", hub.svc + "/sessions", hub.token)
        raise AssertionError(f"gpubudget {' '.join(args)}: no answer in 300 s ({e.stdout!r} "
                             f"{e.stderr!r})\nsessions ({st}): {sessions}\n"
                             f"{hub.logtail(9000)}") from None
    return p.returncode, p.stdout + p.stderr


def test_cli_snapshot_create_list_and_restore_running_and_stopped(hub):
    alice = user_token(hub, "alice")
    active = Active(hub, "alice")
    active.start()
    try:
        st, body = http("POST", f"{hub.api}/users/alice/server", hub.token,
                        {"project": "lattice", "slice": "gpu:1", "min_runtime": "1h"})
        assert st in (201, 202), body
        first = ready_session_id(hub, "alice")
        nb = Notebook(hub, "alice", alice, path="cli.ipynb")
        nb.open()
        nb.run("word = 'one'")
        rc, out = gpubudget(hub, alice, "snapshot", "create")
        assert rc == 0, out
        snap_id = out.splitlines()[1].split()[0]
        assert "1/1 kernels" in out and first in snap_id
        nb.run("word = 'two'")
        rc, out = gpubudget(hub, alice, "snapshot", "list")
        assert rc == 0 and snap_id in out, out
        # a local time, not an epoch
        assert time.strftime("%H:") in out or time.strftime("%Y-") in out, out
        # into the running server
        rc, out = gpubudget(hub, alice, "snapshot", "restore", snap_id)
        assert rc == 0 and f"restored {snap_id} into session {first}" in out, out
        assert nb.run("print(word)").strip() == "one"
        # with the server stopped: the server is started again from it
        http("DELETE", f"{hub.api}/users/alice/server", hub.token)
        wait(lambda: server_model(hub, "alice") is None, "alice's server still there", hub)
        rc, out = gpubudget(hub, alice, "snapshot", "restore", snap_id)
        assert rc == 0 and f"restored {snap_id} into session" in out, out
        second = ready_session_id(hub, "alice", not_=first)
        assert second != first and nb.run("print(word)").strip() == "one"
        # hostile input is refused with the reason
        rc, out = gpubudget(hub, alice, "snapshot", "restore", "nonsense--123")
        assert rc == 1 and "404" in out, out
    finally:
        active.halt.set()
        stop_everything(hub, ["alice"], {"alice": alice})
