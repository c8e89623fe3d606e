"""Every write handler, not only job submission, answers 503 when the database ended its
transaction under a paused leader: here a cancel (DELETE /jobs/{id}) — with real replicas on
a real PostgreSQL ledger and a real pause (SIGSTOP), past the lease (another replica leads when
it wakes: ``not_leader``) and within it (it still leads, but PostgreSQL ended its idle
transaction after 5 s: ``ledger unavailable``).

The fault hook is the one fake (a ``sitecustomize`` in the replicas' PYTHONPATH, as in
test_submit_in_flight): it holds the cancel's transaction open after its first statement until
the test lets it go — a real process cannot be stopped at that exact moment otherwise. The
test stops the leader there; PostgreSQL ends the idle transaction (and, past the lease, the
other replica takes over); the woken leader's next statement meets the ended transaction. On
the previous main the pause within the lease was a 500 with a traceback; now 503 either way,
and the job is not cancelled (nothing was applied).
"""

from __future__ import annotations

import os
import threading
import time

import psycopg
import pytest

from tests.fixtures.hub import http
from tests.fixtures.postgres import postgres_server  # noqa: F401
from tests.fixtures.replicas import TOKENS
from tests.service.test_submit_in_flight import DirectCluster

HOOK = """
import os, time
from pathlib import Path
from sqlalchemy import text
from jupyter_gpubudget.ledger import store

_real = store.Ledger.stop


def stop(self, wid, **kw):
    s = kw.get("s")
    if kw.get("closed_by") != "cancel" or s is None:
        return _real(self, wid, **kw)
    here = Path(os.environ["GPUBUDGET_TEST_HOOK_DIR"])
    s.execute(text("SELECT 1"))  # the transaction is open
    (here / "paused").touch()
    while not (here / "go").exists():
        time.sleep(0.02)
    return _real(self, wid, **kw)


store.Ledger.stop = stop
"""


@pytest.fixture(params=[3.0, 14.0], ids=["past_the_lease", "within_the_lease"])
def cluster(request, postgres_server, tmp_path, monkeypatch):  # noqa: F811
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    monkeypatch.setenv("PYTHONPATH", f"{hook}:{os.environ.get('PYTHONPATH', '')}".rstrip(":"))
    monkeypatch.setenv("GPUBUDGET_TEST_HOOK_DIR", str(hook))
    url = postgres_server.new_database()
    c = DirectCluster(tmp_path, postgres_server.port, url.rsplit("/", 1)[1], n=2,
                      lease_seconds=request.param)
    c.url = url
    try:
        c.start()
        yield c
    finally:
        c.stop()


def test_a_cancel_in_flight_when_the_leader_pauses_gets_503(cluster):
    hook = cluster.dir / "hook"
    leader = cluster.wait_leader()
    bob = TOKENS["bob"][0]
    # (4 GPUs on a 4-GPU node twice: the second waits, so the cancel finds it pending)
    for name in ("holder", "waiter"):
        status, out = http("POST", leader.api + "/jobs", bob,
                           {"command": ["/bin/sleep", "120"], "project": "lattice", "gpus": 4,
                            "name": name}, timeout=30)
        assert status == 201, out
    wid = out["id"]
    answer: list = []
    t = threading.Thread(target=lambda: answer.append(
        http("DELETE", f"{leader.api}/jobs/{wid}", bob, timeout=90)), daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not (hook / "paused").exists():
        assert time.monotonic() < deadline, "the cancel never reached its transaction"
        time.sleep(0.02)
    leader.pause()
    try:
        (hook / "go").touch()  # (it goes on once it is woken)
        if cluster.lease_seconds < 5:
            cluster.wait_leader(timeout=60, not_=leader)  # after the database ended its write
        else:  # past idle_in_transaction_session_timeout (5 s), well within the lease
            time.sleep(6.5)
    finally:
        leader.resume()
    t.join(90)
    assert answer, "no answer"
    status, out = answer[0]
    assert status == 503, (status, out, leader.log_tail(3000))
    if cluster.lease_seconds < 5:
        assert out.get("error") == "not_leader", out
    else:
        assert "ledger unavailable" in out.get("message", ""), out
    with psycopg.connect(cluster.url) as c:
        state = c.execute("SELECT state FROM workloads WHERE id = %s", (wid,)).fetchone()[0]
    assert state != "cancelled"  # nothing was applied
    for r in cluster.replicas:  # (the holder and the waiter end with the test)
        r.stop()
