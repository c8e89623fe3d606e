"""openb placement reproduction (FGD paper setting): best-fit baseline vs the default placement.

    .venv/bin/python bench/openb.py [--pods P] [--nodes N] [--seeds 10] [--first-seed 0]
                                    [--ratio 1.3] [--policies bestfit,default[,fgd-index]]

Defaults: the shared openb lists under ../shared/traces/openb/, seeds 0-9. Prints per-seed
allocation ratios and the mean ± std per policy; last line JSON:
{"bestfit_alloc_130": …, "default_alloc_130": …, …} (percent of GPU capacity, mean over seeds;
also the std and the seeds used).

The placement's weights (core/fragmentation.py: FIT_WEIGHT, STRAND_WEIGHT) were chosen on
seeds 10-12 (``--first-seed 10 --seeds 3``); the figures to report are seeds 0-9, which the
tuning never saw. Published (10 seeds, 130 % arrived): default trace BestFit 93.08 ± 0.13,
FGD 95.39 ± 0.08; gpushare40 91.69 / 94.15; gpushare80 87.01 / 89.30.
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
PUBLISHED = {  # pod list -> (BestFit, FGD) at 130 % arrived, FGD paper artifact, 10 seeds
    "openb_pod_list_default": (93.08, 95.39),
    "openb_pod_list_gpushare40": (91.69, 94.15),
    "openb_pod_list_gpushare80": (87.01, 89.30),
}
TUNING_SEEDS = range(10, 13)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", default=str(SHARED / "openb_pod_list_default.csv"))
    ap.add_argument("--nodes", default=str(SHARED / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--seeds", type=int, default=10, help="how many seeds (10)")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="first seed (0; the weights were tuned on seeds 10-12)")
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
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    tuned = sorted(set(seeds) & set(TUNING_SEEDS))
    print(f"{len(nodes)} nodes, {cap // MILLI} GPUs; {len(pods)} pods ({Path(args.pods).name}); "
          f"sampling to {args.ratio:.0%} of capacity; seeds {seeds.start}-{seeds.stop - 1}"
          + (f" (includes tuning seeds {tuned})" if tuned else " (none used for tuning)"))
    runs: dict[str, list[openb.PlacementRun]] = {p: [] for p in policies}
    for seed in seeds:
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
    pct = int(round(args.ratio * 100))
    pub = PUBLISHED.get(Path(args.pods).stem)
    if pub and pct == 130:
        print(f"published: BestFit {pub[0]:.2f}, FGD {pub[1]:.2f}; default − FGD = "
              f"{summary.get('default', {}).get('mean', float('nan')) - pub[1]:+.2f} points")
    out: dict[str, object] = {}
    for p in policies:
        out[f"{p}_alloc_{pct}"] = round(summary[p]["mean"], 3)
    for p in policies:
        out[f"{p}_std_{pct}"] = round(summary[p]["std"], 3)
    out["seeds"] = f"{seeds.start}-{seeds.stop - 1}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
