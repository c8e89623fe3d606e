"""Simulator throughput: wall time and events per second.

(a) Microsoft ITP cluster01 (../shared/traces/itp/cluster01.csv, skipped when absent) with
    examples/budgets-itp.yaml on the default 64-GPU inventory;
(b) a seeded synthetic 60-day trace of 100,000 workloads on 2,048 GPUs.

    .venv/bin/python bench/sim.py [--traces ../shared/traces] [--workloads 100000]

Last line is JSON: {"itp_cluster01_s": …, "synthetic_100k_s": …, "events_per_s": …}.
Targets (2-core machine): ITP cluster01 ≤ 3 s; synthetic 100k ≤ 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyter_gpubudget.sim.engine import SimConfig, simulate  # noqa: E402
from jupyter_gpubudget.sim.run import prepare  # noqa: E402
from jupyter_gpubudget.sim.synthetic import SyntheticSpec  # noqa: E402


def run(label: str, setup, cfg: SimConfig) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    res = simulate(setup.trace, setup.budgets.accounts, setup.inventory, setup.budgets.policy, cfg)
    dt = time.perf_counter() - t0
    started = sum(1 for r in res.records.values() if r.first_start is not None)
    print(f"{label}: {len(setup.trace)} workloads on {setup.inventory.gpu_count} GPUs, "
          f"{res.events} events, {res.cycles} cycles, {started} started, "
          f"{res.decisions.get('preempt', 0)} preemptions: {dt:.2f} s "
          f"({res.events / dt:,.0f} events/s)", flush=True)
    return dt, res.events


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "traces"))
    ap.add_argument("--workloads", type=int, default=100_000)
    ap.add_argument("--days", type=float, default=60.0)
    ap.add_argument("--gpus", type=int, default=2048)
    args = ap.parse_args()

    out: dict[str, float | None] = {"itp_cluster01_s": None, "synthetic_100k_s": None}
    events = 0
    total = 0.0
    itp = Path(args.traces) / "itp" / "cluster01.csv"
    if itp.exists():
        setup = prepare(str(itp), str(ROOT / "examples" / "budgets-itp.yaml"))
        dt, ev = run("ITP cluster01", setup, SimConfig())
        out["itp_cluster01_s"] = round(dt, 3)
        events += ev
        total += dt
    else:
        print(f"ITP cluster01: {itp} not found, skipped")
    t0 = time.perf_counter()
    setup = prepare(None, None, synthetic=SyntheticSpec(
        workloads=args.workloads, days=args.days, gpus=args.gpus, seed=0))
    print(f"synthetic trace generated in {time.perf_counter() - t0:.2f} s")
    dt, ev = run("synthetic", setup, SimConfig())
    out["synthetic_100k_s"] = round(dt, 3)
    events += ev
    total += dt
    out["events_per_s"] = round(events / total) if total else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
