"""Busy GPU time beside the charge intervals and the usage report's figures, against SQLite
and a real PostgreSQL server (``ledger/busy.py``, ``ledger/reports.py``)."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger.reports import Scope, csv_rows, report

BUDGETS = """
admins: [root]
accounts:
  physics:
    grant: 100
    managers: [alice]
    children:
      lattice: {grant: 60, members: [bob, carol]}
      astro: {grant: 40, members: [dave]}
"""
GPU = {"kind": "gpu", "gpus": 1}
T0 = 1_750_000_000.0 - 1_750_000_000.0 % 86400  # a UTC midnight
UTC = ZoneInfo("UTC")
WEEK = 7 * 86400.0


@pytest.fixture
def ledger(db_url):
    upgrade(db_url)
    led = Ledger(connect(db_url))
    led.sync_budgets(load_budgets(BUDGETS), now=1.0)
    yield led
    led.dispose()


def run(led: Ledger, user: str, project: str, gpu: int, start: float, end: float | None,
        busy: float | None, step: float = 60.0, kind: str = "batch") -> str:
    w = led.submit(project=project, user=user, kind=kind, request=GPU, now=start - 30)
    led.start(w.id, placement=[{"node": "n1", "gpu": gpu, "milli": 1000}], milli=1000,
              backed=True, protected_until=None, now=start)
    stop = end if end is not None else start + 3600
    if busy is not None:
        t = start
        while t < stop:
            led.record_busy([(w.id, t, min(stop, t + step), busy, "device")])
            t += step
    if end is not None:
        led.stop(w.id, now=end, state="done", closed_by="exit")
    return w.id


def rep(led: Ledger, projects=("astro", "lattice"), only=None, start=T0, end=T0 + 86400,
        by="user", tz=UTC, now=None, account="physics"):
    with led.ro() as s:
        return report(s, account=account, scope=Scope(list(projects), only), start=start,
                      end=end, tz=tz, by=by, now=now if now is not None else end,
                      grants={"physics": 100.0, "lattice": 60.0, "astro": 40.0}, window=WEEK)


def test_busy_figures_per_user_and_project_match_the_samples(ledger):
    run(ledger, "bob", "lattice", 0, T0 + 3600, T0 + 3 * 3600, 0.9)  # 2 GPU-h at 90 %
    run(ledger, "carol", "lattice", 1, T0 + 3600, T0 + 2 * 3600, 0.1)  # 1 GPU-h at 10 %
    run(ledger, "dave", "astro", 2, T0 + 1800, T0 + 3 * 3600 + 1800, 0.1)  # 3 GPU-h at 10 %
    r = rep(ledger)
    p = {e["project"]: e for e in r["projects"]}
    users = {u["user"]: u for e in r["projects"] for u in e["users"]}
    assert users["bob"]["charged_gpu_h"] == pytest.approx(2.0)
    assert users["bob"]["busy_gpu_h"] == pytest.approx(1.8, rel=0.02)
    assert users["carol"]["busy_gpu_h"] == pytest.approx(0.1, rel=0.02)
    assert users["dave"]["busy_gpu_h"] == pytest.approx(0.3, rel=0.02)
    assert p["lattice"]["busy_gpu_h"] == pytest.approx(1.9, rel=0.02)
    assert p["lattice"]["idle_gpu_h"] == pytest.approx(1.1, rel=0.02)
    assert p["astro"]["idle_share"] == pytest.approx(0.9, rel=0.02)
    assert r["totals"]["charged_gpu_h"] == pytest.approx(6.0)
    assert r["totals"]["busy_gpu_h"] == pytest.approx(2.2, rel=0.02)
    # a grant per window, pro rata for the day
    assert p["lattice"]["grant_gpu_h"] == pytest.approx(60 / 7)


def test_nothing_measured_is_unknown_not_zero(ledger):
    run(ledger, "bob", "lattice", 0, T0 + 3600, T0 + 2 * 3600, None)
    r = rep(ledger)
    bob = r["projects"][1]["users"][0]
    assert bob["charged_gpu_h"] == pytest.approx(1.0)
    assert bob["busy_gpu_h"] is None and bob["idle_gpu_h"] is None
    assert r["totals"]["busy_gpu_h"] is None
    # a sample for a span no interval covers is not recorded
    w = run(ledger, "dave", "astro", 1, T0 + 7200, T0 + 9000, None)
    assert ledger.record_busy([(w, T0 + 10000, T0 + 11000, 0.5, "device")]) == 0


def test_history_past_the_window_by_day_in_the_readers_zone_and_csv_sums(ledger):
    # one hour a day for 30 days: far longer than the 7-day usage window
    for d in range(30):
        run(ledger, "bob", "lattice", 0, T0 + d * 86400 + 3600, T0 + d * 86400 + 7200, 0.5,
            step=600)
    tz = ZoneInfo("America/New_York")  # 01:00 UTC is the previous evening there
    r = rep(ledger, start=T0 - 86400, end=T0 + 31 * 86400, by="day", tz=tz)
    assert r["totals"]["charged_gpu_h"] == pytest.approx(30.0)
    assert r["totals"]["busy_gpu_h"] == pytest.approx(15.0, rel=0.02)
    days = [datetime.fromisoformat(p["start_local"]) for p in r["periods"]]
    assert len(days) == 30 and all(d.hour == 0 and d.tzinfo is not None for d in days)
    assert days[0].date().isoformat() == datetime.fromtimestamp(T0 + 3600, tz).date().isoformat()
    assert sum(p["projects"][0]["charged_gpu_h"] for p in r["periods"]) == pytest.approx(30.0)
    # by week: the same total
    w = rep(ledger, start=T0 - 86400, end=T0 + 31 * 86400, by="week", tz=tz)
    assert sum(p["projects"][0]["charged_gpu_h"] for p in w["periods"]) == pytest.approx(30.0)
    assert all(datetime.fromisoformat(p["start_local"]).weekday() == 0 for p in w["periods"])
    # CSV reads back and sums equal the JSON's
    buf = io.StringIO()
    csv.writer(buf).writerows(csv_rows(r))
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    per = [float(x["charged_gpu_h"]) for x in rows if x["row"] == "period"]
    total = [x for x in rows if x["row"] == "total"][0]
    assert sum(per) == pytest.approx(float(total["charged_gpu_h"]))
    assert float(total["busy_gpu_h"]) == pytest.approx(r["totals"]["busy_gpu_h"])


def test_open_intervals_count_until_now_and_a_researcher_sees_only_their_line(ledger):
    run(ledger, "bob", "lattice", 0, T0 + 3600, None, 0.5)  # still running
    run(ledger, "carol", "lattice", 1, T0 + 3600, T0 + 7200, 0.2)
    r = rep(ledger, now=T0 + 3 * 3600, by="day")
    lattice = r["projects"][1]
    assert lattice["charged_gpu_h"] == pytest.approx(3.0)  # bob 2 h so far, carol 1 h
    assert sum(e["charged_gpu_h"] for p in r["periods"] for e in p["projects"]) == \
        pytest.approx(3.0)
    mine = rep(ledger, projects=("lattice",), only="carol", now=T0 + 3 * 3600)
    assert [u["user"] for u in mine["projects"][0]["users"]] == ["carol"]
    assert mine["projects"][0]["charged_gpu_h"] == pytest.approx(3.0)  # the project's total


def test_retention_prunes_old_rollups(ledger):
    run(ledger, "bob", "lattice", 0, T0 + 3600, T0 + 7200, 0.5)
    run(ledger, "bob", "lattice", 0, T0 + 10 * 86400, T0 + 10 * 86400 + 3600, 0.5)
    assert ledger.prune_usage_history(T0 + 5 * 86400) > 0
    r = rep(ledger, start=T0, end=T0 + 20 * 86400)
    assert r["totals"]["charged_gpu_h"] == pytest.approx(1.0)


def test_idle_sessions_longest_first(ledger):
    run(ledger, "bob", "lattice", 0, T0 + 3600, T0 + 7200, 0.9, kind="interactive")
    idle = run(ledger, "dave", "astro", 1, T0 + 3600, T0 + 4 * 3600, 0.0, kind="interactive")
    run(ledger, "carol", "lattice", 2, T0 + 3600, T0 + 9 * 3600, 0.0)  # batch: not listed
    r = rep(ledger)
    assert [e["workload"] for e in r["idle_sessions"]][0] == idle
    assert r["idle_sessions"][0]["idle_gpu_h"] == pytest.approx(3.0)
    assert len(r["idle_sessions"]) == 2


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York", "Asia/Tokyo"])
def test_local_days_and_weeks_across_clock_changes_equal_a_brute_force_sum(ledger, zone):
    import random

    from jupyter_gpubudget.ledger.reports import period_start
    from jupyter_gpubudget.ledger.rollups import split_by_hour

    tz = ZoneInfo(zone)
    rnd = random.Random(7)
    base = datetime(2025, 3, 1, tzinfo=tz).timestamp()  # the spring change inside
    runs = []
    t = base
    for _ in range(60):
        t += rnd.uniform(3600, 40000)
        user, project = rnd.choice([("bob", "lattice"), ("carol", "lattice"), ("dave", "astro")])
        dur = rnd.uniform(600, 30000)
        runs.append((user, project, t, t + dur))
        run(ledger, user, project, 0, t, t + dur, 0.5, step=dur)
        t += dur
    start = datetime(2025, 3, 3, tzinfo=tz).timestamp()
    end = datetime(2025, 4, 14, tzinfo=tz).timestamp()
    for by in ("day", "week"):
        want: dict[tuple[str, float], float] = {}
        for _u, p, a, b in runs:
            for hour, ms, _ in split_by_hour(1000, a, b):
                if start <= hour < end:
                    k = (p, period_start(hour, tz, by).timestamp())
                    want[k] = want.get(k, 0.0) + ms / 3.6e6
        r = rep(ledger, start=start, end=end, by=by, tz=tz)
        got = {(e["project"], datetime.fromisoformat(per["start_local"]).timestamp()):
               e["charged_gpu_h"] for per in r["periods"] for e in per["projects"]}
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert got[k] == pytest.approx(v, abs=1e-6), (by, k)
        assert r["totals"]["charged_gpu_h"] == pytest.approx(sum(want.values()), abs=1e-6)
        assert r["totals"]["busy_gpu_h"] == pytest.approx(sum(want.values()) / 2, abs=1e-6)


def test_waits_and_preemptions_suffered(ledger):
    place = [{"node": "n1", "gpu": 0, "milli": 1000}]
    w = ledger.submit(project="lattice", user="bob", kind="batch", request=GPU,
                      now=T0 + 3600 - 120)
    ledger.start(w.id, placement=place, milli=1000, backed=True, protected_until=None,
                 now=T0 + 3600)
    ledger.stop(w.id, now=T0 + 7200, state="pending", closed_by="preempt")  # requeued
    ledger.start(w.id, placement=place, milli=1000, backed=True, protected_until=None,
                 now=T0 + 7200 + 1800)
    ledger.stop(w.id, now=T0 + 10800, state="done", closed_by="exit")
    s = ledger.submit(project="astro", user="dave", kind="interactive", request=GPU,
                      now=T0 + 3600)
    ledger.start(s.id, placement=[{"node": "n1", "gpu": 1, "milli": 1000}], milli=1000,
                 backed=True, protected_until=None, now=T0 + 3600 + 5)  # still running
    r = rep(ledger, now=T0 + 4 * 3600)
    p = {e["project"]: e for e in r["projects"]}
    assert p["lattice"]["preemptions"] == 1 and p["astro"]["preemptions"] == 0
    assert r["totals"]["preemptions"] == 1
    waits = r["waits"]["batch"]
    assert waits["count"] == 2  # before the first interval and after the preemption
    assert waits["p50_s"] == pytest.approx(120, rel=0.2)  # half an octave
    assert waits["p90_s"] == pytest.approx(1800, rel=0.2)
    assert r["waits"]["interactive"] == {"count": 1, "p50_s": 5, "p90_s": 5}  # runs now
    assert rep(ledger, only="carol", projects=("lattice",))["totals"]["preemptions"] == 0


def test_the_migration_rolls_up_the_history_already_there(db_url):
    from sqlalchemy import text

    upgrade(db_url, "0010")
    engine = connect(db_url)
    try:
        with engine.begin() as c:
            c.execute(text("INSERT INTO accounts (name, parent, members, managers, is_project, "
                           "updated_at) VALUES ('p', NULL, '[]', '[]', true, 0)"))
            c.execute(text("INSERT INTO workloads (id, name, project, \"user\", kind, state, "
                           "request, min_runtime, resumable, backend, submitted_at, backed, "
                           "preemptions, reason) VALUES ('w', '', 'p', 'u', 'batch', 'done', "
                           "'{}', 0, false, 'local', 3000, false, 1, '')"))
            for seq, (start, end, by) in enumerate([(3600.0, 9000.0, "preempt"),
                                                    (9120.0, 9300.0, "exit")], 1):
                c.execute(text("INSERT INTO charge_intervals (workload, seq, project, \"user\", "
                               "milli, start, \"end\", checkpoint, closed_by) VALUES "
                               f"('w', {seq}, 'p', 'u', 500, {start}, {end}, {end}, '{by}')"))
        upgrade(db_url)
        led = Ledger(engine)
        with led.ro() as s:
            r = report(s, account="p", scope=Scope(["p"]), start=0, end=86400, tz=UTC,
                       by="day", now=86400, grants={}, window=WEEK)
        assert r["totals"]["charged_gpu_h"] == pytest.approx(0.5 * (5400 + 180) / 3600)
        assert r["totals"]["busy_gpu_h"] is None  # nothing measured the history
        assert r["totals"]["preemptions"] == 1
        assert r["waits"]["batch"]["count"] == 2
        assert r["waits"]["batch"]["p90_s"] == pytest.approx(600, rel=0.2)
    finally:
        engine.dispose()
