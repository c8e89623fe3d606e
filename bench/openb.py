"""openb placement reproduction (FGD paper setting): best-fit baseline vs the default placement.

    .venv/bin/python bench/openb.py [--pods P] [--nodes N] [--seeds 10] [--ratio 1.3]
                                    [--policies bestfit,default[,fgd-index]]

Defaults: the shared openb lists under ../shared/traces/openb/. Prints per-seed allocation
ratios and the mean ± std per policy; last line JSON:
{"bestfit_alloc_130": …, "default_alloc_130": …} (percent of GPU capacity, mean over seeds).
Published (10 seeds): BestFit 93.08 ± 0.13, FGD 95.39 ± 0.08.
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

from jupyter_gpubudget.core.model import MILLI  # noqa: E402
from jupyter_gpubudget.sim import openb  # noqa: E402
from jupyter_gpubudget.sim.traces import load_openb_nodes, load_openb_pods  # noqa: E402

SHARED = ROOT.parent / "shared" / "traces" / "openb"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", default=str(SHARED / "openb_pod_list_default.csv"))
    ap.add_argument("--nodes", default=str(SHARED / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--ratio", type=float, default=1.3)
    ap.add_argument("--policies", default="bestfit,default")
    args = ap.parse_args()

    pods = load_openb_pods(args.pods)
    nodes = load_openb_nodes(args.nodes)
    cap = MILLI * sum(n.gpus for n in nodes)
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:
        if p not in openb.POLICIES:
            ap.error(f"unknown policy {p!r} (known: {', '.join(openb.POLICIES)})")
    print(f"{len(nodes)} nodes, {cap // MILLI} GPUs; {len(pods)} pods; "
          f"sampling to {args.ratio:.0%} of capacity; {args.seeds} seeds")
    runs: dict[str, list[openb.PlacementRun]] = {p: [] for p in policies}
    for seed in range(args.seeds):
        sample = openb.sample_pods(pods, cap, args.ratio, seed)
        line = [f"seed {seed}: {len(sample)} pods"]
        for p in policies:
            t0 = time.perf_counter()
            r = openb.POLICIES[p](nodes, sample, seed)
            runs[p].append(r)
            line.append(f"{p} {r.alloc_pct:.2f}% ({time.perf_counter() - t0:.1f} s)")
        print(", ".join(line), flush=True)
    summary = openb.summarise(runs)
    for p, s in summary.items():
        curve = {k: sum(r.curve.get(k, 0.0) for r in runs[p]) / len(runs[p])
                 for k in openb.CHECKPOINTS}
        pts = ", ".join(f"{int(k * 100)}%→{v:.2f}" for k, v in curve.items())
        print(f"{p}: {s['mean']:.2f} ± {s['std']:.2f} % allocated at {args.ratio:.0%} arrived "
              f"(along the way: {pts})")
    out = {f"{p}_alloc_{int(round(args.ratio * 100))}": round(summary[p]["mean"], 3)
           for p in policies}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
