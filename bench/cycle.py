"""Scheduling-cycle benchmark: a large cluster, a deep queue, one full cycle and one arrival.

Cluster: 1,024 nodes × 8 H100 GPUs in racks of 32; GPUs 6 and 7 of every node (a quarter of
all GPUs) are MIG-partitioned. 40 projects in a 3-level tree (4 programs × 2 groups × 5
projects), 150 users. About 6,000 running workloads (whole GPUs, gangs of 2–16, MIG instances,
MPS shares) and 10,000 pending, built the way the live service builds its queue: arrivals go
through the incremental path (starting at once when they fit) with a full cycle every 2,000
arrivals, until 10,000 wait. Two weeks of charge history.

Prints the median full-cycle time as the service runs it: on the capacity models it keeps
between cycles (core/kept.py: ``KeptCycle.cycle(state, now)``, the same decisions as
``schedule(state, now)``; a checkout without them, such as ``--baseline``'s, builds every
cycle from scratch), and beside it ``schedule(state, now)`` itself (``scratch_cycle``); the
service's whole cycle (that cycle plus the
forecast of start times for quotes and the queue page, with every slice choice as a probe:
read lazily, ``LazyForecast``, so what one view of the queue page — every queued workload's
start — and one quote ask of it; a checkout without it computed the whole forecast every
cycle), and the same without the queue page view (``quote_cycle``: the cycle and one quote); the same two on the state in which a tenth of the
cluster's GPUs freed just before the cycle (running work chosen at random left) and the first
program's grant is raised 2.6 times, so that the timed cycle places (backed and unbacked work)
and preempts (unbacked running work of the programs over their grants, for the first
program's backed work) — on the full cluster it decides nothing, and on the bench's grants no
queued work is backed; the median time
for one arrival on the incremental path (``Scheduler.submit``), and placements per second (a
full cycle that places 10,000 workloads on the empty cluster). Each figure is a median of
wall time and of CPU time (``time.process_time``: the machine may be shared). Last line: one
JSON object.

    python bench/cycle.py [--repeat 7] [--service-repeat 3] [--arrivals 200] [--seed 1]
                          [--baseline /path/to/checkout]

With ``--arrays 50x200`` and/or ``--reservations 20``: the full cycle with job arrays and
advance reservations in the queue, beside the same run without them (bench/cycle_reservations.py).

Another version of the package (an older checkout, to compare in one run on one machine):
``PYTHONPATH=/path/to/checkout python bench/cycle.py`` — the script only falls back to its own
checkout when the package is not found first. ``--baseline /path/to/checkout`` does that
first, with the same arguments, then measures this checkout, and prints both and the
ratios of the CPU-time medians (the goals: full cycle at most 0.6 of the baseline's, the
service's whole cycle at most the baseline's full cycle); the last line then holds both
(``"baseline"``) and the ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

# after PYTHONPATH (an older checkout to compare with), before nothing else of ours
sys.path.append(str(Path(__file__).resolve().parents[1]))

from jupyter_gpubudget.core.accounts import AccountTree, load_budgets  # noqa: E402
from jupyter_gpubudget.core.inventory import Inventory, make_node  # noqa: E402
from jupyter_gpubudget.core.model import (  # noqa: E402
    HOUR,
    ChargeInterval,
    Preempt,
    SliceRequest,
    Start,
    Workload,
)
from jupyter_gpubudget.core.offer import forecast, request_for, slice_choices  # noqa: E402
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler, schedule  # noqa: E402

try:  # the service's cycle on capacity models kept between cycles
    from jupyter_gpubudget.core.kept import KeptCycle
except ImportError:  # an older checkout (--baseline): it built every cycle from scratch
    KeptCycle = None
try:  # the forecast replayed only as far as what is asked
    from jupyter_gpubudget.core.forecast import LazyForecast
except ImportError:  # an older checkout (--baseline): the whole forecast every cycle
    LazyForecast = None

#: the slice choice of the one quote a timed service cycle answers
QUOTED = "gpu:1"

NOW = 30 * 24 * HOUR


def budgets_yaml(rng: random.Random) -> str:
    lines = ["accounts:"]
    users = [f"user{i:03d}" for i in range(150)]
    n = 0
    for p in range(4):
        lines += [f"  prog{p}:", f"    grant: {rng.choice([20000, 30000, 40000])}", "    children:"]
        for g in range(2):
            lines += [f"      grp{p}{g}:", "        share: 50%", "        children:"]
            for _ in range(5):
                members = ", ".join(rng.sample(users, 8))
                lines.append(f"          proj{n:02d}: {{share: 20%, members: [{members}]}}")
                n += 1
    return "\n".join(lines) + "\n"


def inventory(nodes: int = 1024) -> Inventory:
    return Inventory(tuple(make_node(f"node{i:04d}", "H100-80GB", 8, mig=(6, 7), rack=f"rack{i // 32}")
                           for i in range(nodes)))


def random_request(rng: random.Random) -> SliceRequest:
    r = rng.random()
    if r < 0.15:
        return SliceRequest.whole(1)
    if r < 0.33:
        return SliceRequest.whole(rng.choice([2, 4]))
    if r < 0.45:
        return SliceRequest.whole(rng.choice([8, 16]))
    if r < 0.85:
        return SliceRequest.mig(rng.choices(["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
                                            [10, 20, 35, 20, 15])[0])
    return SliceRequest.mps(rng.choice([250, 500]))


def random_workload(rng: random.Random, i: int, at: float, projects: list[str]) -> Workload:
    kind = rng.choices(["interactive", "batch", "debug"], [3, 5, 2])[0]
    return Workload(f"w{i}", rng.choice(projects), f"user{rng.randrange(150):03d}",
                    random_request(rng), at, kind=kind,
                    min_runtime=rng.choice([0, 1800, 2 * HOUR, 8 * HOUR]),
                    resumable=rng.random() < 0.5,
                    time_limit=rng.choice([None, 2 * HOUR, 12 * HOUR, 48 * HOUR]))


def build_state(seed: int, nodes: int = 1024, queued: int = 10000) -> ClusterState:
    """The benchmark's state; ``nodes`` and ``queued`` scale it down (the tests' instance)."""
    rng = random.Random(seed)
    budgets = load_budgets(budgets_yaml(rng))
    projects = budgets.accounts.projects()
    inv = inventory(nodes)
    sched = Scheduler(budgets.accounts, inv, budgets.policy)
    i = 0
    # the queue as the live service holds it: every workload arrived through the incremental
    # path (starting at once if it fitted), with a full cycle every 2,000 arrivals; stop when
    # 10,000 are waiting
    i = 0
    t = NOW - 20 * HOUR
    every = max(1, queued // 5)
    while len(sched.pending) < queued:
        t += 7.0 * 10000 / queued
        w = random_workload(rng, i, t, projects)
        i += 1
        sched.submit(w, t)
        if i % every == 0:
            sched.cycle(t)
    pending = list(sched.pending.values())
    charges = list(sched.meter.charges())
    for k in range(4000 * queued // 10000):  # two weeks of finished work
        end = NOW - rng.uniform(0, 14 * 24 * HOUR)
        charges.append(ChargeInterval(f"old{k}", rng.choice(projects), "user000",
                                      rng.choice([143, 1000, 2000, 8000]),
                                      end - rng.uniform(0.1, 30) * HOUR, end))
    return ClusterState(budgets.accounts, inv, budgets.policy, list(sched.running.values()),
                        pending, charges)


FREED_GRANT = 2.6  # the first program's grant, times this, in the freed run


def raised_grant(seed: int, times: float = FREED_GRANT) -> AccountTree:
    """The benchmark's accounts with the first program's grant raised ``times``: its
    standing falls below the others' and part of its queue is backed (on the benchmark's
    state every account has used more than its grant, so no queued work is, and running work
    started unbacked: unprotected)."""
    text = budgets_yaml(random.Random(seed))
    head, _, rest = text.partition("grant: ")
    grant, _, tail = rest.partition("\n")
    return load_budgets(f"{head}grant: {round(float(grant) * times)}\n{tail}").accounts


def freed_tenth(state: ClusterState, seed: int, times: float = FREED_GRANT) -> ClusterState:
    """``state`` after running work chosen at random left, freeing a tenth of the GPUs, with
    the first program's grant raised ``times`` (:func:`raised_grant`; 1: as it was), so that
    the cycle both places (backed and unbacked work) and preempts (unbacked running work of
    the programs above their grants, for the backed work of the first)."""
    rng = random.Random(seed + 7)
    running = list(state.running)
    rng.shuffle(running)
    target = state.inventory.gpu_count * 1000 // 10
    freed, gone = 0, set()
    for w in running:
        if freed >= target:
            break
        if w.placement is not None:
            freed += w.placement.milli
            gone.add(w.id)
    accounts = raised_grant(seed, times) if times != 1 else state.accounts
    return ClusterState(accounts, state.inventory, state.policy,
                        [w for w in state.running if w.id not in gone], state.pending,
                        state.charges)


def timed(fn, repeat: int) -> tuple[float, float, object]:  # noqa: ANN001
    """Median wall and CPU milliseconds of ``fn()`` over ``repeat`` runs, and its last result."""
    wall, cpu, out = [], [], None
    for _ in range(repeat):
        gc.collect()  # the previous cycle's garbage, as a service collects between cycles
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    return statistics.median(wall), statistics.median(cpu), out


def service_scheduler(warm: ClusterState | None = None):  # noqa: ANN201
    """The service's cycle (a function of the state read): on capacity models kept between
    cycles (core/kept.py, both of them first used on ``warm``) where the package has them,
    else ``schedule(state, now)`` from scratch, as the service ran it before."""
    if KeptCycle is None:
        return lambda st: schedule(st, NOW)
    kept = KeptCycle()
    for _ in range(2 if warm is not None else 0):
        kept.cycle(warm, NOW)
    return lambda st: kept.cycle(st, NOW)[1]


def service_cycle(run, state: ClusterState, probes: dict,  # noqa: ANN001
                  page: bool = True) -> tuple[list, object]:
    """What the service computes for one cycle: the decisions (``run``: the service's
    cycle, :func:`service_scheduler`) and what is asked of the forecast until the next —
    the service reads its forecast lazily (``LazyForecast``: replayed only as far as the
    answers asked need), so this charges one view of the queue page (``page``: every queued
    workload's predicted start, which the page shows) and one quote (the ``QUOTED`` slice
    choice's start behind the queue). A checkout without the lazy forecast (``--baseline``'s)
    computed the whole forecast every cycle."""
    decisions = run(state)
    if LazyForecast is None:
        return decisions, forecast(state, NOW, probes=probes)
    fc = LazyForecast(state, NOW, probes=probes)
    if page:
        for w in state.pending:
            fc.start_of(w.id)
    fc.probe_start(QUOTED)
    return decisions, fc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--service-repeat", type=int, default=3,
                    help="runs of the service's whole cycle (schedule + forecast)")
    ap.add_argument("--arrivals", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--arrays", default="", help="NxM: N job arrays of M tasks in the queue, "
                    "timed beside the same queue without them (bench/cycle_reservations.py)")
    ap.add_argument("--reservations", type=int, default=0, help="advance reservations, timed "
                    "beside the same run without them")
    ap.add_argument("--baseline", metavar="CHECKOUT",
                    help="another checkout (e.g. a git worktree of an older commit): the same "
                    "benchmark with its package first, then this one, and the ratios")
    args = ap.parse_args()
    base = run_baseline(args) if args.baseline else None

    t0 = time.perf_counter()
    state = build_state(args.seed)
    gpus = state.inventory.gpu_count
    used = sum(w.placement.milli for w in state.running if w.placement) / 1000
    print(f"state: {len(state.inventory.nodes)} nodes, {gpus} GPUs ({used:.0f} GPU-equivalents "
          f"in use), {len(state.running)} running, {len(state.pending)} pending, "
          f"{len(state.accounts.projects())} projects  (built in {time.perf_counter() - t0:.1f} s)")
    if args.arrays or args.reservations:
        from cycle_reservations import side_by_side  # beside this script

        side_by_side(state, args, NOW, timed)
        return

    run = service_scheduler(state)
    full, full_cpu, ds = timed(lambda: run(state), args.repeat)
    starts = sum(isinstance(d, Start) for d in ds)
    print(f"full cycle:    median {full:7.1f} ms  (CPU time median {full_cpu:.1f} ms;"
          f" {starts} starts, {len(ds) - starts} other decisions;"
          f" {'kept capacity models' if KeptCycle else 'built from scratch'})")
    scratch, scratch_cpu, _ = timed(lambda: schedule(state, NOW), args.repeat)
    print(f"from scratch:  median {scratch:7.1f} ms  (CPU time median {scratch_cpu:.1f} ms;"
          " schedule(state, now))")
    probes = {c["key"]: request_for(c["key"]) for c in slice_choices(state.inventory)}
    svc, svc_cpu, _ = timed(lambda: service_cycle(run, state, probes), args.service_repeat)
    print(f"service cycle: median {svc:7.1f} ms  (CPU time median {svc_cpu:.1f} ms;"
          f" schedule + forecast of {len(probes)} slice shapes"
          f"{': a queue page view and one ' + QUOTED + ' quote' if LazyForecast else ''})")
    qsvc, qsvc_cpu, _ = timed(lambda: service_cycle(run, state, probes, page=False),
                              args.service_repeat)
    print(f"  without a queue page view: median {qsvc:7.1f} ms  (CPU time median"
          f" {qsvc_cpu:.1f} ms; schedule + the forecast one {QUOTED} quote needs)")

    freed = freed_tenth(state, args.seed)
    run = service_scheduler(state)  # the models kept from the full cluster's cycles
    fr, fr_cpu, ds = timed(lambda: run(freed), args.repeat)
    fr_starts = sum(isinstance(d, Start) for d in ds)
    fr_preempts = sum(isinstance(d, Preempt) for d in ds)
    print(f"a tenth freed: {len(state.running) - len(freed.running)} running left first;"
          f" full cycle median {fr:7.1f} ms (CPU {fr_cpu:.1f} ms; {fr_starts} starts,"
          f" {fr_preempts} preemptions, {len(ds) - fr_starts - fr_preempts} other decisions)")
    fsvc, fsvc_cpu, _ = timed(lambda: service_cycle(run, freed, probes), args.service_repeat)
    print(f"               service cycle median {fsvc:7.1f} ms (CPU {fsvc_cpu:.1f} ms)")

    sched = Scheduler.from_state(state)
    sched.cycle(NOW)
    rng = random.Random(args.seed + 1)
    projects = state.accounts.projects()
    inc_ms = []
    for k in range(args.arrivals):
        w = random_workload(rng, 10_000_000 + k, NOW + k, projects)
        t = time.perf_counter()
        sched.submit(w, NOW + k)
        inc_ms.append((time.perf_counter() - t) * 1000)
    inc = statistics.median(inc_ms)
    print(f"one arrival:  median {inc:7.3f} ms  (p90 {sorted(inc_ms)[int(0.9 * len(inc_ms))]:.3f};"
          f" {args.arrivals} arrivals)")

    empty = ClusterState(state.accounts, state.inventory, state.policy, (), state.pending, ())
    t = time.perf_counter()
    ds = schedule(empty, NOW)
    dt = time.perf_counter() - t
    placed = sum(isinstance(d, Start) for d in ds)
    pps = placed / dt
    print(f"placement:    {placed} workloads placed on the empty cluster in {dt * 1000:.0f} ms "
          f"= {pps:,.0f} placements/s")
    print(f"ratios:       full cycle {full / 200:.2f}× of the 200 ms target; "
          f"arrival {inc / 10:.3f}× of the 10 ms target; service cycle {svc / full:.1f}× "
          f"the full cycle")
    out = {"full_cycle_ms_p50": round(full, 2),
                      "full_cycle_cpu_ms_p50": round(full_cpu, 2),
                      "scratch_cycle_cpu_ms_p50": round(scratch_cpu, 2),
                      "service_cycle_ms_p50": round(svc, 2),
                      "service_cycle_cpu_ms_p50": round(svc_cpu, 2),
                      "quote_cycle_cpu_ms_p50": round(qsvc_cpu, 2),
                      "freed_cycle_ms_p50": round(fr, 2), "freed_cycle_cpu_ms_p50": round(fr_cpu, 2),
                      "freed_service_cycle_ms_p50": round(fsvc, 2),
                      "freed_service_cycle_cpu_ms_p50": round(fsvc_cpu, 2),
                      "freed_starts": fr_starts, "freed_preemptions": fr_preempts,
                      "incremental_ms_p50": round(inc, 3), "placements_per_s": round(pps)}
    if base is not None:
        out = compare(out, base)
    print(json.dumps(out))


def run_baseline(args: argparse.Namespace) -> dict:
    """The same benchmark with the package of ``args.baseline`` first on the path."""
    argv = [sys.executable, __file__, "--repeat", str(args.repeat), "--service-repeat",
            str(args.service_repeat), "--arrivals", str(args.arrivals), "--seed", str(args.seed)]
    env = dict(os.environ, PYTHONPATH=str(Path(args.baseline).resolve()))
    print(f"baseline ({args.baseline}):", flush=True)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    for line in done.stdout.splitlines()[:-1]:
        print(f"  {line}")
    print("this checkout:", flush=True)
    return json.loads(done.stdout.splitlines()[-1])


def compare(out: dict, base: dict) -> dict:
    """Both runs' figures and the ratios of their CPU-time medians."""
    ratios = {
        "full_cycle_cpu": out["full_cycle_cpu_ms_p50"] / base["full_cycle_cpu_ms_p50"],
        "service_cycle_cpu_to_base_full": (out["service_cycle_cpu_ms_p50"]
                                           / base["full_cycle_cpu_ms_p50"]),
        "service_cycle_cpu": out["service_cycle_cpu_ms_p50"] / base["service_cycle_cpu_ms_p50"],
        "freed_cycle_cpu": out["freed_cycle_cpu_ms_p50"] / base["freed_cycle_cpu_ms_p50"],
        "freed_service_cycle_cpu": (out["freed_service_cycle_cpu_ms_p50"]
                                    / base["freed_service_cycle_cpu_ms_p50"]),
        "quote_cycle_cpu_to_base_full": (out["quote_cycle_cpu_ms_p50"]
                                         / base["full_cycle_cpu_ms_p50"]),
    }
    print("ratios (CPU-time medians, this checkout / baseline): " + ", ".join(
        f"{k} {v:.2f}" for k, v in ratios.items())
        + f"; goals: full cycle <= 0.6 ({'met' if ratios['full_cycle_cpu'] <= 0.6 else 'MISSED'})"
        + ", service cycle <= 1.0 of the baseline's full cycle ("
        + f"{'met' if ratios['service_cycle_cpu_to_base_full'] <= 1.0 else 'MISSED'})")
    return {**out, "baseline": base, "ratios": {k: round(v, 3) for k, v in ratios.items()}}


if __name__ == "__main__":
    main()
