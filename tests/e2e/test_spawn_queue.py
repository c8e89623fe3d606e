"""BudgetSpawner end to end: a real JupyterHub and configurable-http-proxy running the project's
own hub_config/jupyterhub_config.py, with the gpubudget service managed by the hub, on a tiny
declared inventory (one node, one GPU) so the cluster is full after one session.

Two users in different projects spawn through the REST API with options: alice gets the GPU,
carol waits in the queue (progress events show her position) and starts when alice stops; each
server's environment has the expected CUDA_VISIBLE_DEVICES; stopping ends the charge; the ledger
shows both. A user cannot spawn against a project they do not belong to."""

from __future__ import annotations

import time

import pytest

from jupyter_gpubudget.ledger import Ledger, connect
from tests.hub.hubproc import ProgressReader, http, start_demo_hub

BUDGETS = """\
window: 7d
admins: [admin]
policy:
  min_runtime_cap: {interactive: 8h, batch: 2d, debug: 1h}
accounts:
  physics:
    grant: 100
    children:
      lattice: {grant: 60, members: [alice]}
      astro: {grant: 40, members: [carol]}
"""

INVENTORY = """\
nodes:
  - name: tiny
    model: H100-80GB
    gpus: 1
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    d = tmp_path_factory.mktemp("spawnq")
    (d / "budgets.yaml").write_text(BUDGETS)
    (d / "inventory.yaml").write_text(INVENTORY)
    h = start_demo_hub(d, d / "budgets.yaml", d / "inventory.yaml",
                       env={"GPUBUDGET_SLOW_SPAWN": "3", "GPUBUDGET_MAX_QUEUE_WAIT": "12"})
    yield h
    h.stop()


def spawn(hub, user: str, options: dict) -> tuple[int, object]:
    return http("POST", f"{hub.api}/users/{user}/server", hub.token, options)


def test_not_a_member_is_refused_with_a_clear_error(hub):
    status, body = spawn(hub, "carol", {"project": "lattice", "slice": "gpu:1"})
    if status == 202:  # the refusal came after the slow-spawn timeout: it ends the spawn
        reader = ProgressReader(f"{hub.api}/users/carol/server/progress", hub.token)
        reader.start()
        body = reader.wait_for(lambda e: e.get("failed"))
        status = 403 if "HTTP 403" in body["message"] or "403" in body["message"] else 0
    assert status == 403, body
    assert "not a member of project 'lattice'" in body["message"], body
    assert "astro" in body["message"]  # says which projects carol may use
    st, sessions = http("GET", hub.svc + "/sessions?user=carol", hub.token)
    assert st == 200 and sessions["sessions"] == []  # nothing was queued or charged


def test_offer_lists_only_the_users_projects_with_quotes(hub):
    st, offer = http("GET", hub.svc + "/sessions/offer?user=alice", hub.token)
    assert st == 200, offer
    assert offer["projects"] == ["lattice"]
    assert offer["inventory"] == "declared"
    keys = [c["key"] for c in offer["choices"]]
    assert keys[:2] == ["cpu", "gpu:1"] and "mps:250" in keys
    q = offer["quotes"]["lattice"]["gpu:1"]
    assert q["starts_now"] and q["backed"] and q["protected_s"] == 3600
    assert q["cost_gpu_hours"] == pytest.approx(1.0)


def test_queue_progress_start_on_release_env_and_charges(hub):
    status, body = spawn(hub, "alice", {"project": "lattice", "slice": "gpu:1",
                                        "min_runtime": "1h"})
    assert status in (201, 202), body
    hub.wait_ready("alice")
    env_a = hub.server_env("alice")
    assert env_a["CUDA_VISIBLE_DEVICES"] == "GPU-tiny-0"
    assert env_a["GPUBUDGET_PROJECT"] == "lattice"

    # the cluster is full: carol's spawn waits in the queue, reporting progress
    status, body = spawn(hub, "carol", {"project": "astro", "slice": "gpu:1"})
    assert status in (201, 202), body  # accepted; the spawn waits in start()
    reader = ProgressReader(f"{hub.api}/users/carol/server/progress", hub.token)
    reader.start()
    ev = reader.wait_for(lambda e: "position 1 in the queue" in e.get("message", ""))
    assert "predicted start" in ev["message"]
    assert ev["gpubudget"]["queue_position"] == 1
    st, u = http("GET", f"{hub.api}/users/carol", hub.token)
    assert u["servers"][""]["pending"] == "spawn"
    st, mine = http("GET", hub.svc + "/sessions?user=carol", hub.token)
    assert [s["state"] for s in mine["sessions"]] == ["pending"]

    # alice stops: her charge ends, carol starts on the freed GPU
    st, _ = http("DELETE", f"{hub.api}/users/alice/server", hub.token)
    assert st in (202, 204)
    hub.wait_ready("carol")
    reader.wait_for(lambda e: e.get("ready") is True)
    msgs = [e.get("message", "") for e in reader.events]
    assert any(m.startswith("Granted tiny GPU 0") for m in msgs), msgs
    env_c = hub.server_env("carol")
    assert env_c["CUDA_VISIBLE_DEVICES"] == "GPU-tiny-0"
    assert env_c["GPUBUDGET_PROJECT"] == "astro"

    st, _ = http("DELETE", f"{hub.api}/users/carol/server", hub.token)
    assert st in (202, 204)
    deadline = time.monotonic() + 30
    while True:
        st, all_ = http("GET", hub.svc + "/sessions", hub.token)
        states = {s["user"]: s["state"] for s in all_["sessions"]}
        if states == {"alice": "done", "carol": "done"}:
            break
        assert time.monotonic() < deadline, all_
        time.sleep(0.2)

    led = Ledger(connect(hub.ledger_url, read_only=True))
    charges = {c.user: c for c in led.charges()}
    assert set(charges) == {"alice", "carol"}
    a, c = charges["alice"], charges["carol"]
    assert a.end is not None and c.end is not None  # stopping ended both charges
    assert (a.project, c.project) == ("lattice", "astro")
    assert a.milli == c.milli == 1000
    assert a.end <= c.start  # never two sessions on the one GPU
    usage = led.totals()
    assert usage["lattice"] > 0 and usage["astro"] > 0


def test_a_queued_spawn_can_be_cancelled_and_gives_up_after_the_maximum_wait(hub):
    status, body = spawn(hub, "alice", {"project": "lattice", "slice": "gpu:1",
                                        "min_runtime": "1h"})
    assert status in (201, 202), body
    hub.wait_ready("alice")

    # cancelled by the user while queued: withdrawn, never charged
    status, body = spawn(hub, "carol", {"project": "astro", "slice": "gpu:1"})
    assert status in (201, 202), body
    reader = ProgressReader(f"{hub.api}/users/carol/server/progress", hub.token)
    reader.start()
    reader.wait_for(lambda e: "position 1 in the queue" in e.get("message", ""))
    st, _ = http("DELETE", f"{hub.api}/users/carol/server", hub.token)
    assert st in (202, 204)
    deadline = time.monotonic() + 30
    while (s := http("GET", hub.svc + "/sessions?user=carol", hub.token)[1]["sessions"][-1]
           )["state"] == "pending":
        assert time.monotonic() < deadline, s
        time.sleep(0.2)
    assert s["state"] == "cancelled"
    while http("GET", f"{hub.api}/users/carol", hub.token)[1]["servers"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)

    # still queued after max_queue_wait (12 s here): the spawn fails with a clear message
    status, body = spawn(hub, "carol", {"project": "astro", "slice": "gpu:1"})
    assert status in (201, 202), body
    reader = ProgressReader(f"{hub.api}/users/carol/server/progress", hub.token)
    reader.start()
    ev = reader.wait_for(lambda e: e.get("failed"), timeout=60)
    assert "Still queued after" in ev["message"] and "nothing was charged" in ev["message"], ev
    s = http("GET", hub.svc + "/sessions?user=carol", hub.token)[1]["sessions"][-1]
    assert s["state"] == "cancelled"

    http("DELETE", f"{hub.api}/users/alice/server", hub.token)
    led = Ledger(connect(hub.ledger_url, read_only=True))
    assert [c.user for c in led.charges() if c.user == "carol"] == ["carol"]  # only the first run
