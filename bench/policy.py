"""Scheduling quality: preemption churn and its cost, fair share, debug waits,
utilisation and where the rest goes, run-time predictions — on ITP cluster01 and the
built-in synthetic workload.

    .venv/bin/python bench/policy.py [--traces ../shared/traces] [--seed 0] [--big]

Runs, each the same as the ``gpubudget simulate`` command shown next to it:

1. ITP cluster01 (``--trace ../shared/traces/itp/cluster01.csv --budgets
   examples/budgets-itp.yaml``: 64 GPUs, 600 s cycle); skipped when the trace is absent;
2. the synthetic workload under 1.4× load for 3 days (``--load 1.4 --horizon 72
   --cycle-interval 10``);
3. the seed's month: demand 2.5× supply (``--workloads 8000 --days 30 --load 2.5 --horizon 720
   --cycle-interval 30 --checkpoint-interval 1800``, 64 GPUs), timed;
4. with ``--big``: the same month on 512 GPUs with 64,000 workloads (``--gpus 512
   --workloads 64000``; minutes);
5. run-time predictions replayed on ITP cluster01 and on the month's trace
   (``jupyter_gpubudget/sim/predictions.py``).

The policy's weights (core/model.py Policy: preemption_margin, preemption_toll,
max_reservations; core/backfill.py: PREDICT_QUANTILE, BACKFILL_QUANTILE, RESERVE_QUANTILE)
were chosen on synthetic seeds 1 and 2 (``--seed 1``, ``--seed 2``); the figures to report are
seed 0, the seed the commands above use. ITP cluster01 is one trace: it was looked at while tuning too.

Timings are wall-clock and CPU seconds of this process on a shared machine: read them with
that in mind. Prints a table, then one JSON line (keys listed in ``KEYS``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyter_gpubudget.sim import metrics, predictions  # noqa: E402
from jupyter_gpubudget.sim.engine import SimConfig, simulate  # noqa: E402
from jupyter_gpubudget.sim.run import Setup, prepare  # noqa: E402
from jupyter_gpubudget.sim.synthetic import SyntheticSpec  # noqa: E402

TUNING_SEEDS = (1, 2)
GOALS = {  # the scheduling-quality goals, for the table
    "itp_preemptions_per_job": ("≤", 0.10), "synthetic_preemptions_per_job": ("≤", 0.10),
    "itp_lost_gpu_hours_pct": ("≤", 1.0), "synthetic_lost_gpu_hours_pct": ("≤", 1.0),
    "share_error_pts_max": ("≤", 3.0), "debug_wait_p90_s": ("≤", 60.0),
    "month_util": ("≥", 0.95), "month_share_error_pts": ("≤", 2.0),
    "month_debug_p90_s": ("≤", 300.0), "month_preemptions_per_job": ("≤", 0.10),
    "month_lost_pct": ("≤", 1.0), "month_sim_s": ("≤", 60.0), "month_sim_cpu_s": ("≤", 60.0),
    "big_util": ("≥", 0.95), "big_share_error_pts": ("≤", 2.0),
    "big_debug_p90_s": ("≤", 60.0), "big_preemptions_per_job": ("≤", 0.10),
    "big_lost_pct": ("≤", 1.0),
}


def run(label: str, setup: Setup, cfg: SimConfig) -> tuple[dict[str, Any], float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(setup.trace, setup.budgets.accounts, setup.inventory, setup.budgets.policy,
                   cfg)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    m = metrics.compute(res)
    dbg = m["kinds"].get("debug", {}).get("wait_p90_s")
    print(f"{label}: {m['arrived']} workloads on {m['gpus']:g} GPUs, {m['span_hours']:.0f} h; "
          f"utilisation {100 * m['utilisation']:.1f} %; {m['preemptions']} preemptions "
          f"({m['preemptions_per_workload']:.3f} per workload; backfilled work reclaimed "
          f"{m['decisions'].get('backfill_preempt', 0)} of "
          f"{m['decisions'].get('backfill', 0)} backfills); lost "
          f"{m['lost_gpu_hours']:.1f} GPU-h ({m['lost_pct_of_delivered']:.2f} % of delivered); "
          f"programs' share error {m['share_error_pts']:.2f} pt; debug p90 wait "
          f"{'–' if dbg is None else f'{dbg:.0f} s'}; {wall:.1f} s wall, {cpu:.1f} s CPU",
          flush=True)
    unused = ", ".join(f"{k} {100 * v:.1f} %" for k, v in m["unused"].items())
    print(f"  unused capacity by cause: {unused}", flush=True)
    return m, wall, cpu


def month(seed: int, gpus: int, workloads: int) -> Setup:
    return prepare(None, None, gpus=gpus, synthetic=SyntheticSpec(
        workloads=workloads, days=30, load=2.5, gpus=gpus, seed=seed))


def month_config(seed: int) -> SimConfig:
    return SimConfig(cycle_interval=30, horizon=720 * 3600, checkpoint_interval=1800, seed=seed)


def three_day(seed: int) -> tuple[Setup, SimConfig]:
    """The synthetic workload under 1.4x load for 3 days at a 10 s cycle."""
    return (prepare(None, None, synthetic=SyntheticSpec(load=1.4, seed=seed)),
            SimConfig(cycle_interval=10, horizon=72 * 3600, seed=seed))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "traces"))
    ap.add_argument("--seed", type=int, default=0,
                    help=f"synthetic seed (0; the policy was tuned on {TUNING_SEEDS})")
    ap.add_argument("--big", action="store_true", help="also the 512-GPU month (minutes)")
    args = ap.parse_args()
    tuned = " (a tuning seed)" if args.seed in TUNING_SEEDS else " (not used for tuning)"
    print(f"synthetic seed {args.seed}{tuned}; policy tuned on seeds {TUNING_SEEDS}")
    out: dict[str, Any] = {"seed": args.seed}

    itp = Path(args.traces) / "itp" / "cluster01.csv"
    itp_setup = None
    if itp.exists():
        itp_setup = prepare(str(itp), str(ROOT / "examples" / "budgets-itp.yaml"))
        m, _, _ = run("ITP cluster01", itp_setup, SimConfig())
        out["itp_preemptions_per_job"] = round(m["preemptions_per_workload"], 4)
        out["itp_lost_gpu_hours_pct"] = round(m["lost_pct_of_delivered"], 3)
        out["itp_backfills"] = m["decisions"].get("backfill", 0)
        out["itp_backfills_reclaimed"] = m["decisions"].get("backfill_preempt", 0)
    else:
        print(f"ITP cluster01: {itp} not found, skipped")

    m, _, _ = run("synthetic, load 1.4, 72 h, 10 s cycle", *three_day(args.seed))
    out["synthetic_preemptions_per_job"] = round(m["preemptions_per_workload"], 4)
    out["synthetic_lost_gpu_hours_pct"] = round(m["lost_pct_of_delivered"], 3)
    out["share_error_pts_max"] = round(m["share_error_pts"], 3)
    dbg = m["kinds"].get("debug", {}).get("wait_p90_s")
    out["debug_wait_p90_s"] = None if dbg is None else round(dbg, 1)

    month_setup = month(args.seed, 64, 8000)
    cfg = month_config(args.seed)
    m, wall, cpu = run("the seed's month, 64 GPUs, 30 s cycle", month_setup, cfg)
    dbg = m["kinds"].get("debug", {}).get("wait_p90_s")
    out.update({"month_util": round(m["utilisation"], 4),
                "month_share_error_pts": round(m["share_error_pts"], 3),
                "month_debug_p90_s": None if dbg is None else round(dbg, 1),
                "month_preemptions_per_job": round(m["preemptions_per_workload"], 4),
                "month_lost_pct": round(m["lost_pct_of_delivered"], 3),
                "month_sim_s": round(wall, 1), "month_sim_cpu_s": round(cpu, 1),
                "month_unused": {k: round(v, 4) for k, v in m["unused"].items()},
                "month_backfills": m["decisions"].get("backfill", 0),
                "month_backfills_reclaimed": m["decisions"].get("backfill_preempt", 0)})
    if args.big:
        m, wall, cpu = run("the seed's month, 512 GPUs, 64,000 workloads",
                           month(args.seed, 512, 64000), cfg)
        dbg = m["kinds"].get("debug", {}).get("wait_p90_s")
        out.update({"big_util": round(m["utilisation"], 4),
                    "big_share_error_pts": round(m["share_error_pts"], 3),
                    "big_debug_p90_s": None if dbg is None else round(dbg, 1),
                    "big_preemptions_per_job": round(m["preemptions_per_workload"], 4),
                    "big_lost_pct": round(m["lost_pct_of_delivered"], 3),
                    "big_sim_s": round(wall, 1), "big_sim_cpu_s": round(cpu, 1)})

    worst: dict[str, float] = {}
    best_baseline = float("inf")
    for name, setup in (("itp", itp_setup), ("synthetic", month_setup)):
        if setup is None:
            continue
        e = predictions.evaluate(setup.trace, setup.budgets.policy)
        print(f"predictions, {name} ({e['jobs']} jobs): MdAPE {e['predicted']['mdape']:.1f} %, "
              f"{e['predicted']['under_pct']:.1f} % ran past their prediction; baseline MdAPE "
              f"{e['baseline_mdape']:.1f} % (plain p90 {e['plain_p90']['mdape']:.1f} %, "
              f"declared limit {e['declared']['mdape']:.1f} %)", flush=True)
        out[f"{name}_pred_mdape"] = round(e["predicted"]["mdape"], 2)
        out[f"{name}_pred_under_pct"] = round(e["predicted"]["under_pct"], 2)
        out[f"{name}_baseline_mdape"] = round(e["baseline_mdape"], 2)
        for k in ("pred_mdape", "pred_under_pct"):
            worst[k] = max(worst.get(k, 0.0), out[f"{name}_{k}"])
        best_baseline = min(best_baseline, out[f"{name}_baseline_mdape"])
    # the headline keys, conservatively: the predictor's worse trace against the baseline's
    # better one (pred_mdape < baseline_mdape means it beats the baseline on both traces)
    out.update({k: round(v, 2) for k, v in worst.items()})
    if best_baseline < float("inf"):
        out["baseline_mdape"] = round(best_baseline, 2)

    print("goal check:")
    for key, (op, goal) in GOALS.items():
        if out.get(key) is None:
            continue
        v = out[key]
        ok = v <= goal if op == "≤" else v >= goal
        print(f"  {key:32s} {v!s:>10} {op} {goal:<6g} {'met' if ok else 'NOT met'}")
    for name in ("itp", "synthetic"):
        if f"{name}_pred_mdape" in out:
            ok = out[f"{name}_pred_mdape"] < out[f"{name}_baseline_mdape"]
            print(f"  {name + '_pred_mdape':32s} {out[name + '_pred_mdape']!s:>10} < "
                  f"{out[name + '_baseline_mdape']:<6g} {'met' if ok else 'NOT met'}")
    print(json.dumps(out))


KEYS = ("itp_preemptions_per_job", "synthetic_preemptions_per_job", "itp_lost_gpu_hours_pct",
        "synthetic_lost_gpu_hours_pct", "share_error_pts_max", "debug_wait_p90_s",
        "month_util", "month_debug_p90_s", "month_preemptions_per_job", "month_lost_pct",
        "month_sim_s", "pred_mdape", "pred_under_pct", "baseline_mdape")

if __name__ == "__main__":
    main()
