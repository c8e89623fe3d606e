"""The leader lease and its fencing (service/leader.py) on a real PostgreSQL server, and the
local launcher's fence: a replica whose lease was taken over can neither write the ledger
nor start a job."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from jupyter_gpubudget.backends.base import Launch
from jupyter_gpubudget.backends.local import LocalBackend
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.service.leader import Lease, NotLeader
from tests.fixtures.ports import free_port
from tests.fixtures.postgres import postgres_server  # noqa: F401


@pytest.fixture
def pg_url(postgres_server):  # noqa: F811
    url = postgres_server.new_database()
    upgrade(url)
    return url


def expire(engine) -> None:  # noqa: ANN001
    """The lease runs out now (as it would once its holder stopped renewing)."""
    with engine.begin() as c:
        c.execute(text("UPDATE service_leader SET expires_at = extract(epoch from now()) - 1"))


def submit(ledger: Ledger, wid: str) -> None:
    ledger.submit(project="lattice", user="bob", kind="batch", request={"gpus": 1},
                  now=1000.0, workload_id=wid)


def test_one_replica_leads_and_a_takeover_fences_the_old_leader(pg_url):
    engine = connect(pg_url)
    a, b = Lease(engine, "http://a/", ttl=8, renew_interval=2), \
        Lease(engine, "http://b/", ttl=8, renew_interval=2)
    assert a.tick() == 1
    assert b.tick() is None  # a holds it
    assert b.leader_url() == "http://a/" and a.tick() == 1  # renewed, same token
    ledger_a = Ledger(engine)
    ledger_a.fence = a.check
    from jupyter_gpubudget.ledger.models import AccountRow

    with ledger_a.tx() as s:
        s.add(AccountRow(name="lattice", parent=None, members=["bob"], managers=[],
                         is_project=True, updated_at=0.0))
    submit(ledger_a, "w1")  # the leader writes

    ledger_b = Ledger(engine)
    ledger_b.fence = b.check
    with pytest.raises(NotLeader) as e:  # a standby writes nothing
        submit(ledger_b, "w2")
    assert e.value.leader == "http://a/"

    expire(engine)  # a is paused past its lease ...
    assert b.tick() == 2  # ... b takes over with a new token
    a.valid_until = float("inf")  # a, woken, still believes it leads
    with pytest.raises(NotLeader, match="stale"):
        ledger_a.start("w1", placement=[{"node": "n1", "gpu": 0, "milli": 1000}], milli=1000,
                       backed=True, protected_until=None, now=1001.0)
    assert ledger_a.get("w1").state == "pending"  # nothing applied
    assert a.token is None and not a.is_leader  # and it stepped down
    assert a.tick() is None and b.tick() == 2
    engine.dispose()


def test_a_takeover_waits_for_the_old_leaders_open_write(pg_url):
    """The fence reads the lease row FOR SHARE: a takeover cannot slip between the old
    leader's check and its commit."""
    engine = connect(pg_url)
    a, b = Lease(engine, "a"), Lease(engine, "b")
    assert a.tick() == 1
    ledger = Ledger(engine)
    ledger.fence = a.check
    expire(engine)  # ran out, but a still writes inside it
    with ledger.tx() as s:
        assert b.tick() is None  # blocked by a's transaction (lock_timeout), not taken
        s.execute(text("SELECT 1"))
    assert b.tick() == 2
    engine.dispose()


def test_a_leader_that_cannot_reach_the_database_steps_down_at_its_lease_end(pg_url):
    engine = connect(pg_url)
    a = Lease(engine, "a")
    assert a.tick() == 1
    a.engine = connect(f"postgresql://postgres@127.0.0.1:{free_port()}/nothing")
    assert a.tick() == 1  # unreachable, the lease still runs
    a.valid_until = 0.0  # ... until it ends
    assert a.tick() is None and not a.is_leader
    engine.dispose()


def test_release_lets_a_standby_take_over_at_once(pg_url):
    engine = connect(pg_url)
    a, b = Lease(engine, "a"), Lease(engine, "b")
    assert a.tick() == 1 and b.tick() is None
    a.release()
    assert b.tick() == 2 and a.tick() is None
    engine.dispose()


def test_the_launcher_refuses_a_stale_leaders_launch(tmp_path):
    from tests.fixtures.unixusers import TEMPLATE, ensure_accounts

    as_user = {"unix_user_template": TEMPLATE} if ensure_accounts(["bob"]) else {}
    old, new = (LocalBackend(state_dir=str(tmp_path / "jobs"), stop_grace=1, **as_user)
                for _ in range(2))
    old.fence(1)

    def launch(backend: LocalBackend, wid: str) -> str:
        return backend.launch(Launch(workload=wid, attempt=1, user="bob", project="lattice",
                                     command=["/bin/sleep", "30"], placement=[], env={},
                                     kind="batch", min_runtime=0.0, protected_until=None,
                                     backed=True, resumable=False, time_limit=None))

    try:
        launch(old, "aaaa1111")  # leads: it starts
        new.fence(2)  # another replica took over
        with pytest.raises(RuntimeError, match="stale"):
            launch(old, "bbbb2222")
        assert not (tmp_path / "jobs" / "bbbb2222" / "1").exists()  # nothing was started
        launch(new, "cccc3333")
        assert new.status("aaaa1111", 1).alive  # the old leader's job is adopted, not lost
    finally:
        for wid in ("aaaa1111", "cccc3333"):
            new.stop(wid, 1)


def test_a_replica_whose_clock_is_off_does_not_take_the_lease_and_says_why(pg_url):
    """One clock: charges are timed by the leader's clock, the lease by the database's. A
    replica 120 s ahead or behind (the offset injected through its ``clock``: a real clock
    cannot be skewed per process here) does not lead, and says why; one in step does."""
    import time

    engine = connect(pg_url)
    try:
        for skew in (120.0, -120.0):
            off = Lease(engine, "off", clock=lambda skew=skew: time.time() + skew)
            assert off.tick() is None and not off.is_leader
            assert off.clock_problem is not None
            assert ("ahead of" if skew > 0 else "behind") in off.clock_problem
            assert abs(off.clock_offset - skew) < 1.0
        good = Lease(engine, "good")
        assert good.tick() == 1 and good.clock_problem is None
        assert abs(good.clock_offset) < 1.0
    finally:
        engine.dispose()


def test_a_leader_whose_clock_drifts_off_gives_the_lease_up_at_once(pg_url):
    import time

    engine = connect(pg_url)
    skew = [0.0]
    try:
        a = Lease(engine, "a", clock=lambda: time.time() + skew[0])
        b = Lease(engine, "b")
        assert a.tick() == 1 and b.tick() is None
        skew[0] = -120.0  # a's clock is stepped back
        assert a.tick() is None and not a.is_leader and "behind" in a.clock_problem
        assert b.tick() == 2  # released: b takes over without waiting for the lease's end
        skew[0] = 0.0
        assert a.tick() is None and a.clock_problem is None  # in step again: it stands by
    finally:
        engine.dispose()
