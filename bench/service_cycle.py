"""The service's scheduling cycle at scale, over a year of history, on SQLite and PostgreSQL.

The cluster, queue and running work of ``bench/cycle.py`` (1,024 nodes × 8 H100, about 6,000
running and 10,000 pending, 40 projects) are written into a real ledger together with a year
of finished work: ``--history`` closed charge intervals (default 1,000,000) over 40 projects,
with the hourly rollups the service keeps as intervals close. Then the service's own
``SchedulingLoop.cycle()`` runs — ledger read + ``schedule`` + applying the decisions +
refreshing what the API serves — against a backend that starts nothing (what it launches is
not the point here), and is compared with the core's full cycle on the same state
(``schedule(state, now)``). Each repeat times three cycles: after a change (a queued job
cancelled: the ledger is read again), one in which nothing changed (the last read holds),
and one after running work ended (its interval closes, so the usage rollups are read again;
freed GPUs are given out and the starts applied). The same again with 10× the history
(``--tenx``).

    python bench/service_cycle.py [--db sqlite,postgresql] [--history 1000000] [--tenx]

PostgreSQL is started by the bench itself (tests/fixtures/postgres.py). Last line: JSON
{"service_cycle_ms_p50", "core_cycle_ms_p50", "ratio", "ratio_10x"} (after a cancel) and
"ratio_after_end" / "ratio_after_end_10x" — each ratio the worse of the databases run.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cycle import NOW, budgets_yaml, build_state  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from jupyter_gpubudget.backends.base import Backend, BackendStatus, Launch  # noqa: E402
from jupyter_gpubudget.core.accounts import load_budgets  # noqa: E402
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler, schedule  # noqa: E402
from jupyter_gpubudget.ledger import Ledger, connect, upgrade  # noqa: E402
from jupyter_gpubudget.ledger.models import (  # noqa: E402
    ChargeRow,
    UsageRollupRow,
    WorkloadRow,
)
from jupyter_gpubudget.ledger.rollups import split_by_hour  # noqa: E402
from jupyter_gpubudget.service.loop import SchedulingLoop  # noqa: E402
from jupyter_gpubudget.service.state import placement_to_list, request_to_dict  # noqa: E402

YEAR = 365 * 86400.0


class StartsNothing(Backend):
    """A backend that starts nothing and reports every attempt alive (the bench measures the
    service's own work, not processes)."""

    name = "bench"

    def launch(self, launch: Launch) -> str:
        return f"bench-{launch.workload}"

    def stop(self, workload: str, attempt: int) -> BackendStatus:
        return BackendStatus(False, 0, NOW)

    def status(self, workload: str, attempt: int) -> BackendStatus:
        return BackendStatus(True)


def settled(state: ClusterState) -> ClusterState:
    """The state after the core's own cycle at NOW: what a running service holds between
    cycles (the next cycle then decides little, as in steady operation)."""
    s = Scheduler.from_state(state)
    s.cycle(NOW)
    return ClusterState(state.accounts, state.inventory, state.policy, list(s.running.values()),
                        list(s.pending.values()), state.charges)


def workload_row(w, state: str) -> dict:  # noqa: ANN001
    return {"id": w.id, "name": "", "project": w.project, "user": w.user, "kind": w.kind,
            "state": state, "request": request_to_dict(w.request), "command": ["true"],
            "env": {}, "min_runtime": w.min_runtime, "resumable": w.resumable,
            "time_limit": w.time_limit, "backend": "bench", "backend_ref": None,
            "submitted_at": w.submitted_at, "started_at": w.started_at,
            "placement": placement_to_list(w.placement) if w.placement else None,
            "backed": w.backed, "protected_until": w.protected_until, "ended_at": None,
            "exit_code": None, "preemptions": 0, "reason": ""}


def fill(led: Ledger, state: ClusterState, history: int, seed: int) -> None:
    """The live state and ``history`` closed intervals of finished work over the past year."""
    rng = random.Random(seed)
    projects = state.accounts.projects()
    with led.tx() as s:
        rows = [workload_row(w, "running") for w in state.running]
        rows += [workload_row(w, "pending") for w in state.pending]
        for i in range(0, len(rows), 2000):
            s.execute(insert(WorkloadRow), rows[i:i + 2000])
        s.execute(insert(ChargeRow), [
            {"workload": w.id, "seq": 1, "project": w.project, "user": w.user,
             "milli": w.placement.milli, "start": w.started_at, "end": None,
             "checkpoint": w.started_at, "closed_by": ""}
            for w in state.running if w.placement and w.started_at is not None])
    per = 100  # intervals per finished workload (requeues, attempts)
    buckets: dict[tuple[str, float], list[float]] = {}
    done = 0
    while done < history:
        n = min(50_000, history - done)
        wrows, crows = [], []
        for k in range(done, done + n, per):
            wid = f"h{k // per}"
            p = projects[(k // per) % len(projects)]
            last = NOW - rng.uniform(0, YEAR)
            wrows.append({"id": wid, "name": "", "project": p, "user": "user000",
                          "kind": "batch", "state": "done", "request": {"kind": "gpu"},
                          "command": None, "env": None, "min_runtime": 0.0,
                          "resumable": True, "time_limit": None, "backend": "bench",
                          "backend_ref": None, "submitted_at": last - 3600,
                          "started_at": last - 3600, "placement": None, "backed": True,
                          "protected_until": None, "ended_at": last, "exit_code": 0,
                          "preemptions": 0, "reason": ""})
            for seq in range(1, min(per, done + n - k) + 1):
                end = NOW - rng.uniform(0, YEAR)
                start = end - rng.uniform(300, 5 * 3600)
                milli = rng.choice([143, 1000, 2000, 8000])
                crows.append({"workload": wid, "seq": seq, "project": p, "user": "user000",
                              "milli": milli, "start": start, "end": end, "checkpoint": end,
                              "closed_by": "exit"})
                for hour, gpu_ms, stop in split_by_hour(milli, start, end):
                    b = buckets.setdefault((p, hour), [0.0, stop])
                    b[0] += gpu_ms
                    b[1] = max(b[1], stop)
        with led.tx() as s:
            s.execute(insert(WorkloadRow), wrows)
            for i in range(0, len(crows), 10_000):
                s.execute(insert(ChargeRow), crows[i:i + 10_000])
        done += n
        print(f"  history: {done:,}/{history:,} intervals", end="\r", flush=True)
    with led.tx() as s:
        s.query(UsageRollupRow).delete()
        items = [{"project": p, "hour": h, "gpu_ms": v[0], "last_end": v[1]}
                 for (p, h), v in buckets.items()]
        for i in range(0, len(items), 10_000):
            s.execute(insert(UsageRollupRow), items[i:i + 10_000])
    print(f"  history: {history:,} intervals, {len(buckets):,} hourly rollups     ")


def measure(url: str, state: ClusterState, budgets, history: int, repeat: int,  # noqa: ANN001
            seed: int) -> tuple[float, float, float]:
    upgrade(url)
    engine = connect(url, sqlite_synchronous="NORMAL")
    read = connect(url, read_only=True) if url.startswith("sqlite") else engine
    led = Ledger(engine, read)
    led.sync_budgets(budgets, NOW - YEAR)
    t = time.perf_counter()
    fill(led, state, history, seed)
    print(f"  filled in {time.perf_counter() - t:.0f} s")
    clock = [NOW]
    loop = SchedulingLoop(led, lambda: budgets.accounts, state.inventory, lambda: budgets.policy,
                          StartsNothing(), clock=lambda: clock[0])
    # the forecast runs at most once a minute in the service, in the same thread: timed apart
    loop.forecast_interval = loop.forecast_min_interval = 1e12
    loop.checkpoint_interval = 30.0  # the service's default
    t = time.perf_counter()
    loop.cycle()  # the first cycle also computes the forecast
    print(f"  first cycle (with the forecast): {(time.perf_counter() - t) * 1000:.0f} ms")
    svc, quiet, core, reads, decided = [], [], [], [], []
    end_svc, end_core, end_decided = [], [], []
    pending = [w for w in state.pending if w.request.gpus >= 16][:repeat]
    for i in range(repeat):
        clock[0] = NOW + 10 * (i + 1)
        # one change since the last cycle (a cancelled job): the cycle must read the ledger
        led.stop(pending[i].id, now=clock[0], state="cancelled", closed_by="cancel")
        # the core's full cycle on exactly the state this cycle reads
        gc.collect()
        t = time.perf_counter()
        st, _ = loop.build_state(clock[0])
        reads.append((time.perf_counter() - t) * 1000)
        led.state_version += 1  # (that read must not be reused by the cycle below)
        gc.collect()
        t = time.perf_counter()
        schedule(st, clock[0])
        core.append((time.perf_counter() - t) * 1000)
        gc.collect()
        t = time.perf_counter()
        decided.append(len(loop.cycle()))
        svc.append((time.perf_counter() - t) * 1000)
        # and a cycle in which nothing changed: the last read holds
        clock[0] += 5
        gc.collect()
        t = time.perf_counter()
        loop.cycle()
        quiet.append((time.perf_counter() - t) * 1000)
        # and a cycle after running work ended: its interval closes (the usage rollups
        # change), GPUs free up and queued work starts (the decisions are applied)
        clock[0] += 2
        ended = next(r for r in loop.build_state(clock[0])[1]
                     if r.state == "running" and r.placement_json not in (None, "null"))
        led.stop(ended.id, now=clock[0], state="done", closed_by="exit", exit_code=0)
        gc.collect()
        st, _ = loop.build_state(clock[0])
        led.state_version += 1
        gc.collect()
        t = time.perf_counter()
        schedule(st, clock[0])
        end_core.append((time.perf_counter() - t) * 1000)
        gc.collect()
        t = time.perf_counter()
        end_decided.append(len(loop.cycle()))
        end_svc.append((time.perf_counter() - t) * 1000)
    print(f"  decisions per cycle: {decided}")
    print(f"  a cycle when nothing changed: median {statistics.median(quiet):.0f} ms")
    engine.dispose()
    if read is not engine:
        read.dispose()
    s, c, r = statistics.median(svc), statistics.median(core), statistics.median(reads)
    print(f"  service cycle after a change: median {s:.0f} ms (ledger read alone {r:.0f} ms); "
          f"core full cycle median {c:.0f} ms; ratio {s / c:.2f}")
    es, ec = statistics.median(end_svc), statistics.median(end_core)
    print(f"  after running work ended (decisions {end_decided}): service cycle median "
          f"{es:.0f} ms, core full cycle median {ec:.0f} ms; ratio {es / ec:.2f}")
    return s, c, r, es, ec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="sqlite,postgresql")
    ap.add_argument("--history", type=int, default=1_000_000)
    ap.add_argument("--tenx", action="store_true", help="also with 10× the history")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    state = settled(build_state(args.seed))
    budgets = load_budgets(budgets_yaml(random.Random(args.seed)))
    print(f"state: {len(state.running)} running, {len(state.pending)} pending, "
          f"{state.inventory.gpu_count} GPUs, {len(state.accounts.projects())} projects")
    pg = None
    made: list[str] = []
    results: dict[str, dict[int, tuple[float, ...]]] = {}
    try:
        for db in args.db.split(","):
            for history in [args.history] + ([10 * args.history] if args.tenx else []):
                if db == "sqlite":
                    tmp = tempfile.mkdtemp(prefix="gpubudget-svc-")
                    made.append(tmp)
                    url = f"sqlite:///{tmp}/ledger.sqlite"
                else:
                    if pg is None:
                        from tests.fixtures.postgres import start_postgres

                        pg = start_postgres()
                    url = pg.new_database()
                print(f"{db}, {history:,} intervals of history:")
                results.setdefault(db, {})[history] = measure(
                    url, state, budgets, history, args.repeat, args.seed)
    finally:
        if pg is not None:
            pg.stop()
        for tmp in made:  # (10× the history is over a GB)
            shutil.rmtree(tmp, ignore_errors=True)
    base = args.history
    worst = max(results, key=lambda d: results[d][base][0] / results[d][base][1])
    s, c = results[worst][base][:2]
    out = {"service_cycle_ms_p50": round(s, 1), "core_cycle_ms_p50": round(c, 1),
           "ratio": round(s / c, 2), "worst_db": worst,
           "ratio_after_end": round(max(v[base][3] / v[base][4] for v in results.values()), 2)}
    if args.tenx:
        out["ratio_10x"] = round(max(v[10 * base][0] / v[10 * base][1]
                                     for v in results.values()), 2)
        out["ratio_after_end_10x"] = round(max(v[10 * base][3] / v[10 * base][4]
                                               for v in results.values()), 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
