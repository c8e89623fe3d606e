"""Attacking the demo hub: after another connection held a write lock on the SQLite ledger, a
request that hit the lock left ``/healthz`` at 503 "ledger unavailable: database is locked"
for 48 s and more after the lock was released — while cycles succeeded — until some API
write happened to succeed. Health must follow the ledger: once it can be written again,
``/healthz`` is 200 within a few cycles, with no request needed to clear it."""

from __future__ import annotations

import sqlite3
import threading
import time

from tests.fixtures.hub import http


def test_health_recovers_when_the_lock_is_released_without_any_write(service_factory, tokens):
    svc = service_factory("--GpuBudgetService.ledger_busy_timeout=1")
    bob = tokens["bob"]
    path = svc.db_url.removeprefix("sqlite:///")
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(60)
        conn.execute("ROLLBACK")
        conn.close()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert locked.wait(10)
    try:
        st, out = http("POST", svc.api + "/jobs", bob,
                       {"command": "true", "project": "lattice", "gpus": 0}, timeout=30)
        assert st == 503 and "database is locked" in out["message"], out
        st, health = http("GET", svc.api + "/healthz", timeout=5)
        assert st == 503 and "ledger unavailable" in health["message"], health
        # while the lock is held, health goes on saying so (cycles may pass: they only read)
        first = health["cycle"]
        while health["cycle"] < first + 3:
            time.sleep(0.2)
            st, health = http("GET", svc.api + "/healthz", timeout=5)
            assert st == 503 and "ledger unavailable" in health["message"], health
    finally:
        release.set()
        t.join()
    # no write through the API from here on: only reads (and the service's own cycles)
    cycle = http("GET", svc.api + "/healthz")[1]["cycle"]
    deadline = time.monotonic() + 60  # generous: the assertion is on the state, not the time
    while True:
        st, health = http("GET", svc.api + "/healthz", timeout=5)
        if st == 200:
            break
        assert time.monotonic() < deadline, (
            f"/healthz still {st} after the lock was released, {health['cycle'] - cycle} "
            f"cycles later: {health}")
        time.sleep(0.2)
    assert health["status"] == "ok" and "reasons" not in health, health
    assert http("GET", svc.api + "/jobs", bob)[1]["jobs"] == []  # the refused write left nothing
