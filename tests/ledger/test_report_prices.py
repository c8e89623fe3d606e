"""The usage report prices its GPU-hours as the standings do: ``priced_gpu_h`` beside the
full-price ``charged_gpu_h``, off-peak parts at the policy's factor, cut at a window's edge
to the second. Figures worked out by hand across the edges (on the hour, and at 20:30, where
the report reads the intervals an edge cuts), then equal to the intervals themselves cut
second by second on a random ledger (a half-hour edge, a spring clock change, the report
in another zone than the policy's)."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.pricing import make_off_peak
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger.models import ChargeRow
from jupyter_gpubudget.ledger.reports import Scope, period_start, report
from jupyter_gpubudget.usage_report import csv_rows

from .test_report_raw import BUDGETS, TZ, random_ledger

GRANTS = {"physics": 100.0, "lattice": 60.0, "astro": 40.0}


@pytest.fixture
def ledger(db_url):  # noqa: ANN001, ANN201 - SQLite and PostgreSQL (tests/ledger/conftest.py)
    upgrade(db_url)
    led = Ledger(connect(db_url))
    led.sync_budgets(load_budgets(BUDGETS), now=1.0)
    yield led
    led.dispose()


def at(day: int, hh: int, mm: int = 0) -> float:
    """Berlin wall-clock time in the week of Wed 2025-06-11 (``day``: 11 = Wednesday)."""
    return datetime(2025, 6, day, hh, mm, tzinfo=TZ).timestamp()


def run(led, wid_project_user, milli, a, b=None):  # noqa: ANN001, ANN201
    p, u = wid_project_user
    w = led.submit(project=p, user=u, kind="batch", request={"kind": "gpu", "gpus": 1},
                   now=a - 10)
    led.start(w.id, placement=[{"node": "n1", "gpu": 0, "milli": milli}], milli=milli,
              backed=True, protected_until=None, now=a)
    if b is not None:
        led.stop(w.id, now=b, state="done", closed_by="exit")
    return w.id


def rep(led, off_peak, start, end, now, by="day", tz=TZ):  # noqa: ANN001, ANN201
    with led.ro() as s:
        return report(s, account="physics", scope=Scope(["astro", "lattice"]), start=start,
                      end=end, tz=tz, by=by, now=now, grants=GRANTS, window=7 * 86400.0,
                      off_peak=off_peak)


@pytest.mark.parametrize(("window", "a_from"), [
    ("Mon-Fri 20:00-07:00", (19, 30)),   # edges on the hour: the hourly rollups alone
    ("Mon-Fri 20:30-07:00", (20, 0)),    # an edge inside an hour: its intervals, cut
])
def test_charges_across_a_windows_edge_by_hand(ledger, window, a_from):
    """Half price in the window. A: 2 GPUs for the hour that ends 30 minutes into the
    window (Wednesday): 2 × (0.5 h × 1 + 0.5 h × 0.5) = 1.5 priced of 2 held. B: 1 GPU
    21:00-23:00 inside it: 1.0 of 2. C: 1 GPU from 06:30 Thursday, running at 07:30, 30
    minutes before the window's end and 30 after: 0.5 × 0.5 + 0.5 = 0.75 of 1. lattice's
    day Wednesday: 2.5 of 4; astro's Thursday 0.75 of 1; in all 3.25 of 5."""
    op = make_off_peak("Europe/Berlin", 0.5, [window])
    h, m = a_from
    run(ledger, ("lattice", "bob"), 2000, at(11, h, m), at(11, h + 1, m))
    run(ledger, ("lattice", "carol"), 1000, at(11, 21), at(11, 23))
    run(ledger, ("astro", "dave"), 1000, at(12, 6, 30))
    now = at(12, 7, 30)
    r = rep(ledger, op, at(11, 0), at(13, 0), now)
    users = {u["user"]: u for p in r["projects"] for u in p["users"]}
    assert users["bob"]["charged_gpu_h"] == pytest.approx(2.0)
    assert users["bob"]["priced_gpu_h"] == pytest.approx(1.5)
    assert users["carol"]["priced_gpu_h"] == pytest.approx(1.0)
    assert (users["dave"]["charged_gpu_h"], users["dave"]["priced_gpu_h"]) == \
        pytest.approx((1.0, 0.75))
    p = {e["project"]: e for e in r["projects"]}
    assert (p["lattice"]["charged_gpu_h"], p["lattice"]["priced_gpu_h"]) == \
        pytest.approx((4.0, 2.5))
    assert (r["totals"]["charged_gpu_h"], r["totals"]["priced_gpu_h"]) == \
        pytest.approx((5.0, 3.25))
    days = {(e["project"], per["start_local"][:10]): e for per in r["periods"]
            for e in per["projects"]}
    assert days[("lattice", "2025-06-11")]["priced_gpu_h"] == pytest.approx(2.5)
    assert days[("astro", "2025-06-12")]["priced_gpu_h"] == pytest.approx(0.75)
    # the CSV carries both, side by side
    head, *rows = list(csv_rows(r))
    total = dict(zip(head, rows[-1], strict=True))
    assert (total["charged_gpu_h"], total["priced_gpu_h"]) == pytest.approx((5.0, 3.25))
    # without off-peak prices the report prices every GPU-hour in full
    plain = rep(ledger, None, at(11, 0), at(13, 0), now)
    assert plain["totals"]["priced_gpu_h"] == pytest.approx(5.0)


