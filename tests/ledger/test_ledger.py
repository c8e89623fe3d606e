"""The ledger against SQLite and a real PostgreSQL server."""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import inspect

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, LedgerError, connect, upgrade
from jupyter_gpubudget.ledger.db import current_revision, head_revision

BUDGETS = """
admins: [root]
accounts:
  physics:
    grant: 100
    managers: [alice]
    children:
      lattice: {grant: 60, members: [bob]}
      astro: {grant: 40, members: [dave]}
  biology:
    share: 40%
    children:
      genomics: {members: [erin]}
"""

GPU = {"kind": "gpu", "gpus": 1}


@pytest.fixture
def ledger(db_url):
    upgrade(db_url)
    engine = connect(db_url)
    led = Ledger(engine)
    led.sync_budgets(load_budgets(BUDGETS), now=1.0)
    yield led
    engine.dispose()


def test_migrations_create_every_table_and_are_idempotent(db_url):
    upgrade(db_url)
    upgrade(db_url)  # a second start applies nothing and fails nothing
    engine = connect(db_url)
    try:
        names = set(inspect(engine).get_table_names())
        assert {"accounts", "grants", "workloads", "charge_intervals", "snapshots",
                "decisions", "idempotency", "alembic_version"} <= names
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_grants_are_versioned_with_who_and_when(ledger):
    assert ledger.current_grants()["lattice"].grant_hours == 60
    ledger.set_grant("lattice", 80.0, None, by="alice", now=10.0, note="more")
    hist = ledger.grant_history("lattice")
    assert [(g.version, g.grant_hours, g.changed_by, g.changed_at) for g in hist] == [
        (1, 60.0, "file:budgets.yaml", 1.0), (2, 80.0, "alice", 10.0)]
    # re-reading an unchanged file keeps the API change ...
    assert ledger.sync_budgets(load_budgets(BUDGETS), now=20.0) == []
    assert ledger.current_grants()["lattice"].grant_hours == 80
    # ... a changed file records a new version
    changed = ledger.sync_budgets(load_budgets(BUDGETS.replace("grant: 60", "grant: 70")), 30.0)
    assert changed == ["lattice"]
    assert ledger.current_grants()["lattice"].grant_hours == 70
    assert len(ledger.grant_history("lattice")) == 3
    audit = ledger.decisions(kind="grant")
    assert any(d.actor == "alice" and d.detail["account"] == "lattice" for d in audit)
    assert ledger.current_grants()["biology"].share_pct == 40


def test_unknown_account_grant_is_404_and_changes_nothing(ledger):
    with pytest.raises(LedgerError) as e:
        ledger.set_grant("nope", 1.0, None, by="root", now=2.0)
    assert e.value.status == 404
    assert "nope" not in ledger.current_grants()


def _submit(ledger, now=0.0, **kw):
    args = dict(project="lattice", user="bob", kind="batch", request=GPU, now=now)
    args.update(kw)
    return ledger.submit(**args)


def test_start_stop_charges_exactly_once(ledger):
    w = _submit(ledger)
    ledger.start(w.id, placement=[{"node": "n1", "gpu": 0, "milli": 1000}], milli=1000,
                 backed=True, protected_until=100.0, now=10.0)
    with pytest.raises(LedgerError) as e:  # a second start of a running workload
        ledger.start(w.id, placement=[], milli=1000, backed=True, protected_until=None, now=11.0)
    assert e.value.status == 409
    ledger.checkpoint(50.0)
    assert ledger.open_interval(w.id).checkpoint == 50.0
    ledger.stop(w.id, now=70.0, state="done", closed_by="exit", exit_code=0)
    with pytest.raises(LedgerError):
        ledger.stop(w.id, now=90.0, state="done", closed_by="exit")
    assert ledger.totals() == {"lattice": 1000 * 60.0}
    assert ledger.get(w.id).state == "done" and ledger.get(w.id).exit_code == 0


