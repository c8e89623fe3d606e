"""``bench/cycle.py --arrays 50x200 --reservations 20``: the full cycle on the benchmark's state
with job arrays and advance reservations in it, beside the same run without them.

The same 10,000-deep queue with 50 job arrays of 200 tasks each among it (each array one
project, user and slice; ``max_running`` 5, 10, 20 or 50) and 20 advance reservations (8 to 64
whole GPUs each, chosen as the service chooses them; even ones in their window now, odd ones
starting within two days), timed alternately with the same run without them (the same
workloads without the array fields, no bookings). Last line: one JSON object —
``full_cycle_ms_p50`` with them, ``full_cycle_ms_p50_without`` without, and their ratio (the
goal: at most 1.1); CPU-time medians beside (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from dataclasses import replace

from jupyter_gpubudget.core.model import HOUR, Preempt, Start, Workload
from jupyter_gpubudget.core.reservations import Booking, choose_gpus
from jupyter_gpubudget.core.scheduler import ClusterState, schedule


def with_arrays(state: ClusterState, spec: str, seed: int) -> tuple[list[Workload],
                                                                     list[Workload]]:
    """The queue with ``spec`` (``50x200``) job arrays among it, and the same workloads
    without the array fields: (with, without)."""
    n, size = (int(x) for x in spec.lower().split("x"))
    pending = list(state.pending)
    if n * size > len(pending):
        raise SystemExit(f"--arrays {spec}: more tasks than the {len(pending)} queued")
    rng = random.Random(seed + 11)
    arrays, plain = [], []
    for a in range(n):
        head, cap = pending[a * size], rng.choice([5, 10, 20, 50])
        for i in range(size):
            t = replace(pending[a * size + i], id=f"arr{a}_{i}", project=head.project,
                        user=head.user, request=head.request, kind="batch",
                        submitted_at=head.submitted_at)
            plain.append(t)
            arrays.append(replace(t, array=f"arr{a}", array_max=cap))
    rest = pending[n * size:]
    return arrays + rest, plain + rest


def bookings(state: ClusterState, count: int, now: float, seed: int) -> list[Booking]:
    """``count`` bookings of 8-64 whole GPUs for random projects: even ones in their window
    at ``now``, odd ones starting within two days."""
    rng = random.Random(seed + 13)
    projects = state.accounts.projects()
    out: list[Booking] = []
    for k in range(count):
        start = (now - rng.uniform(0, 2 * HOUR) if k % 2 == 0
                 else now + rng.uniform(HOUR, 48 * HOUR))
        end = start + rng.choice([2, 4, 8]) * HOUR
        gpus = choose_gpus(state.inventory, out, rng.choice([8, 16, 32, 64]), start, end)
        out.append(Booking(f"bk{k}", rng.choice(projects), start, end, gpus))
    return out


def side_by_side(state: ClusterState, args: argparse.Namespace, now: float, timed) -> None:  # noqa: ANN001
    """The full cycle with the arrays and bookings and without them, alternating."""
    pend_with, pend_without = (with_arrays(state, args.arrays, args.seed) if args.arrays
                               else (list(state.pending), list(state.pending)))
    books = bookings(state, args.reservations, now, args.seed) if args.reservations else []
    with_ = replace(state, pending=pend_with, bookings=books)
    without = replace(state, pending=pend_without)
    a: list[float] = []
    b: list[float] = []
    ac: list[float] = []
    bc: list[float] = []
    for _ in range(args.repeat):
        for st, wall, cpu in ((without, b, bc), (with_, a, ac)):
            ms, c, _ = timed(lambda st=st: schedule(st, now), 1)
            wall.append(ms)
            cpu.append(c)
    ds_with, ds_without = schedule(with_, now), schedule(without, now)
    med = statistics.median

    def counts(ds: list) -> str:
        return (f"{sum(isinstance(d, Start) for d in ds)} starts, "
                f"{sum(isinstance(d, Preempt) for d in ds)} preemptions")

    print(f"{args.arrays or 'no'} arrays, {len(books)} reservations "
          f"({sum(len(x.gpus) for x in books)} GPUs booked, "
          f"{sum(1 for x in books if x.active(now))} in their window):")
    print(f"full cycle with them:    median {med(a):7.1f} ms (CPU {med(ac):.1f} ms; "
          f"{counts(ds_with)})")
    print(f"full cycle without them: median {med(b):7.1f} ms (CPU {med(bc):.1f} ms; "
          f"{counts(ds_without)})")
    print(json.dumps({"full_cycle_ms_p50": round(med(a), 2),
                      "full_cycle_ms_p50_without": round(med(b), 2),
                      "full_cycle_cpu_ms_p50": round(med(ac), 2),
                      "full_cycle_cpu_ms_p50_without": round(med(bc), 2),
                      "ratio": round(med(a) / med(b), 3),
                      "cpu_ratio": round(med(ac) / med(bc), 3),
                      "arrays": args.arrays or "", "reservations": len(books)}))
