"""The usage report read from the rollups (``ledger/reports.py``) gives the same answers as
the raw ledger: a small random ledger's charge intervals (with requeues after preemptions,
fractional slices, work still running and work nothing measured) and its busy samples, summed
directly, per project and user, per local day and week across a clock change, and the
preemptions suffered — on SQLite and a real PostgreSQL server."""

from __future__ import annotations

import random
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger.models import BusyChargeRow, ChargeRow
from jupyter_gpubudget.ledger.reports import Scope, period_start, report

BUDGETS = """
admins: [root]
accounts:
  physics:
    grant: 100
    managers: [alice]
    children:
      lattice: {grant: 60, members: [bob, carol]}
      astro: {grant: 40, members: [dave, erin]}
"""
USERS = [("bob", "lattice"), ("carol", "lattice"), ("dave", "astro"), ("erin", "astro")]
TZ = ZoneInfo("Europe/Berlin")
GPU = {"kind": "gpu", "gpus": 1}
MS_PER_H = 3.6e6


@pytest.fixture
def ledger(db_url):
    upgrade(db_url)
    led = Ledger(connect(db_url))
    led.sync_budgets(load_budgets(BUDGETS), now=1.0)
    yield led
    led.dispose()


def random_ledger(led: Ledger, seed: int, base: float, days: int):
    """Workloads at random over ``days`` from ``base``: 1 to 3 intervals each (preempted and
    requeued between them), a slice of 1/7, 1/2, 1 or 2 GPUs, sampled busy in random spans
    at a random fraction (or never sampled); the last few still running. Returns the
    samples as recorded (workload, start, end, fraction) and the time "now"."""
    rnd = random.Random(seed)
    samples: list[tuple[str, float, float, float]] = []
    t = base
    gpu = 0
    end_of_history = base + days * 86400
    n = 0
    while t < end_of_history:
        n += 1
        user, project = rnd.choice(USERS)
        milli = rnd.choice((143, 500, 1000, 2000))
        frac = None if rnd.random() < 0.25 else rnd.random()
        w = led.submit(project=project, user=user, kind=rnd.choice(("batch", "interactive")),
                       request=GPU, now=t - rnd.uniform(5, 3000))
        a = t
        k = rnd.choice((1, 1, 2, 3))
        running = k == 1 and t > end_of_history - 86400 and n % 3 == 0
        for seq in range(k):
            gpu = (gpu + 1) % 64
            led.start(w.id, placement=[{"node": "n1", "gpu": gpu, "milli": milli}],
                      milli=milli, backed=True, protected_until=None, now=a)
            b = a + rnd.uniform(300, 20000)
            if running:  # sampled until now
                b = min(b, end_of_history + 3600)
            if frac is not None:  # samples in random steps, not aligned to hours
                s = a
                while s < b:
                    e = min(b, s + rnd.uniform(30, 4000))
                    led.record_busy([(w.id, s, e, frac, "device")])
                    samples.append((w.id, s, e, frac))
                    s = e
            if running and seq == k - 1:
                break
            last = seq == k - 1
            led.stop(w.id, now=b, state="done" if last else "pending",
                     closed_by="exit" if last else "preempt")
            a = b + rnd.uniform(60, 5000)
        t += rnd.uniform(1800, 30000)
    return samples, end_of_history + 3600