def test_requeue_after_preemption_opens_a_new_interval(ledger):
    w = _submit(ledger, resumable=True)
    ledger.start(w.id, placement=[], milli=500, backed=False, protected_until=None, now=0.0)
    ledger.stop(w.id, now=10.0, state="pending", closed_by="preempt", reason="for x")
    row = ledger.get(w.id)
    assert (row.state, row.preemptions, row.placement, row.submitted_at) == ("pending", 1, None, 0.0)
    ledger.start(w.id, placement=[], milli=500, backed=True, protected_until=None, now=20.0)
    ledger.stop(w.id, now=24.0, state="done", closed_by="exit")
    assert [(c.seq, c.start, c.end, c.closed_by) for c in ledger.charges(workload=w.id)] == [
        (1, 0.0, 10.0, "preempt"), (2, 20.0, 24.0, "exit")]
    assert ledger.totals()["lattice"] == 500 * 14


def test_crash_settlement_charges_up_to_the_last_checkpoint(ledger):
    w = _submit(ledger)
    ledger.start(w.id, placement=[], milli=1000, backed=True, protected_until=None, now=100.0)
    ledger.checkpoint(130.0)
    # the process died somewhere after 130; restart settles at the checkpoint
    ledger.stop(w.id, now=None, state="failed", closed_by="reconcile", reason="lost")
    assert ledger.totals()["lattice"] == 1000 * 30
    assert ledger.get(w.id).ended_at == 130.0


def test_interval_never_negative(ledger):
    w = _submit(ledger)
    ledger.start(w.id, placement=[], milli=1000, backed=True, protected_until=None, now=100.0)
    ledger.stop(w.id, now=90.0, state="done", closed_by="exit")  # clock stepped back
    assert ledger.totals()["lattice"] == 0


def test_idempotency_key_applies_once(ledger):
    calls = []

    def apply(s):
        calls.append(1)
        w = ledger.submit(project="astro", user="dave", kind="batch", request=GPU, now=1.0, s=s)
        return 201, {"id": w.id}

    a = ledger.idempotent("dave:k1", apply, now=1.0)
    b = ledger.idempotent("dave:k1", apply, now=2.0)
    assert a[:2] == b[:2] and (a[2], b[2]) == (False, True) and len(calls) == 1
    assert len(ledger.workloads(user="dave")) == 1


def test_failed_transaction_leaves_no_trace(ledger):
    def apply(s):
        ledger.submit(project="astro", user="dave", kind="batch", request=GPU, now=1.0, s=s)
        raise LedgerError(400, "boom", "x")

    with pytest.raises(LedgerError):
        ledger.idempotent("dave:k2", apply, now=1.0)
    assert ledger.workloads(user="dave") == []
    with pytest.raises(LedgerError) as e:
        ledger.submit(project="nope", user="dave", kind="batch", request=GPU, now=1.0)
    assert e.value.field == "project"


def test_concurrent_starts_of_one_workload_open_one_interval(ledger):
    w = _submit(ledger)
    results: list[str] = []

    def go():
        try:
            ledger.start(w.id, placement=[], milli=1000, backed=True, protected_until=None,
                         now=5.0)
            results.append("ok")
        except LedgerError as e:
            results.append(str(e.status))

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["409", "409", "409", "ok"]
    assert len(ledger.charges(workload=w.id)) == 1


ops = st.lists(st.tuples(st.sampled_from(["start", "stop", "requeue", "checkpoint", "settle"]),
                         st.integers(0, 2), st.integers(1, 50)), min_size=1, max_size=25)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=ops)