def test_priced_hours_equal_the_intervals_cut_to_the_second(ledger):
    """Six random days over Berlin's spring change; windows with an edge at 20:30 and
    whole weekends at 0.4, in Berlin; the report read in New York by day and per user. Each
    line's priced GPU-hours equal the intervals themselves, each cut at the windows' edges
    (``OffPeak.split``), clipped to the report's period (what runs now: until now)."""
    op = make_off_peak("Europe/Berlin", 0.4, ["Mon-Fri 20:30-07:00", "Sat-Sun 00:00-24:00"])
    base = datetime(2025, 3, 27, 9, 17, tzinfo=TZ).timestamp()  # Berlin springs on the 30th
    _, now = random_ledger(ledger, 5, base, days=6)
    ny = ZoneInfo("America/New_York")
    start = datetime(2025, 3, 26, tzinfo=ny).timestamp()
    end = datetime(2025, 4, 3, tzinfo=ny).timestamp()
    with ledger.ro() as s:
        charges = s.execute(select(ChargeRow.project, ChargeRow.user, ChargeRow.milli,
                                   ChargeRow.start, ChargeRow.end)).all()
    want_user: dict[tuple[str, str], float] = {}
    want_day: dict[tuple[str, float], float] = {}
    for p, u, milli, a, b in charges:
        for x, y, f in op.split(max(a, start), min(b if b is not None else now, end)):
            t = x
            while t < y:  # by local day of New York
                ps = period_start(t, ny, "day").timestamp()
                nxt = period_start(ps + 86400 + 7200, ny, "day").timestamp()
                stop = min(y, nxt)
                gh = milli * (stop - t) * f / 3.6e6
                want_user[(p, u)] = want_user.get((p, u), 0.0) + gh
                want_day[(p, ps)] = want_day.get((p, ps), 0.0) + gh
                t = stop
    r = rep(ledger, op, start, end, now, tz=ny)
    got = {(p["project"], u["user"]): u["priced_gpu_h"] for p in r["projects"]
           for u in p["users"]}
    assert got.keys() == want_user.keys()
    for k, v in want_user.items():
        assert got[k] == pytest.approx(v, abs=1e-6), k
    assert any(u["priced_gpu_h"] < u["charged_gpu_h"] - 1 for p in r["projects"]
               for u in p["users"])
    days = {(e["project"], datetime.fromisoformat(per["start_local"]).timestamp()):
            e["priced_gpu_h"] for per in r["periods"] for e in per["projects"]}
    for k, v in want_day.items():
        if v > 1e-9:
            assert days[k] == pytest.approx(v, abs=1e-6), k
