"""Idle detection and preemption through BudgetSpawner, with a real JupyterHub and
configurable-http-proxy on a one-GPU declared inventory.

alice's session goes idle past the limit (no NVML here: kernel/server activity is the measure),
is reported (a notice in the ledger, a warning in the log) and loses its protection; carol,
whose project stands lower, then preempts it: alice's server is stopped by her spawner, her
charge ends (closed by preemption), and carol's server starts on the GPU."""

from __future__ import annotations

import time

import pytest

from jupyter_gpubudget.ledger import Ledger, connect
from tests.e2e.test_spawn_queue import BUDGETS, INVENTORY
from tests.hub.hubproc import http, start_demo_hub


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    d = tmp_path_factory.mktemp("idle")
    (d / "budgets.yaml").write_text(BUDGETS)
    (d / "inventory.yaml").write_text(INVENTORY)
    h = start_demo_hub(d, d / "budgets.yaml", d / "inventory.yaml",
                       env={"GPUBUDGET_SLOW_SPAWN": "0.5", "GPUBUDGET_IDLE_LIMIT": "2",
                            "GPUBUDGET_HEARTBEAT": "0.5", "GPUBUDGET_POLL_INTERVAL": "1",
                            # stopped without a snapshot (and so not requeued): snapshots
                            # before preemption are tests/snapshot's
                            "GPUBUDGET_SNAPSHOT_ON_PREEMPT": "0"})
    yield h
    h.stop()


def session(hub, user: str) -> dict:
    st, out = http("GET", hub.svc + f"/sessions?user={user}", hub.token)
    assert st == 200, out
    return out["sessions"][-1]


def wait(pred, what: str, hub, timeout: float = 60):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"{what}\n{hub.logtail()}"
        time.sleep(0.2)


def test_idle_session_is_reported_then_preempted_and_its_charge_ends(hub):
    st, body = http("POST", f"{hub.api}/users/alice/server", hub.token,
                    {"project": "lattice", "slice": "gpu:1", "min_runtime": "1h"})
    assert st in (201, 202), body
    hub.wait_ready("alice")
    s = wait(lambda: (x := session(hub, "alice"))["idle_reported"] and x, "no idle report", hub)
    assert s["state"] == "running"
    assert s["protected_left_s"] in (0, 0.0, None)  # idle: no longer protected
    assert "idle for" in hub.logtail(200_000) and "now preemptible" in hub.logtail(200_000)

    st, body = http("POST", f"{hub.api}/users/carol/server", hub.token,
                    {"project": "astro", "slice": "gpu:1"})
    assert st in (201, 202), body
    hub.wait_ready("carol")
    a = wait(lambda: (x := session(hub, "alice"))["state"] == "preempted" and x,
             "alice not preempted", hub)
    assert a["ended_at"] is not None
    env = hub.server_env("carol")
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-tiny-0"
    # the hub notices alice's server is gone
    wait(lambda: not (http("GET", f"{hub.api}/users/alice", hub.token)[1]
                      .get("servers") or {}), "alice's server still listed", hub)

    led = Ledger(connect(hub.ledger_url, read_only=True))
    ca = [c for c in led.charges() if c.user == "alice"]
    assert len(ca) == 1 and ca[0].end is not None and ca[0].closed_by == "preempt"
    kinds = [d.kind for d in led.decisions(workloads=[a["id"]])]
    assert "idle" in kinds and "preempt-requested" in kinds
    # the spawner gave alice's lab its notice (3 s here) before stopping the server
    asked = next(d.at for d in led.decisions(workloads=[a["id"]])
                 if d.kind == "preempt-requested")
    assert "the lab is told; its server stops in" in hub.logtail(200_000)
    assert ca[0].end >= asked + 3
    http("DELETE", f"{hub.api}/users/carol/server", hub.token)
