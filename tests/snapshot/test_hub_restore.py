"""Restorable preemption end to end, once with each backend: a real JupyterHub (the
project's demo hub config), the gpubudget service, BudgetSpawner, the user's single-user
server with the gpubudget server extension, real ipykernel kernels.

alice's notebook defines a large numpy array, a pandas frame, a function, a class instance,
a generator and an open file handle. Her protected time is short and her project's grant
tiny; carol's backed batch jobs take the other node's GPU, then need alice's: the core
preempts her. Her server saves its kernels (a verified snapshot), is stopped, and her session
is requeued; the service asks the hub to start her server again, which waits in the queue
until carol's first job is cancelled and starts on *that* GPU, on the other node. The server
restores the kernel before the spawn completes, re-attached to the notebook; every value is
checked in the restored kernel, and what was restored and how is in the API:
CRIU brings back everything (the open file too); the namespace backend restores the values,
recomputes the generator from its cell and reports the file handle lost."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.hub.hubproc import ProgressReader, http, require, start_demo_hub

from .hubflow import (
    Notebook,
    job,
    job_state,
    ledger,
    ready_session_id,
    session,
    stop_everything,
    user_token,
    users_dir,
    wait,
    write_config,
)
from .state import CHECKS, cells

BUDGETS = """\
window: 7d
admins: [admin]
policy:
  stop_grace: 60s
accounts:
  physics:
    grant: 100
    children:
      lattice: {grant: 0.01, members: [alice]}
      astro: {grant: 90, members: [carol]}
"""

INVENTORY = """\
nodes:
  - {name: a, model: H100-80GB, gpus: 1}
  - {name: b, model: H100-80GB, gpus: 1}
