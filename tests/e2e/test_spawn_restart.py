"""A hub restart does not lose a running session (here a CPU-only one, started without options): with cleanup_servers off, alice's server
survives the hub going down; the restarted hub's BudgetSpawner finds it again from its saved
state (session id, backend spawner state), keeps the charge open with heartbeats, and stopping
it afterwards ends the charge. Real JupyterHub + configurable-http-proxy, one-GPU inventory."""

from __future__ import annotations

import os
import signal
import time

import pytest

from jupyter_gpubudget.ledger import Ledger, connect
from tests.e2e.test_spawn_queue import BUDGETS, INVENTORY
from tests.hub.hubproc import free_port, http, start_demo_hub


@pytest.fixture
def setup(tmp_path):
    (tmp_path / "budgets.yaml").write_text(BUDGETS)
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    env = {"GPUBUDGET_CLEANUP_SERVERS": "0", "GPUBUDGET_HEARTBEAT": "0.5",
           "GPUBUDGET_POLL_INTERVAL": "1", "GPUBUDGET_SLOW_SPAWN": "1"}
    for k in ("GPUBUDGET_HUB_PORT", "GPUBUDGET_SERVICE_PORT", "GPUBUDGET_PROXY_API_PORT",
              "GPUBUDGET_HUB_API_PORT"):
        env[k] = str(free_port())
    env["GPUBUDGET_TEST_TOKEN"] = "restart-test-token-0123456789"
    pids: list[int] = []
    yield tmp_path, env, pids
    for pid in pids:  # the surviving server is ours to end if the test failed midway
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_running_session_survives_a_hub_restart(setup):
    d, env, pids = setup
    args = (d, d / "budgets.yaml", d / "inventory.yaml")
    hub = start_demo_hub(*args, env=env)
    try:
        # started without options (as from the admin page): alice's only project, CPU only
        st, body = http("POST", f"{hub.api}/users/alice/server", hub.token)
        assert st in (201, 202), body
        hub.wait_ready("alice")
        env_a = hub.server_env("alice")
        assert env_a["GPUBUDGET_PROJECT"] == "lattice" and env_a["CUDA_VISIBLE_DEVICES"] == ""
        pid = http("GET", f"{hub.api}/users/alice", hub.token)[1]["servers"][""]["state"][
            "child_state"]["pid"]
        pids.append(pid)
    finally:
        hub.stop()
    os.kill(pid, 0)  # the server outlived the hub

    hub = start_demo_hub(*args, env=env)
    try:
        srv = hub.wait_ready("alice")
        assert srv["state"]["gpubudget_session"]
        wid = srv["state"]["gpubudget_session"]
        led = Ledger(connect(hub.ledger_url, read_only=True))
        before = led.open_interval(wid).checkpoint
        deadline = time.monotonic() + 30
        while led.open_interval(wid).checkpoint <= before:  # heartbeats resumed
            assert time.monotonic() < deadline, hub.logtail()
            time.sleep(0.2)
        st, _ = http("DELETE", f"{hub.api}/users/alice/server", hub.token)
        assert st in (202, 204)
        while http("GET", hub.svc + f"/sessions/{wid}", hub.token)[1]["state"] != "done":
            assert time.monotonic() < deadline + 30, hub.logtail()
            time.sleep(0.2)
        (ch,) = led.charges(workload=wid)
        assert ch.end is not None and ch.closed_by == "stop" and ch.milli == 0
    finally:
        hub.stop()