def test_totals_match_a_model_of_any_operation_sequence(ledger, script):
    ids = [_submit(ledger, resumable=True).id for _ in range(3)]
    model_open: dict[str, tuple[float, float]] = {}  # id -> (start, checkpoint)
    expected = ledger.totals().get("lattice", 0.0)
    t = 1000.0
    for op, i, dt in script:
        t += dt
        wid = ids[i]
        state = ledger.get(wid).state
        if op == "start" and state == "pending":
            ledger.start(wid, placement=[], milli=250, backed=True, protected_until=None, now=t)
            model_open[wid] = (t, t)
        elif op in ("stop", "requeue", "settle") and state == "running":
            new = "pending" if op == "requeue" else "done"
            ledger.stop(wid, now=None if op == "settle" else t, state=new, closed_by=op)
            start, cp = model_open.pop(wid)
            expected += 250 * ((cp if op == "settle" else t) - start)
        elif op == "checkpoint":
            ledger.checkpoint(t)
            model_open = {k: (s, t) for k, (s, _) in model_open.items()}
    assert ledger.totals().get("lattice", 0.0) == expected
    for wid in ids:
        opened = [c for c in ledger.charges(workload=wid) if c.end is None]
        assert len(opened) == (1 if ledger.get(wid).state == "running" else 0)