"""

# the one 1 GiB case of the suite is CRIU's (bench/snapshot.py's size); the namespace case uses less
SIZES = {"criu": int(os.environ.get("GPUBUDGET_TEST_CRIU_MIB", "1024")),
         "namespace": int(os.environ.get("GPUBUDGET_TEST_NS_MIB", "256"))}


@pytest.fixture(scope="module", params=["namespace", "criu"])
def hub(request, tmp_path_factory):
    method = request.param
    env = {"GPUBUDGET_SLOW_SPAWN": "0.5", "GPUBUDGET_HEARTBEAT": "0.5",
           "GPUBUDGET_POLL_INTERVAL": "1", "GPUBUDGET_IDLE_LIMIT": "0",
           "GPUBUDGET_SNAPSHOT_METHODS": method}
    if method == "criu":
        require(os.geteuid() == 0, "root (the demo's servers run CRIU in-process as root)")
        from .conftest import criu_binary

        found = criu_binary()
        require(found is not None, "CRIU >= 4.1 (make criu)")
        require(shutil.which("nft") is not None, "nftables (CRIU's network lock)")
        env["GPUBUDGET_CRIU"] = found  # type: ignore[assignment]
    d = tmp_path_factory.mktemp(f"restore-{method}")
    budgets, inventory = write_config(d, BUDGETS, INVENTORY)
    h = start_demo_hub(d, budgets, inventory, env=env)
    h.method = method  # type: ignore[attr-defined]
    yield h
    h.stop()


def test_preempted_session_is_saved_requeued_and_restored_on_another_slice(hub, tmp_path):
    method = hub.method
    alice, carol = user_token(hub, "alice"), user_token(hub, "carol")
    try:
        _scenario(hub, method, alice, carol, tmp_path)
    finally:
        stop_everything(hub, ["alice", "carol"], {"alice": alice, "carol": carol})


def _scenario(hub, method: str, alice: str, carol: str, tmp_path) -> None:  # noqa: ANN001
    st, body = http("POST", f"{hub.api}/users/alice/server", hub.token,
                    {"project": "lattice", "slice": "gpu:1", "min_runtime": "5s"})
    assert st in (201, 202), body
    first = ready_session_id(hub, "alice")
    nb = Notebook(hub, "alice", alice)
    nb.open()
    notes = users_dir(hub, "alice", "notes")
    for c in cells(str(notes), SIZES[method]):
        nb.run(c)
    before = session(hub, first)
    assert before["state"] == "running" and before["placement"]
    old_node = before["placement"][0]["node"]

    # carol's backed job takes the other node's GPU; her second one needs alice's
    hog = job(hub, carol, "astro", "hog")
    wait(lambda: job_state(hub, carol, hog["id"]) == "running", "hog not running", hub)
    urgent = job(hub, carol, "astro", "urgent")

    # alice's server saves its kernel, stops, and her session is requeued
    a = wait(lambda: (x := session(hub, first))["state"] == "preempted" and x,
             "alice not preempted", hub, timeout=150)
    snap = a["snapshot"]
    assert snap and snap["status"] == "ok" and snap["saved"] == snap["count"] == 1, (
        snap and (snap["problem"], [k.get("error") for k in snap["kernels"]]))
    assert snap["method"] == method and snap["reason"] == "preempt"
    wait(lambda: job_state(hub, carol, urgent["id"]) == "running", "urgent not running", hub)
    resumed = [s for s in (http("GET", hub.svc + "/sessions?user=alice", hub.token)[1]
                           ["sessions"]) if (s.get("resumes") or {}).get("session") == first]
    assert len(resumed) == 1, resumed
    second = resumed[0]
    assert second["state"] == "pending" and second["resumes"]["snapshot"] == snap["id"]
    # the hub was asked to start alice's server again: it waits in the queue
    reader = ProgressReader(f"{hub.api}/users/alice/server/progress", hub.token)
    wait(lambda: (server := (http("GET", f"{hub.api}/users/alice", hub.token)[1]
                             .get("servers") or {}).get("")) and server.get("pending"),
         "the hub is not spawning alice's server again", hub)
    reader.start()
    reader.wait_for(lambda e: "Resuming your session" in e.get("message", ""), 60)

    # the hog ends: alice's session starts there, on the other node
    http("DELETE", hub.svc + f"/jobs/{hog['id']}", carol)
    sid = ready_session_id(hub, "alice", not_=first, timeout=180)
    assert sid == second["id"]
    reader.wait_for(lambda e: "Restoring your kernels" in e.get("message", ""), 30)
    b = session(hub, sid)
    assert b["state"] == "running" and b["placement"][0]["node"] != old_node
    restored = b["restored"]
    assert restored and restored["snapshot"] == snap["id"], restored
    k = restored["kernels"][0]
    assert k["notebooks"] == [nb.path] and k["method"] == method

    # the notebook's kernel is the restored one, with every value
    out = nb.run(CHECKS)
    assert out.splitlines()[0] == f"big ok {SIZES[method] << 20}", out
    for name in ("frame", "scaled", "counter"):
        assert f"{name} ok" in out
    if method == "criu":
        assert k["everything"] and not k["lost"]
        assert "everything" in restored["summary"]
        assert nb.run("print(list(squares)); handle.write(' and more'); handle.close()") \
            .strip() == "[0, 1, 4, 9, 16, 25]"
        assert (notes / "notes.txt").read_text() == "kept open and more"
    else:
        assert not k["everything"]
        assert {"big", "frame", "scaled", "offset", "counter", "Counter"} <= set(k["restored"])
        assert "squares" in k["recomputed"] and "replaying cell" in k["recomputed"]["squares"]
        assert "handle" in k["lost"] and "handle" in k["unsaved"]
        assert "lost handle" in restored["summary"]
        assert nb.run("print(list(squares))").strip() == "[0, 1, 4, 9, 16, 25]"
    # the environment names the new slice (a CRIU kernel keeps its own memory, not its env)
    node = b["placement"][0]["node"]
    assert nb.run("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip() == \
        f"GPU-{node}-0"

    # the ledger: the preemption, the snapshot, the requeue and the restore
    led = ledger(hub)
    kinds = [d.kind for d in led.decisions(workloads=[first])]
    assert {"preempt-requested", "snapshot", "requeue"} <= set(kinds), kinds
    kinds = [d.kind for d in led.decisions(workloads=[sid])]
    assert {"resume", "restore"} <= set(kinds), kinds
    charges = [c for c in led.charges() if c.workload == first]
    assert len(charges) == 1 and charges[0].closed_by == "preempt"
    rows = {r.id: r for r in led.workloads(user="alice")}
    assert rows[first].state == "preempted" and rows[sid].resumable