def raw(led: Ledger, samples, start: float, end: float, now: float, tz: ZoneInfo, by: str):
    """The figures summed from the charge intervals and samples themselves, second by second
    of overlap: per (project, user) and per (project, local period start) —
    (charged, measured, busy) GPU-hours; and the preemptions per project."""
    with led.ro() as s:
        charges = s.execute(select(ChargeRow.workload, ChargeRow.project, ChargeRow.user,
                                   ChargeRow.milli, ChargeRow.start, ChargeRow.end,
                                   ChargeRow.closed_by)).all()
        assert s.scalar(select(BusyChargeRow.charge).limit(1)) is not None
    per_user: dict[tuple[str, str], list[float]] = {}
    per_period: dict[tuple[str, float], list[float]] = {}
    preempted: dict[str, int] = {}

    def add(project: str, user: str, a: float, b: float, vals: tuple[float, float, float]):
        """``vals`` per second over [a, b) clipped to the report's period."""
        a, b = max(a, start), min(b, end)
        while a < b:  # cut at local period boundaries
            ps = period_start(a, tz, by if by != "user" else "day")
            nxt = period_start(ps.timestamp() + (7 if by == "week" else 1) * 86400 + 7200, tz,
                               by if by != "user" else "day").timestamp()
            stop = min(b, nxt)
            for key, d in (((project, user), per_user), ((project, ps.timestamp()), per_period)):
                v = d.setdefault(key, [0.0, 0.0, 0.0])
                for i in range(3):
                    v[i] += vals[i] * (stop - a) / MS_PER_H
            a = stop

    by_workload: dict[str, list] = {}
    for wid, project, user, milli, a, b, closed_by in charges:
        by_workload.setdefault(wid, []).append((project, user, milli, a, b))
        add(project, user, a, b if b is not None else now, (milli, 0.0, 0.0))
        if closed_by == "preempt" and int(start) // 86400 <= int(b) // 86400 < -(-int(end) //
                                                                                  86400):
            preempted[project] = preempted.get(project, 0) + 1
    for wid, a, b, frac in samples:
        for project, user, milli, ca, cb in by_workload[wid]:
            x, y = max(a, ca), min(b, cb if cb is not None else b)
            if y > x:
                add(project, user, x, y, (0.0, milli, milli * frac))
    return per_user, per_period, preempted


def check(fig: dict, want: list[float]) -> None:
    charged, measured, busy = want
    assert fig["charged_gpu_h"] == pytest.approx(charged, abs=1e-6)
    if measured < 1e-9:
        assert fig["busy_gpu_h"] is None and fig["idle_gpu_h"] is None
        return
    assert fig["measured_gpu_h"] == pytest.approx(measured, abs=1e-6)
    assert fig["busy_gpu_h"] == pytest.approx(busy, abs=1e-6)
    assert fig["idle_gpu_h"] == pytest.approx(measured - busy, abs=1e-6)


@pytest.mark.parametrize("seed", [3, 11])
def test_rollup_answers_equal_the_raw_ledger(ledger, seed):
    base = datetime(2025, 3, 20, 9, 17, tzinfo=TZ).timestamp()  # Berlin's spring change inside
    samples, now = random_ledger(ledger, seed, base, days=14)
    # periods in Berlin: whole days and weeks, and a range starting and ending mid-day
    hour = 3600 * (int(base) // 3600)
    periods = [(datetime(2025, 3, 17, tzinfo=TZ).timestamp(),
                datetime(2025, 4, 7, tzinfo=TZ).timestamp()),
               (hour + 5 * 3600, hour + 11 * 86400 + 3 * 3600)]
    for start, end in periods:
        for by in ("user", "day", "week"):
            with ledger.ro() as s:
                r = report(s, account="physics", scope=Scope(["astro", "lattice"]),
                           start=start, end=end, tz=TZ, by=by, now=now,
                           grants={"physics": 100.0, "lattice": 60.0, "astro": 40.0},
                           window=7 * 86400.0)
            per_user, per_period, preempted = raw(ledger, samples, start, end, now, TZ, by)
            got_users = {(p["project"], u["user"]): u for p in r["projects"]
                         for u in p["users"]}
            assert set(got_users) == set(per_user), (by, start)
            for k, want in per_user.items():
                check(got_users[k], want)
            totals = [sum(v[i] for v in per_user.values()) for i in range(3)]
            check(r["totals"], totals)
            assert {p["project"]: p["preemptions"] for p in r["projects"] if p["preemptions"]} \
                == preempted
            if by == "user":
                continue
            got = {(e["project"], datetime.fromisoformat(per["start_local"]).timestamp()): e
                   for per in r["periods"] for e in per["projects"]}
            want_periods = {k: v for k, v in per_period.items() if abs(v[0]) > 1e-9
                            or abs(v[1]) > 1e-9}
            assert set(got) == set(want_periods), (by, start)
            for k, want in want_periods.items():
                check(got[k], want)
