"""What the policy keys trade against each other, over seeds: the 3-day synthetic run (and,
if asked, the month) for the defaults and for variants of the keys that move a program's
fair share against churn — the loss budget that finishing drains spends, drains not
finished, a gang that preempts once overdue, a second GPU for the short lane — each
summed over the seeds as ``bench/policy_seeds.py`` sums one policy.

    .venv/bin/python bench/policy_frontier.py [--seeds 0-20] [--runs 3day,month]
                                              [--variant 'NAME: KEY=VALUE, KEY=VALUE' ...]
                                              [--plot frontier.png] [--jobs N]

For an admin choosing ``finish_drain_budget`` (or another key of the budgets YAML's
``policy:``): where each choice lands on fairness and on churn, on many seeds rather than
one. And for telling what no key reaches: the chart draws the policy goals as dashed lines
and, on the worst-case panel, the share error that the max-min fair split itself has
(``share_error_floor_pts``: a program asked for less than its grant), below which no
scheduler that leaves no GPU idle can go.

Prints one row per policy and run: each goal's mean and worst over the seeds, and how many
seeds meet it; the goals missed (seed x goal pairs, as ``bench/policy_seeds.py`` counts
them); then one JSON line. ``--variant`` replaces the built-in variants (the defaults are
always run first, as the reference); its keys are read and checked as the budgets YAML
reads them (``1h``, ``0.5``, ``true``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from policy_seeds import FIGURES, one, over_seeds, parse_seeds, parse_sets  # noqa: E402

#: the variants run by default: (name, the policy keys as a budgets YAML would give them)
VARIANTS: list[tuple[str, list[str]]] = [
    ("no drain finished", ["finish_drain_ratio=0"]),
    ("loss budget 0.005", ["finish_drain_budget=0.005"]),
    ("loss budget 0.007", ["finish_drain_budget=0.007"]),
    ("loss budget 0.012", ["finish_drain_budget=0.012"]),
    ("no loss budget", ["finish_drain_budget=0"]),
    ("overdue gangs preempt after 1 h", ["gang_overdue_after=1h"]),
    ("two GPUs for the short lane", ["short_lane_hold=2"]),
]

#: per run, the chart's panels: (x figure, its statistic, y figure, its statistic)
PANELS: dict[str, list[tuple[str, str, str, str]]] = {
    "3day": [("preemptions_per_workload", "worst", "share_error_pts", "mean"),
             ("lost_pct_of_delivered", "worst", "share_error_pts", "worst")],
    "month": [("debug_p90_s", "worst", "utilisation", "mean"),
              ("preemptions_per_workload", "worst", "share_error_pts", "worst")],
}

#: the policy goals over seeds where they differ from the per-seed goal: (run, figure, statistic)
ACCEPTANCE: dict[tuple[str, str, str], float] = {
    ("3day", "share_error_pts", "mean"): 2.0, ("3day", "share_error_pts", "worst"): 4.0,
    ("month", "utilisation", "mean"): 0.95, ("month", "utilisation", "worst"): 0.94,
}


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``'NAME: KEY=VALUE, KEY=VALUE'`` → the name and the policy keys, checked."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"--variant: expected 'NAME: KEY=VALUE, ...', got {text!r}")
    items = [item.strip() for item in rest.split(",") if item.strip()]
    if not items:
        raise ValueError(f"--variant {name!r}: no policy key given")
    try:
        return name, parse_sets(items)
    except ValueError as e:
        raise ValueError(f"--variant {name!r}: {e}".replace("--set: ", "")) from None


def summarise(which: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each goal's mean, worst and seeds meeting it over ``rows`` (one run, one policy), the
    floor's worst, and the seed x goal pairs missed."""
    out: dict[str, Any] = {}
    missed = 0
    for _, key, op, goal in FIGURES[which]:
        vals = [r[key] for r in rows if r[key] is not None]
        if not vals:
            continue
        mean, worst, met = over_seeds(vals, key, op, goal)
        if op:
            missed += len(vals) - met
            out[key] = {"mean": mean, "worst": worst, "seeds_met": met}
        elif key == "share_error_floor_pts":
            out[key] = {"mean": mean, "worst": worst}
    out["goals_missed"] = missed
    return out


def table(which: str, results: dict[str, dict[str, Any]], seeds: int) -> None:
    goals = [(name, key, op, goal) for name, key, op, goal in FIGURES[which] if op]
    print(f"\n{which}: mean / worst over {seeds} seeds (seeds meeting the goal)")
    print(f"  {'policy':34s}" + "".join(f"{f'{n} {op} {g:g}':>26s}" for n, _, op, g in goals)
          + f"{'goals missed':>14s}")
    for name, s in results.items():
        cells = []
        for _, key, _, _ in goals:
            f = s.get(key)
            cells.append("–".rjust(26) if f is None else
                         f"{f['mean']:.4g} / {f['worst']:.4g} ({f['seeds_met']})".rjust(26))
        print(f"  {name[:34]:34s}" + "".join(cells) + f"{s['goals_missed']:>14d}")