def test_migrations_match_the_models(db_url):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from jupyter_gpubudget.ledger.models import Base

    upgrade(db_url)
    engine = connect(db_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []
    finally:
        engine.dispose()


def test_sqlite_runs_in_wal_mode(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    upgrade(url)
    engine = connect(url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_postgres_fixture_fails_rather_than_skips_under_ci(monkeypatch):
    from tests.fixtures import postgres

    monkeypatch.setattr(postgres, "find_bin", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        postgres.start_postgres()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        postgres.start_postgres()


def test_closing_an_interval_adds_its_usage_to_hourly_rollups_once(ledger):
    """A cycle reads the rollups, not every interval of the history: they must hold exactly
    what the closed intervals charged, split at clock hours, added once."""
    from jupyter_gpubudget.ledger.models import UsageRollupRow

    led = ledger
    h = 1_000 * 3600.0
    w = led.submit(project="lattice", user="bob", kind="batch", request={"gpus": 2}, now=h)
    led.start(w.id, placement=[], milli=2000, backed=True, protected_until=None,
              now=h + 1800)
    led.stop(w.id, now=h + 3 * 3600 + 900, state="done", closed_by="exit")
    with pytest.raises(LedgerError):  # a second stop changes nothing
        led.stop(w.id, now=h + 5 * 3600, state="done", closed_by="exit")
    with led.ro() as s:
        rows = {r.hour: (r.gpu_ms, r.last_end) for r in s.query(UsageRollupRow)}
    assert rows == {h: (2000 * 1800, h + 3600), h + 3600: (2000 * 3600, h + 7200),
                    h + 7200: (2000 * 3600, h + 3 * 3600),
                    h + 3 * 3600: (2000 * 900, h + 3 * 3600 + 900)}
    total = sum(v[0] for v in rows.values())
    assert total == 2000 * (3 * 3600 + 900 - 1800)  # exactly what the interval charged
    closed = led.usage_for_window(h + 2 * 3600)
    assert [c[1] for c in closed] == [h + 3600, h + 7200, h + 3 * 3600]
    assert led.open_charges() == []


def test_the_rollup_migration_buckets_the_history_already_there(db_url):
    from sqlalchemy import text

    upgrade(db_url, "0003")
    engine = connect(db_url)
    try:
        with engine.begin() as c:
            c.execute(text("INSERT INTO accounts (name, parent, members, managers, is_project, "
                           "updated_at) VALUES ('p', NULL, '[]', '[]', true, 0)"))
            c.execute(text("INSERT INTO workloads (id, name, project, \"user\", kind, state, "
                           "request, min_runtime, resumable, backend, submitted_at, backed, "
                           "preemptions, reason) VALUES ('w', '', 'p', 'u', 'batch', 'done', "
                           "'{}', 0, false, 'local', 0, false, 0, '')"))
            for seq, (start, end) in enumerate([(3600.0, 9000.0), (7000.0, 7200.0)], 1):
                c.execute(text("INSERT INTO charge_intervals (workload, seq, project, \"user\", "
                               "milli, start, \"end\", checkpoint, closed_by) VALUES "
                               f"('w', {seq}, 'p', 'u', 500, {start}, {end}, {end}, 'exit')"))
        upgrade(db_url)
        with engine.begin() as c:
            rows = dict(c.execute(text("SELECT hour, gpu_ms FROM usage_rollups "
                                       "WHERE project = 'p' ORDER BY hour")).all())
        assert rows == {3600.0: 500 * (3600 + 200), 7200.0: 500 * 1800}
    finally:
        engine.dispose()


change_ops = st.lists(st.tuples(
    st.sampled_from(["submit", "start", "stop", "requeue", "preempt", "cancel", "ref",
                     "edit", "bulk", "checkpoint", "failed_tx"]),
    st.integers(0, 5), st.integers(1, 4000)), min_size=1, max_size=30)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=change_ops)
def test_the_service_rereads_only_what_changed_and_sees_every_change(ledger, script):
    """The service's cycle rereads only the workloads this process wrote since its last read
    (``Ledger.watch_workloads``): after any sequence of writes, through every path that writes
    workloads (ledger methods, an ORM edit in a caller's transaction, a bulk insert, a failed
    transaction), its incremental reads equal a fresh full read."""
    import uuid

    from sqlalchemy import insert as sql_insert

    from jupyter_gpubudget.ledger.models import WorkloadRow
    from jupyter_gpubudget.service.state import LiveWorkloads

    live = LiveWorkloads()
    ids = [_submit(ledger, now=float(i), user=f"u{i}").id for i in range(3)]
    node = f"n-{uuid.uuid4().hex[:8]}"
    t = 10.0
    # what the service rereads only when these versions move
    seen = (ledger.usage_version, ledger.usage_for_window(0.0),
            ledger.preemption_version, ledger.preemptions_by_project())
    for op, i, dt in script:
        t += dt
        wid = ids[i % len(ids)]
        state = ledger.get(wid).state
        if op == "submit":
            ids.append(_submit(ledger, now=t, kind=["batch", "interactive"][i % 2]).id)
        elif op == "start" and state == "pending":
            # (a GPU of its own: the ledger outlives one example, and refuses a GPU held)
            ledger.start(wid, placement=[{"node": node, "gpu": ids.index(wid), "milli": 1000}],
                         milli=1000, backed=True, protected_until=t + 60, now=t)
        elif op in ("stop", "requeue", "preempt") and state == "running":
            ledger.stop(wid, now=t, state="done" if op == "stop" else "pending",
                        closed_by="exit" if op == "stop" else op)
        elif op == "cancel" and state in ("pending", "running"):
            ledger.stop(wid, now=t, state="cancelled", closed_by="cancel")
        elif op == "ref" and state == "running":
            ledger.set_backend_ref(wid, f"ref-{t}")
        elif op == "edit" and state == "running":  # as the idle report does
            with ledger.tx() as s:
                s.get(WorkloadRow, wid).protected_until = t
        elif op == "bulk":
            bulk = uuid.uuid4().hex[:12]  # (the ledger outlives one example)
            with ledger.tx() as s:
                s.execute(sql_insert(WorkloadRow), [{
                    "id": bulk, "name": "", "project": "astro", "user": "dave",
                    "kind": "batch", "state": "pending", "request": GPU, "submitted_at": t,
                    "min_runtime": 0.0, "resumable": False, "backend": "local",
                    "backed": False, "preemptions": 0, "reason": ""}])
            ids.append(bulk)
        elif op == "checkpoint":
            ledger.checkpoint(t)
        elif op == "failed_tx":
            with pytest.raises(RuntimeError), ledger.tx() as s:
                s.get(WorkloadRow, wid).state = "running"
                s.flush()
                raise RuntimeError("rolled back")
        if i % 2:  # read every other step: changes pile up between reads too
            continue
        full = sorted(ledger.live(), key=lambda r: (r.submitted_at, r.id))
        assert live.rows(ledger) == full
        rows, _ = live.open_charges(ledger)  # (its checkpoints may be older: not compared)
        assert sorted(tuple(c)[:6] for c in rows) == sorted(
            tuple(c)[:6] for c in ledger.open_charges())
        idle, stopping = ledger.running_marks()
        got = live.convert(live.rows(ledger), idle, stopping, frozenset({"local"}), {}, t)
        assert got == LiveWorkloads().convert(full, idle, stopping, frozenset({"local"}), {}, t)
        now_seen = (ledger.usage_version, ledger.usage_for_window(0.0),
                    ledger.preemption_version, ledger.preemptions_by_project())
        if now_seen[0] == seen[0]:
            assert now_seen[1] == seen[1]
        if now_seen[2] == seen[2]:
            assert now_seen[3] == seen[3]
        seen = now_seen
        # the cycle's closed usage is each hour's rollup split among the members charged in
        # it (the rest the project's): per project and hour it sums to the ledger's rollup
        summed: dict[tuple, float] = {}
        for c in live.usage(ledger, 0.0):
            key = (c.project, c.start, c.end)
            summed[key] = summed.get(key, 0.0) + c.milli
        assert summed == {(p, a, b): pytest.approx(m) for p, a, b, m in seen[1]}


def test_starts_recorded_together_in_savepoints_are_told_when_the_whole_commits(ledger):
    """The scheduling loop records a batch of Starts in one transaction, each in a savepoint
    of its own (one the ledger refuses is left out alone): the service's watch of what was
    written hears of them when that transaction commits, not as a savepoint is released,
    and a refused one's rollback forgets none of the others."""
    import uuid

    a, b = _submit(ledger, now=1.0), _submit(ledger, now=2.0)
    watch = ledger.watch_workloads()
    assert watch.take() is None  # (the first look: everything)
    gpu = [{"node": f"n-{uuid.uuid4().hex[:8]}", "gpu": 0, "milli": 1000}]
    with ledger.tx() as s:
        with s.begin_nested():
            ledger.start(a.id, placement=gpu, milli=1000, backed=True, protected_until=None,
                         now=10.0, s=s)
        assert watch.take() == set()  # not committed yet: nothing to read again
        with pytest.raises(LedgerError) as e, s.begin_nested():
            ledger.start(b.id, placement=gpu, milli=1000, backed=True, protected_until=None,
                         now=10.0, s=s)  # its GPU is a's
        assert e.value.status == 409
    assert watch.take() == {a.id}
    assert ledger.get(a.id).state == "running" and ledger.get(b.id).state == "pending"
    assert [c.workload for c in ledger.open_charges([a.id, b.id])] == [a.id]


def test_usage_and_preemption_versions_move_exactly_with_what_they_track(ledger):
    """The service rereads usage rollups and preemption totals only when these move: an
    arrival or a start moves neither; a preemption closes an interval and counts one."""
    versions = lambda: (ledger.usage_version, ledger.preemption_version)  # noqa: E731
    w = _submit(ledger, now=10.0)
    v0 = versions()
    _submit(ledger, now=11.0)
    ledger.start(w.id, placement=[], milli=1000, backed=True, protected_until=None, now=20.0)
    assert versions() == v0
    before = ledger.preemptions_by_project().get("lattice", 0)
    ledger.stop(w.id, now=4000.0, state="pending", closed_by="preempt")
    assert ledger.preemptions_by_project()["lattice"] == before + 1
    assert versions()[0] > v0[0] and versions()[1] > v0[1]
    v1 = versions()
    ledger.start(w.id, placement=[], milli=1000, backed=True, protected_until=None, now=5000.0)
    ledger.stop(w.id, now=6000.0, state="done", closed_by="exit")  # usage, no preemption
    assert versions()[0] > v1[0] and versions()[1] == v1[1]


def test_reads_from_several_threads_at_once_stay_whole(ledger):
    """The service builds the core's state from its cycle thread and from request threads
    (a reported start checks the slice is free; the queue and preview pages) at the same
    time, through one cache of converted rows. Reading while others read and the ledger is
    written never fails (a torn cache raised KeyError: a 500 to an external backend) and
    ends equal to a fresh read."""
    from jupyter_gpubudget.core.inventory import Inventory, make_node
    from jupyter_gpubudget.core.model import Policy
    from jupyter_gpubudget.service.state import LiveWorkloads, build_state

    tree = load_budgets(BUDGETS).accounts
    inv = Inventory((make_node("n1", "H100-80GB", 8),))
    live = LiveWorkloads()
    ids = [_submit(ledger, now=float(i), user="bob").id for i in range(80)]
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                build_state(ledger, tree, inv, Policy(), 5000.0, live=live)
            except BaseException as e:  # noqa: BLE001 — reported below
                errors.append(e)
                return

    readers = [threading.Thread(target=read) for _ in range(3)]
    for r in readers:
        r.start()
    try:
        t = 100.0
        for k in range(60):
            t += 10
            wid = ids[k]
            ledger.start(wid, placement=[{"node": f"n{k // 8 + 1}", "gpu": k % 8,
                                          "milli": 1000}],
                         milli=1000, backed=True, protected_until=t + 60, now=t)
            if k % 3 == 0:
                ledger.stop(wid, now=t + 5, state="done", closed_by="exit")
            ids.append(_submit(ledger, now=t, user="bob").id)
    finally:
        done.set()
        for r in readers:
            r.join()
    assert not errors, repr(errors[0])
    got, rows = build_state(ledger, tree, inv, Policy(), 5000.0, live=live)
    fresh, fresh_rows = build_state(ledger, tree, inv, Policy(), 5000.0)
    assert rows == fresh_rows
    assert (got.running, got.pending, got.charges) == (fresh.running, fresh.pending,
                                                      fresh.charges)


def test_the_days_preemption_losses_are_read_back_for_the_drain_budget(ledger):
    """``Policy.finish_drain_budget``: each preemption's intent (``preempting``, or
    ``preempt-requested`` for a session its holder stops) carries what it threw away; the
    state a cycle is built from holds those of the last day, oldest first. Hostile or
    missing values (text, a boolean, a negative, none) count as nothing."""
    from jupyter_gpubudget.core.inventory import Inventory, make_node
    from jupyter_gpubudget.core.model import Policy
    from jupyter_gpubudget.core.scheduler import LOSS_WINDOW
    from jupyter_gpubudget.service.state import build_state

    now = 10 * 86400.0
    for at, kind, detail in (
            (now - LOSS_WINDOW - 60, "preempting", {"lost_gpu_hours": 9.0}),  # a day ago
            (now - 600, "preempting", {"lost_gpu_hours": 0.5}),
            (now - 590, "preempt", {"lost_gpu_hours": 0.5}),  # the notice, not counted again
            (now - 300, "preempt-requested", {"lost_gpu_hours": 0.25}),
            (now - 200, "preempting", {"lost_gpu_hours": "lots"}),
            (now - 150, "preempting", {"lost_gpu_hours": True}),
            (now - 120, "preempting", {"lost_gpu_hours": -3}),
            (now - 100, "preempting", {}),
            (now - 90, "start", {"lost_gpu_hours": 7.0})):
        ledger.record_decision(now=at, kind=kind, workload="w", detail=detail)
    assert ledger.recent_losses(now - LOSS_WINDOW) == [(now - 600, 0.5), (now - 300, 0.25)]
    tree = load_budgets(BUDGETS).accounts
    inv = Inventory((make_node("n1", "H100-80GB", 8),))
    state, _ = build_state(ledger, tree, inv, Policy(), now)
    assert list(state.recent_losses) == [(now - 600, 0.5), (now - 300, 0.25)]
