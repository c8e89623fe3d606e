"""Shutdown leaves no phantom charge. JupyterHub stops its managed services *before* the users'
servers, so each spawner's "end the charge" finds the service gone. Found: after a restart the
sessions were still running with open charges and no servers, usage kept growing and the spawn
form quoted "starts in ~50 min" on an empty cluster.

Now the spawner keeps the stop (time, reason) in its state in the hub's database, and the
service, when it is back, settles every session against the hub's list of servers: at the
recorded stop, else at its last heartbeat. The project's own demo hub config, real JupyterHub,
real configurable-http-proxy, a one-GPU inventory."""

from __future__ import annotations

import time

from jupyter_gpubudget.ledger import Ledger, connect
from tests.e2e.test_spawn_queue import BUDGETS, INVENTORY
from tests.hub.hubproc import free_port, http, start_demo_hub


def test_servers_stopped_during_shutdown_are_settled_when_the_service_is_back(tmp_path):
    (tmp_path / "budgets.yaml").write_text(BUDGETS)
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    env = {"GPUBUDGET_HEARTBEAT": "0.5", "GPUBUDGET_POLL_INTERVAL": "1",
           "GPUBUDGET_SLOW_SPAWN": "1", "GPUBUDGET_TEST_TOKEN": "shutdown-test-token-0123456789"}
    for k in ("GPUBUDGET_HUB_PORT", "GPUBUDGET_SERVICE_PORT", "GPUBUDGET_PROXY_API_PORT",
              "GPUBUDGET_HUB_API_PORT"):
        env[k] = str(free_port())
    args = (tmp_path, tmp_path / "budgets.yaml", tmp_path / "inventory.yaml")
    hub = start_demo_hub(*args, env=env)
    try:
        st, body = http("POST", f"{hub.api}/users/alice/server", hub.token,
                        {"project": "lattice", "slice": "gpu:1", "min_runtime": "1h"})
        assert st in (201, 202), body
        hub.wait_ready("alice")
        st, s = http("GET", hub.svc + "/sessions?user=alice", hub.token)
        wid = s["sessions"][-1]["id"]
    finally:
        stopping = time.time()
        hub.stop()  # the hub stops the service, then alice's server
    stopped = time.time()
    log = hub.logtail(400_000)
    assert "the stop is kept" in log, log[-4000:]

    led = Ledger(connect(hub.ledger_url, read_only=True))
    assert wid in led.open_intervals()  # what the old code left behind for good

    time.sleep(2)  # time that must not be charged
    hub = start_demo_hub(*args, env=env)
    try:
        deadline = time.monotonic() + 60
        while wid in led.open_intervals():
            assert time.monotonic() < deadline, hub.logtail()
            time.sleep(0.2)
        (ch,) = led.charges(workload=wid)
        assert stopping - 1 <= ch.end <= stopped, (ch.end, stopping, stopped)
        w = led.get(wid)
        assert w is not None and w.state == "done" and "reconciled with the hub" in w.reason
        # the spawn form on an empty cluster: the GPU is free now
        st, offer = http("GET", hub.svc + "/sessions/offer?user=alice&min_runtime=1h", hub.token)
        assert st == 200, offer
        assert offer["quotes"]["lattice"]["gpu:1"]["starts_now"], offer["quotes"]["lattice"]
    finally:
        hub.stop()
