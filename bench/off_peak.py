"""Off-peak prices replayed on the seed's month (bench/policy.py: 64 GPUs, 8,000 workloads,
demand 2.5× supply, 30 s cycle, 720 h): the run without off-peak prices and the run with
them, every batch job that can wait (or ``--share`` of them) waiting for the next window;
``--load 0.85`` the same month with room at night (demand 0.85× supply).

    .venv/bin/python bench/off_peak.py [--seed 0] [--factor 0.5] [--share 1.0]

The same as ``gpubudget simulate --workloads 8000 --days 30 --load 2.5 --horizon 720
--cycle-interval 30 --checkpoint-interval 1800 --seed 0 --off-peak 0.5`` (default windows:
Mon-Fri 20:00-07:00 and weekends, UTC; the trace starts on Thursday 1 January 1970, 00:00
UTC). Prints the figures (sim/offpeak.py), then one JSON line.
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
sys.path.insert(0, str(ROOT / "bench"))

from policy import month, month_config  # noqa: E402

from jupyter_gpubudget.sim.offpeak import replay  # noqa: E402
from jupyter_gpubudget.sim.run import prepare  # noqa: E402
from jupyter_gpubudget.sim.synthetic import SyntheticSpec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--factor", type=float, default=0.5)
    ap.add_argument("--share", type=float, default=1.0,
                    help="share of the batch jobs that wait for the windows (1.0: all)")
    ap.add_argument("--load", type=float, default=2.5,
                    help="demand over supply (2.5: the seed's month; lower: nights with room)")
    args = ap.parse_args()
    setup = month(args.seed, 64, 8000) if args.load == 2.5 else prepare(
        None, None, gpus=64, synthetic=SyntheticSpec(workloads=8000, days=30, load=args.load,
                                                     gpus=64, seed=args.seed))
    t0, c0 = time.perf_counter(), time.process_time()
    out = replay(setup.trace, setup.budgets, setup.inventory, month_config(args.seed),
                 args.factor, args.share)
    out.update(seed=args.seed, load=args.load, wall_s=round(time.perf_counter() - t0, 1),
               cpu_s=round(time.process_time() - c0, 1))
    b, a = out["before"], out["after"]
    print(f"seed {args.seed}'s month at load {args.load:g}, off-peak at {args.factor:g}x, {out['jobs_moved']} batch "
          f"jobs waited (median {out['jobs_moved_wait_h_median']:g} h)")
    print(f"batch GPU-hours in the windows: {b['batch_in_window_share']:.1%} -> "
          f"{a['batch_in_window_share']:.1%} (moved: {out['moved_share']:+.1%})")
    print(f"utilisation in the windows: {b['window_utilisation']:.1%} -> "
          f"{a['window_utilisation']:.1%}; outside them: {b['outside_utilisation']:.1%} -> "
          f"{a['outside_utilisation']:.1%}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
