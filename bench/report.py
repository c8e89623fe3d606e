"""Usage report timings on a year of history, and the busy sampler's cost.

Builds a ledger holding a year of history for 150 users in 40 projects (8 programs of 5):
``--size`` charge intervals (default 1,000,000; a workload has 1 to 4 intervals, requeued
after preemptions), each with its busy figures where measured (80 % of workloads), the
hourly and daily rollups per project and user, the waits' rollups and the preemption
decisions — inserted in bulk, on
SQLite and on a throwaway real PostgreSQL server (tests/fixtures/postgres.py). Then times the
report (``ledger/reports.py``) of the whole tree for the last full week and for the year, by
day and by user (the slower of the two counts; the median of 3 runs), and the busy
sampler's CPU time per tick for 8 GPUs on the NVML fake, with the ledger write of its samples,
as a share of one core at the service's default 30 s interval.

Goals: week ≤ 0.5 s, year ≤ 2 s, sampling ≤ 1 % of one core per 8 GPUs. The last printed line
is JSON: {"sqlite": {"week_s", "year_s"}, "postgresql": {"week_s", "year_s"},
"sampling_core_pct_per_8_gpus", ...}.

    python bench/report.py [--size 1000000] [--skip-postgres] [--skip-sqlite]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import insert  # noqa: E402

from jupyter_gpubudget.core.accounts import load_budgets  # noqa: E402
from jupyter_gpubudget.ledger import Ledger, connect, upgrade  # noqa: E402
from jupyter_gpubudget.ledger.busy import wait_bucket  # noqa: E402
from jupyter_gpubudget.ledger.models import (  # noqa: E402
    WAIT_BUCKETS,
    BusyChargeRow,
    ChargeRow,
    DecisionRow,
    UsageDailyRow,
    UsageHourlyRow,
    WaitDailyRow,
    WorkloadRow,
)
from jupyter_gpubudget.ledger.reports import Scope, report  # noqa: E402
from jupyter_gpubudget.ledger.rollups import split_by_hour  # noqa: E402

YEAR = 365 * 86400
PROGRAMS, PER_PROGRAM, USERS = 8, 5, 150
TZ = ZoneInfo("Europe/Berlin")


def budgets_text() -> str:
    lines = ["admins: [root]", "accounts:"]
    u = 0
    for g in range(PROGRAMS):
        lines += [f"  prog{g}:", "    grant: 1000", "    children:"]
        for p in range(PER_PROGRAM):
            members = []
            while len(members) < 4 and u < USERS:  # 150 users over 40 projects
                members.append(f"user{u:03d}")
                u += 1
            if not members:
                members = [f"user{(g * PER_PROGRAM + p) % USERS:03d}"]
            lines.append(f"      proj{g}{p}: {{grant: 200, members: [{', '.join(members)}]}}")
    return "\n".join(lines) + "\n"


def history(size: int, now: float, seed: int = 1) -> dict[str, list]:
    """Rows for the tables, generated deterministically."""
    rnd = random.Random(seed)
    tree = load_budgets(budgets_text()).accounts
    home = {m: p for p in tree.projects() for m in tree.get(p).members}
    users = sorted(home)
    start0 = now - YEAR
    workloads, charges, busy, decisions = [], [], [], []
    hourly: dict[tuple[str, str, int], list[float]] = {}
    waits: dict[tuple[str, int, str], dict[str, int]] = {}
    preempted: dict[tuple[str, str, int], int] = {}
    cid = n = 0
    while cid < size:
        n += 1
        user = users[n % len(users)]
        project = home[user]
        kind = "interactive" if rnd.random() < 0.3 else "batch"
        submitted = start0 + rnd.random() * (YEAR - 6 * 3600)
        wait = rnd.expovariate(1 / 600)
        milli = rnd.choice((1000, 1000, 2000, 4000, 500, 143))
        frac = None if rnd.random() < 0.2 else rnd.betavariate(2, 2)
        wid = f"w{n:08d}"
        t = submitted + wait
        k = min(rnd.choice((1, 1, 1, 2, 3, 4)), size - cid)
        waited = wait
        for seq in range(1, k + 1):
            cid += 1
            dur = rnd.uniform(600, 3600)
            a, b = t, t + dur
            wrow = waits.setdefault((project, int(a) // 86400, kind), {})
            col = f"w{wait_bucket(waited)}"
            wrow[col] = wrow.get(col, 0) + 1
            charges.append({"id": cid, "workload": wid, "seq": seq, "project": project,
                            "user": user, "milli": milli, "start": a, "end": b,
                            "checkpoint": b, "closed_by": "preempt" if seq < k else "exit"})
            if frac is not None:
                ms = milli * dur
                busy.append({"charge": cid, "workload": wid, "project": project, "user": user,
                             "kind": kind, "measured_ms": ms, "busy_ms": ms * frac,
                             "idle_ms": ms - ms * frac, "last_busy": frac, "first": a,
                             "last": b, "source": "device"})
            for hour, ms, _stop in split_by_hour(milli, a, b):
                h = hourly.setdefault((project, user, int(hour)), [0.0, 0.0, 0.0])
                h[0] += ms
                if frac is not None:
                    h[1] += ms
                    h[2] += ms * frac
            if seq < k:
                decisions.append({"at": b, "cycle": 0, "kind": "preempt", "workload": wid,
                                  "actor": "scheduler", "reason": "bench", "detail": {}})
                pk = (project, user, int(b) // 86400)
                preempted[pk] = preempted.get(pk, 0) + 1
            waited = rnd.expovariate(1 / 300)
            t = b + waited
        workloads.append({
            "id": wid, "name": "", "project": project, "user": user, "kind": kind,
            "state": "done", "request": {"kind": "gpu", "gpus": 1}, "command": None,
            "env": None, "min_runtime": 0.0, "resumable": k > 1, "time_limit": None,
            "backend": "local", "backend_ref": None, "submitted_at": submitted,
            "started_at": submitted + wait, "placement": None, "backed": True,
            "protected_until": None, "ended_at": t, "exit_code": 0, "preemptions": k - 1,
            "reason": "", "checkpoint_interval": None, "backfill_until": None,
            "cluster": None})
    rollups = [{"project": p, "user": u, "hour": h, "hod": h % 86400 // 3600,
                "charged_ms": v[0], "measured_ms": v[1], "busy_ms": v[2]}
               for (p, u, h), v in hourly.items()]
    days: dict[tuple[str, str, int], list[float]] = {}
    for (p, u, h), v in hourly.items():
        d = days.setdefault((p, u, h // 86400), [0.0, 0.0, 0.0])
        for i in range(3):
            d[i] += v[i]
    for k in preempted:
        days.setdefault(k, [0.0, 0.0, 0.0])
    daily = [{"project": p, "user": u, "day": d, "charged_ms": v[0], "measured_ms": v[1],
              "busy_ms": v[2], "preemptions": preempted.get((p, u, d), 0)}
             for (p, u, d), v in days.items()]
    wait_rows = [{"project": p, "day": d, "kind": k,
                  **{f"w{b}": n.get(f"w{b}", 0) for b in range(WAIT_BUCKETS)}}
                 for (p, d, k), n in waits.items()]
    return {"workloads": workloads, "charges": charges, "busy": busy, "hourly": rollups,
            "daily": daily, "waits": wait_rows, "decisions": decisions}


def load(url: str, rows: dict[str, list], now: float) -> Ledger:
    upgrade(url)
    led = Ledger(connect(url))
    led.sync_budgets(load_budgets(budgets_text()), now=now)
    chunk = 20_000
    with led.engine.begin() as c:
        for model, key in ((WorkloadRow, "workloads"), (ChargeRow, "charges"),
                           (BusyChargeRow, "busy"), (UsageHourlyRow, "hourly"),
                           (UsageDailyRow, "daily"), (WaitDailyRow, "waits"),
                           (DecisionRow, "decisions")):
            data = rows[key]
            for i in range(0, len(data), chunk):
                c.execute(insert(model), data[i:i + chunk])
    if url.startswith("postgresql"):
        with led.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.exec_driver_sql("VACUUM ANALYZE")
    else:
        with led.engine.connect() as c:
            c.exec_driver_sql("ANALYZE")
    return led


def time_reports(led: Ledger, now: float) -> dict[str, float]:
    tree = load_budgets(budgets_text()).accounts
    scope = Scope(sorted(tree.projects()))
    grants = dict.fromkeys(["root", *tree.accounts], 200.0)
    out = {}
    # the last full week (Monday to Monday in Berlin) and the last 365 days
    from datetime import datetime, timedelta

    today = datetime.fromtimestamp(now, TZ).date()
    monday = today - timedelta(days=today.weekday())
    week_end = datetime(monday.year, monday.month, monday.day, tzinfo=TZ).timestamp()
    week = (week_end - 7 * 86400, week_end)
    year = (now - YEAR, now)
    for name, (a, b) in (("week_s", week), ("year_s", year)):
        worst = 0.0
        for by in ("day", "user"):
            runs = []
            for _ in range(3):
                t = time.perf_counter()
                with led.ro() as s:
                    r = report(s, account="root", scope=scope, start=a, end=b, tz=TZ, by=by,
                               now=now, grants=grants, window=7 * 86400)
                runs.append(time.perf_counter() - t)
            med = statistics.median(runs)
            print(f"  {name[:-2]} by {by}: {med:.3f} s (median of 3; charged "
                  f"{r['totals']['charged_gpu_h']:,.0f} GPU-h, {len(r['projects'])} projects)")
            worst = max(worst, med)
        out[name] = round(worst, 4)
    return out


def sampling_cost(tmp: Path, ticks: int = 200, interval: float = 30.0) -> float:
    """CPU seconds per tick for 8 busy GPUs (one job each) on the NVML fake, with the ledger
    write of the samples (SQLite), as percent of one core at ``interval``."""
    from jupyter_gpubudget.inventory.busy import BusySampler, Running
    from tests.inventory.fake_nvml import FakeNvml, hgx_h200

    url = f"sqlite:///{tmp / 'sampling.sqlite'}"
    upgrade(url)
    led = Ledger(connect(url))
    led.sync_budgets(load_budgets(budgets_text()), now=1.0)
    gpus = hgx_h200(mig_gpus=())
    for i, g in enumerate(gpus):
        g["util"] = 10 * i
    sampler = BusySampler(FakeNvml(gpus), node="n")
    now = time.time()
    running = []
    for i in range(8):
        w = led.submit(project="proj00", user="user000", kind="batch", now=now,
                       request={"kind": "gpu", "gpus": 1})
        led.start(w.id, placement=[{"node": "n", "gpu": i, "milli": 1000}], milli=1000,
                  backed=True, protected_until=None, now=now)
        running.append(Running(w.id, [{"node": "n", "gpu": i, "milli": 1000}], now))
    cpu0 = time.process_time()
    for k in range(1, ticks + 1):
        samples = sampler.tick(running, now + k * interval)
        led.record_busy(samples)
    per_tick = (time.process_time() - cpu0) / ticks
    led.dispose()
    return 100.0 * per_tick / interval


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1_000_000, help="charge intervals")
    ap.add_argument("--skip-postgres", action="store_true")
    ap.add_argument("--skip-sqlite", action="store_true")
    args = ap.parse_args()
    now = time.time()
    t = time.perf_counter()
    rows = history(args.size, now)
    print(f"generated {len(rows['charges']):,} charge intervals of {len(rows['workloads']):,} "
          f"workloads, {len(rows['hourly']):,} hourly rollups, {len(rows['busy']):,} busy "
          f"figures in {time.perf_counter() - t:.1f} s")
    tmp = Path(tempfile.mkdtemp(prefix="gpubudget-bench-report-"))
    out: dict = {"charge_intervals": len(rows["charges"]), "users": USERS,
                 "projects": PROGRAMS * PER_PROGRAM}
    try:
        if not args.skip_sqlite:
            t = time.perf_counter()
            led = load(f"sqlite:///{tmp / 'ledger.sqlite'}", rows, now)
            print(f"sqlite: loaded in {time.perf_counter() - t:.1f} s")
            out["sqlite"] = time_reports(led, now)
            led.dispose()
        if not args.skip_postgres:
            from tests.fixtures.postgres import start_postgres

            pg = start_postgres()
            try:
                t = time.perf_counter()
                led = load(pg.new_database(), rows, now)
                print(f"postgresql: loaded in {time.perf_counter() - t:.1f} s")
                out["postgresql"] = time_reports(led, now)
                led.dispose()
            finally:
                pg.stop()
                shutil.rmtree(pg.datadir.parent, ignore_errors=True)
        out["sampling_core_pct_per_8_gpus"] = round(sampling_cost(tmp), 4)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
