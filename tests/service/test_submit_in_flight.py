"""A job submission in flight when its leader pauses is answered 503 (as documented: the
write was not applied, retry), not 500 — with real replicas on a real PostgreSQL ledger and
a real pause (SIGSTOP).

The leader is paused with its write transaction open: the fault hook (the one fake, a
``sitecustomize`` in the replicas' PYTHONPATH) holds the submission after its first statement
until the test lets it go — a real process cannot be stopped at that exact moment otherwise.
The test stops the leader there (SIGSTOP); PostgreSQL ends its idle transaction
(``idle_in_transaction_session_timeout``), the other replica takes over, and the leader wakes
up to send its next statement in a transaction the database has already ended.
"""

from __future__ import annotations

import json
import os
import threading
import time

import psycopg
import pytest

from tests.fixtures.hub import http
from tests.fixtures.postgres import postgres_server  # noqa: F401
from tests.fixtures.replicas import BUDGETS, INVENTORY, TOKENS, Cluster, Proxy, Replica

HOOK = """
import os, time
from pathlib import Path
from sqlalchemy import text
from jupyter_gpubudget.ledger import store

_real = store.Ledger.submit


def _hold(s):
    here = Path(os.environ["GPUBUDGET_TEST_HOOK_DIR"])
    s.execute(text("SELECT 1"))  # the transaction is open
    (here / "paused").touch()
    while not (here / "go").exists():
        time.sleep(0.02)
def submit(self, **kw):
    if kw.get("name") != "in-flight":
        return _real(self, **kw)
    if kw.get("s") is not None:  # inside the handler's own transaction
        _hold(kw["s"])
        return _real(self, **kw)
    with self.tx() as s:
        _hold(s)
        return _real(self, **kw, s=s)


store.Ledger.submit = submit
"""


class DirectCluster(Cluster):
    """Two replicas that reach the database directly (no cuttable proxy in between: what
    the database tells a replica when it ends its transaction reaches it as sent)."""

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "budgets.yaml").write_text(BUDGETS)
        (self.dir / "inventory.yaml").write_text(INVENTORY)
        tok = self.dir / "tokens.json"
        tok.write_text(json.dumps({t: {"name": u, "scopes": s} for u, (t, s) in TOKENS.items()}))
        tok.chmod(0o600)
        for i in range(self.n):
            r = Replica(chr(ord("a") + i), self.dir, self.url, Proxy(self.pg_port),
                        lease_seconds=self.lease_seconds)
            self.replicas.append(r)
            r.start()


@pytest.fixture
def cluster(postgres_server, tmp_path, monkeypatch):  # noqa: F811
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    monkeypatch.setenv("PYTHONPATH", f"{hook}:{os.environ.get('PYTHONPATH', '')}".rstrip(":"))
    monkeypatch.setenv("GPUBUDGET_TEST_HOOK_DIR", str(hook))
    url = postgres_server.new_database()
    c = DirectCluster(tmp_path, postgres_server.port, url.rsplit("/", 1)[1], n=2)
    c.url = url
    try:
        c.start()
        yield c
    finally:
        c.stop()


def test_a_submit_in_flight_when_the_leader_pauses_gets_503(cluster):
    hook = cluster.dir / "hook"
    body = {"command": ["/bin/true"], "project": "lattice", "gpus": 1, "name": "in-flight"}
    for _ in range(3):  # on a loaded machine the 3 s lease may move before the submit lands
        leader = cluster.wait_leader()
        answer: list = []
        t = threading.Thread(target=lambda url=leader.api + "/jobs", out=answer: out.append(
            http("POST", url, TOKENS["bob"][0], body, timeout=90)), daemon=True)
        t.start()
        deadline = time.monotonic() + 60
        while not (hook / "paused").exists() and not answer:
            assert time.monotonic() < deadline, "the submission never reached its transaction"
            time.sleep(0.02)
        if (hook / "paused").exists():
            break
        t.join()
        assert answer[0][0] == 503, answer  # refused by a replica that no longer led: try again
    else:
        raise AssertionError(f"the submission never reached its transaction: {answer}")
    leader.pause()
    try:
        (hook / "go").touch()  # (it goes on once it is woken)
        cluster.wait_leader(timeout=60, not_=leader)  # after the database ended its write
    finally:
        leader.resume()
    t.join(90)
    assert answer, "no answer"
    status, out = answer[0]
    assert status == 503, (status, out, leader.log_tail(3000))
    assert out.get("error") == "not_leader" or "ledger unavailable" in out.get("message", "")
    with psycopg.connect(cluster.url) as c:
        names = [r[0] for r in c.execute("SELECT name FROM workloads").fetchall()]
    assert "in-flight" not in names  # nothing was applied
