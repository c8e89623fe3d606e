"""Sessions nobody vouches for are ended by the service: a queued spawn the hub stopped waiting
for is cancelled (never charged); a running session whose heartbeats stopped is closed at its
last checkpoint. Real JupyterHub (tokens) and the real service process."""

from __future__ import annotations

import time

import pytest

from jupyter_gpubudget.ledger import Ledger, connect
from tests.hub.hubproc import require_hub_parts


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    require_hub_parts()
    from tests.fixtures.hub import ServiceProc, start_hub

    hub = start_hub(tmp_path_factory.mktemp("rhub"))
    d = tmp_path_factory.mktemp("rsvc")
    svc = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}")
    mp = pytest.MonkeyPatch()
    mp.setenv("GPUBUDGET_SESSION_STALE_S", "3")
    try:
        svc.start()
    finally:
        mp.undo()
    yield hub, svc, hub.token("root")
    svc.stop()
    hub.stop()


def test_silent_sessions_are_ended(env):
    from tests.fixtures.hub import http

    hub, svc, root = env
    ids = []
    for _ in range(3):  # two GPUs: two run, one waits
        st, s = http("POST", svc.api + "/sessions", root,
                     {"user": "dave", "project": "astro", "gpus": 1})
        assert st == 201, s
        ids.append(s["id"])
    # nobody heartbeats or long-polls any more: within ~2 x 3 s all three are ended
    deadline = time.monotonic() + 30
    while True:
        states = [http("GET", f"{svc.api}/sessions?user=dave", root)[1]["sessions"][i]["state"]
                  for i in range(3)]
        # the listing does not count as a sign of life; only the spawner's calls do
        if all(x in ("failed", "cancelled") for x in states):
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.3)
    assert sorted(states) == ["cancelled", "failed", "failed"], states
    led = Ledger(connect(svc.db_url, read_only=True))
    for wid in ids:
        for ch in led.charges(workload=wid):
            assert ch.end is not None and ch.closed_by == "lost"
            assert ch.end == ch.checkpoint  # only time vouched for