def plot(results: dict[str, dict[str, dict[str, Any]]], runs: list[str], path: str) -> None:
    """A panel per pair of figures: each policy a labelled point, the defaults ringed,
    each goal a dashed line and the region meeting both shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(len(PANELS[which]) for which in runs)
    fig, axes = plt.subplots(len(runs), cols, figsize=(6.5 * cols, 5.5 * len(runs)),
                             squeeze=False)
    goal_of = {(which, key): (op, goal) for which in runs for _, key, op, goal in FIGURES[which]}
    panels = [(ax, which, *p) for row, which in zip(axes, runs, strict=True)
              for ax, p in zip(row, PANELS[which], strict=False)]
    for ax, which, xk, xs, yk, ys in panels:
        pts = [(name, r[which][xk][xs], r[which][yk][ys]) for name, r in results.items()
               if xk in r[which] and yk in r[which]]
        for i, (name, x, y) in enumerate(pts):
            ax.scatter([x], [y], s=90 if i == 0 else 40, zorder=3,
                       facecolors="none" if i == 0 else "C0", edgecolors="C3" if i == 0 else "C0",
                       linewidths=2 if i == 0 else 1)
            ax.annotate(name, (x, y), textcoords="offset points", fontsize=8,
                        xytext=(6, 4 if i % 2 == 0 else -11))  # neighbours apart
        xop, xgoal = goal_of[(which, xk)]
        yop, ygoal = goal_of[(which, yk)]
        ygoal = ACCEPTANCE.get((which, yk, ys), ygoal)
        ax.axvline(xgoal, ls="--", color="C2", lw=1)
        ax.axhline(ygoal, ls="--", color="C2", lw=1)
        lo_x, hi_x = ax.get_xlim()
        lo_y, hi_y = ax.get_ylim()
        lo_x, hi_x = min(lo_x, xgoal * 0.98), max(hi_x, xgoal * 1.02)
        lo_y, hi_y = min(lo_y, ygoal * 0.98), max(hi_y, ygoal * 1.02)
        ax.fill_between([lo_x, xgoal] if xop == "≤" else [xgoal, hi_x],
                        lo_y if yop == "≤" else ygoal, ygoal if yop == "≤" else hi_y,
                        color="C2", alpha=0.12, label="the goals met")
        floor = next(iter(results.values()))[which].get("share_error_floor_pts", {}).get("worst")
        if yk == "share_error_pts" and ys == "worst" and floor:
            ax.axhline(floor, color="C1", lw=1.5,
                       label=f"the max-min fair split's own error, worst seed ({floor:.2f} pt):"
                             "\nno scheduler that leaves no GPU idle goes below it")
            hi_y = max(hi_y, floor * 1.05)
        ax.set_xlim(lo_x, hi_x)
        ax.set_ylim(lo_y, hi_y)
        ax.set_xlabel(f"{which}: {xk.replace('_', ' ')}, {xs} seed")
        ax.set_ylabel(f"{which}: {yk.replace('_', ' ')}, {ys} over the seeds")
        ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("Each policy over the seeds (ringed: the defaults); dashed: the goals")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0-20", help="seeds: 0-5, 0,3,7 (default 0-20)")
    ap.add_argument("--runs", default="3day",
                    help="3day, month or both (default 3day; a month takes about half a "
                         "minute per seed and CPU)")
    ap.add_argument("--variant", action="append", default=[], metavar="'NAME: KEY=VALUE, ...'",
                    help="a policy to run beside the defaults (repeatable; replaces the "
                         "built-in variants)")
    ap.add_argument("--plot", metavar="FILE.png", help="draw the policies, goals drawn in")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="simulations run side by side (default: the CPUs)")
    args = ap.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        runs = [r.strip() for r in args.runs.split(",") if r.strip()]
        if not runs or any(r not in FIGURES for r in runs):
            raise ValueError(f"--runs: expected 3day and/or month, got {args.runs!r}")
        variants = ([parse_variant(v) for v in args.variant] if args.variant else
                    [(name, parse_sets(items)) for name, items in VARIANTS])
        names = [name for name, _ in variants]
        if "defaults" in names or len(set(names)) != len(names):
            raise ValueError("--variant: each needs a name of its own (the defaults run "
                             "anyway, as 'defaults')")
        if args.plot and not args.plot.endswith(".png"):
            raise ValueError(f"--plot: expected a .png file name, got {args.plot!r}")
        if args.plot:
            parent = Path(args.plot).resolve().parent
            if not parent.is_dir() or not os.access(parent, os.W_OK):
                raise ValueError(f"--plot: cannot write a file in {str(parent)!r}")
    except ValueError as e:
        ap.error(str(e))
    policies = [("defaults", {}), *variants]
    total = len(policies) * len(runs) * len(seeds)
    print(f"{len(policies)} policies x {len(runs)} runs x {len(seeds)} seeds = {total} "
          f"simulations", flush=True)
    results: dict[str, dict[str, Any]] = {name: {} for name, _ in policies}
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {(name, which, s): pool.submit(one, which, s, sets)
                   for name, sets in policies for which in runs for s in seeds}
        done = 0
        for name, _ in policies:
            for which in runs:
                rows = [futures[(name, which, s)].result() for s in seeds]
                results[name][which] = summarise(which, rows)
                done += len(seeds)
            print(f"  [{done}/{total}] {name}", flush=True)
    for which in runs:
        table(which, {name: r[which] for name, r in results.items()}, len(seeds))
    if args.plot:
        plot(results, runs, args.plot)
        print(f"chart: {args.plot}")
    out = {"seeds": seeds, "runs": runs,
           "policies": {name: {"set": dict(sets), **results[name]}
                        for name, sets in policies}}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
