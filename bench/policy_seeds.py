"""Scheduling quality across seeds: the 3-day synthetic run of bench/policy.py and the seed's 64-GPU
month on several synthetic seeds, with policy keys changed as a budgets file would change
them — for telling a policy change from the luck of one seed.

    .venv/bin/python bench/policy_seeds.py [--seeds 0-20] [--runs 3day,month]
                                           [--set gang_overdue_after=1h ...]
                                           [--compare | --baseline SAVED.json]
                                           [--plot compare.png] [--save OUT.json] [--jobs N]

The goals of ``bench/policy.py`` are judged here, over seeds 0-20 by default:
the policy's weights were tuned on seeds 1-2 (``policy.TUNING_SEEDS``; the lane's on 1-5),
so figures to report are those of the other seeds too, never of one seed.

``bench/policy.py`` reports one seed (0). Both runs here are chaotic in the way a busy
cluster is: one 32-GPU gang starting a few hours earlier or later moves a program's share
over three days by several points, so a change of policy is worth keeping only when it
holds on most seeds. Each run is the same as ``bench/policy.py``'s (and the ``gpubudget
simulate`` command its docstring shows); ``--set KEY=VALUE`` changes one key of the budgets
YAML's ``policy:`` and is read and checked by the same loader (``1h``, ``true``, ``0.5``).

Prints, per run, one row per seed with each goal of bench/policy.py marked, then how many seeds
meet each goal, the mean and the worst; then the goals missed over every seed and run
together (one number to compare policies by; choose on seeds other than 0, the seed
``bench/policy.py`` reports); last, one JSON line.

With ``--compare`` the defaults run too, on the same seeds, and the ``--set`` policy is
compared with them seed by seed: per goal's figure, the mean change with its standard
error, on how many seeds it is better or worse and a sign test (a p of 0.05 or less: about
one chance in twenty that a policy no better than the defaults splits the seeds so
unevenly), then the seed x goal pairs newly met and newly missed. Twice the time. ``--plot
FILE.png`` draws it: a panel per goal, each seed's two values joined.

``--save FILE.json`` writes the JSON line to a file too, and ``--baseline FILE.json``
compares with such a saved run instead of running the defaults: a change of *code* (a
prototype, another commit) measured against the run of the commit before it, on the same
seeds, in half the time. The file may be the JSON line or the whole printed output; a
baseline that lacks a run or seed asked for is refused before anything runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# bench/policy.py: the same set-ups and goals
from policy import GOALS, month, month_config, three_day  # noqa: E402

from jupyter_gpubudget.core.accounts import BudgetError, load_budgets  # noqa: E402
from jupyter_gpubudget.core.model import Policy  # noqa: E402
from jupyter_gpubudget.sim import metrics  # noqa: E402
from jupyter_gpubudget.sim.engine import simulate  # noqa: E402

#: per run: (figure, metrics key, "≤" or "≥", goal), the goals from bench/policy.py's GOALS
FIGURES: dict[str, list[tuple[str, str, str, float]]] = {
    "3day": [("share error pt", "share_error_pts", *GOALS["share_error_pts_max"]),
             ("preemptions/job", "preemptions_per_workload",
              *GOALS["synthetic_preemptions_per_job"]),
             ("lost %", "lost_pct_of_delivered", *GOALS["synthetic_lost_gpu_hours_pct"]),
             ("debug p90 s", "debug_p90_s", *GOALS["debug_wait_p90_s"]),
             ("utilisation", "utilisation", "", 0.0),
             ("entitled err pt", "entitled_share_error_pts", "", 0.0),
             ("floor pt", "share_error_floor_pts", "", 0.0)],
    "month": [("utilisation", "utilisation", *GOALS["month_util"]),
              ("share error pt", "share_error_pts", *GOALS["month_share_error_pts"]),
              ("debug p90 s", "debug_p90_s", *GOALS["month_debug_p90_s"]),
              ("preemptions/job", "preemptions_per_workload",
               *GOALS["month_preemptions_per_job"]),
              ("lost %", "lost_pct_of_delivered", *GOALS["month_lost_pct"]),
              ("entitled err pt", "entitled_share_error_pts", "", 0.0),
              ("floor pt", "share_error_floor_pts", "", 0.0)],
}


def parse_seeds(text: str) -> list[int]:
    """``0-5`` or ``0,3,7`` (or both: ``0-2,9``)."""
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.strip().partition("-")
        if not a.isdigit() or (b and not b.isdigit()):
            raise ValueError(f"seeds: expected numbers like 0-5 or 0,3,7, got {text!r}")
        out.extend(range(int(a), int(b) + 1) if b else [int(a)])
    if not out:
        raise ValueError("seeds: none given")
    return sorted(set(out))


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as the budgets YAML's ``policy:`` would read them."""
    known = {f.name for f in fields(Policy)}
    lines = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set: expected KEY=VALUE, got {item!r}")
        if key not in known:
            raise ValueError(f"--set: unknown policy key {key!r}")
        lines.append(f"  {key}: {value}")
    if not lines:
        return {}
    text = "policy:\n" + "\n".join(lines) + "\naccounts: {a: {grant: 1}}\n"
    try:
        policy = load_budgets(text, "--set").policy
    except BudgetError as e:
        raise ValueError(str(e)) from None
    return {item.partition("=")[0]: getattr(policy, item.partition("=")[0]) for item in items}


def one(which: str, seed: int, sets: dict[str, Any]) -> dict[str, Any]:
    setup, cfg = three_day(seed) if which == "3day" else (month(seed, 64, 8000),
                                                          month_config(seed))
    policy = replace(setup.budgets.policy, **sets)
    m = metrics.compute(simulate(setup.trace, setup.budgets.accounts, setup.inventory, policy,
                                 cfg))
    dbg = m["kinds"].get("debug", {}).get("wait_p90_s")
    m["debug_p90_s"] = dbg
    return {"run": which, "seed": seed,
            **{key: m[key] for _, key, _, _ in FIGURES[which]}}


def meets(value: float | None, op: str, goal: float) -> bool | None:
    if value is None or not op:
        return None
    return value <= goal if op == "≤" else value >= goal


def over_seeds(vals: list[float], key: str, op: str, goal: float
               ) -> tuple[float, float | None, int]:
    """One figure over the seeds: its mean, its worst (toward the goal's wrong side; for a
    figure with no goal, the largest of a share error in points, else None) and how many
    seeds meet the goal."""
    worst = ((max(vals) if op == "≤" else min(vals)) if op else
             max(vals) if key.endswith("_pts") else None)
    met = sum(1 for v in vals if meets(v, op, goal))
    return sum(vals) / len(vals), worst, met


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0-20", help="seeds: 0-5, 0,3,7 (default 0-20)")
    ap.add_argument("--runs", default="3day,month", help="3day, month or both (default)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a policy key as in the budgets YAML (repeatable)")
    ap.add_argument("--compare", action="store_true",
                    help="also run the defaults and compare the --set policy with them, seed "
                         "by seed (paired: the same seeds, the same traces)")
    ap.add_argument("--baseline", metavar="SAVED.json",
                    help="compare with a run saved by --save (or its printed output) instead of "
                         "running the defaults: a code change against the commit before it")
    ap.add_argument("--plot", metavar="FILE.png",
                    help="with --compare or --baseline: a chart of each goal's figure per "
                         "seed, the two runs side by side, the goal drawn in")
    ap.add_argument("--save", metavar="OUT.json",
                    help="also write the JSON line to this file (a later run's --baseline)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="simulations run side by side (default: the CPUs)")
    args = ap.parse_args()
    try:
        seeds = parse_seeds(args.seeds)
        sets = parse_sets(args.set)
        runs = [r.strip() for r in args.runs.split(",") if r.strip()]
        bad = [r for r in runs if r not in FIGURES]
        if bad or not runs:
            raise ValueError(f"--runs: expected 3day and/or month, got {args.runs!r}")
        if args.compare and args.baseline:
            raise ValueError("--baseline: compares with a saved run instead of the defaults; "
                             "leave out --compare")
        if args.plot and not (args.compare or args.baseline):
            raise ValueError("--plot: draws the comparison; add --compare and --set, or "
                             "--baseline")
        if args.plot and not args.plot.endswith(".png"):
            raise ValueError(f"--plot: expected a .png file name, got {args.plot!r}")
        if args.compare and not sets:
            raise ValueError("--compare: give the policy to compare with the defaults by "
                             "--set KEY=VALUE")
        saved = load_baseline(args.baseline, runs, seeds) if args.baseline else None
        if args.save:  # a file that cannot be written is refused now, not after the runs
            parent = Path(args.save).resolve().parent
            if not parent.is_dir() or not os.access(parent, os.W_OK):
                raise ValueError(f"--save: cannot write a file in {str(parent)!r}")
    except ValueError as e:
        ap.error(str(e))
    print(f"seeds {seeds}; policy changes: {sets or 'none (the defaults)'}", flush=True)
    out: dict[str, Any] = {"seeds": seeds, "set": dict(sets)}
    missed = 0  # goals missed, over every seed and run: one number to compare policies by
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {(r, s): pool.submit(one, r, s, sets) for r in runs for s in seeds}
        base = ({(r, s): pool.submit(one, r, s, {}) for r in runs for s in seeds}
                if args.compare else {})
        for which in runs:
            figs = FIGURES[which]
            print(f"\n{which}: " + ("synthetic, load 1.4, 72 h, 10 s cycle" if which == "3day"
                                    else "the seed's month, 64 GPUs, 2.5x, 30 s cycle"))
            print("  seed  " + "  ".join(f"{name:>16s}" for name, *_ in figs))
            rows = []
            for s in seeds:
                row = futures[(which, s)].result()
                rows.append(row)
                cells = []
                for _, key, op, goal in figs:
                    v = row[key]
                    ok = meets(v, op, goal)
                    missed += ok is False
                    mark = "" if ok is None else (" ok" if ok else " NO")
                    cells.append(f"{'–' if v is None else f'{v:.4g}'}{mark}".rjust(16))
                print(f"  {s:>4d}  " + "  ".join(cells), flush=True)
            summary: dict[str, Any] = {}
            for _, key, op, goal in figs:
                vals = [r[key] for r in rows if r[key] is not None]
                if not vals:
                    continue
                mean, worst, met = over_seeds(vals, key, op, goal)
                summary[key] = {"mean": round(mean, 4),
                                "worst": None if worst is None else round(worst, 4),
                                "seeds_met": met if op else None}
                if op:
                    print(f"  {key}: {met} of {len(vals)} seeds meet {op} {goal:g}; mean "
                          f"{mean:.4g}, worst {worst:.4g}")
            out[which] = {"per_seed": rows, "summary": summary}
    pairs = sum(len(seeds) * sum(1 for f in FIGURES[r] if f[2]) for r in runs)
    print(f"\ngoals missed, over every seed and run: {missed} of {pairs} seed x goal pairs "
          f"({100 * missed / pairs:.1f} %)")
    out["goals_missed"] = missed
    out["goals_missed_pct"] = round(100 * missed / pairs, 2)
    # the policy goals over seeds: share error mean and worst per run
    # (and, beside it, the error from the max-min entitled share: a program that asked for
    # less than its grant's part is entitled to what it asked for, not to its grant share)
    for which, mean_max, worst_max in (("3day", 2.0, 4.0), ("month", None, 2.0)):
        for key, what in (("share_error_pts", "share error"),
                          ("entitled_share_error_pts", "share error from entitled shares"),
                          ("share_error_floor_pts",
                           "share error of the max-min fair split itself")):
            se = out.get(which, {}).get("summary", {}).get(key)
            if se:
                ok = (mean_max is None or se["mean"] <= mean_max) and se["worst"] <= worst_max
                print(f"{which} {what}: mean {se['mean']:.2f} pt, worst {se['worst']:.2f} pt "
                      f"(goal: {'' if mean_max is None else f'mean <= {mean_max:g}, '}worst "
                      f"<= {worst_max:g}) "
                      + (("within it" if ok else
                          "over it: a program asked for less than its grant")
                         if key == "share_error_floor_pts" else ("met" if ok else "NOT met")))
    if base or saved is not None:
        a = saved if saved is not None else {k: f.result() for k, f in base.items()}
        b = {k: f.result() for k, f in futures.items()}
        name = "defaults" if saved is None else "baseline"
        if saved is not None:
            print(f"\nthe baseline: {args.baseline}")
        out["compare"] = compare(a, b, runs, seeds, name)
        if args.plot:
            plot(a, b, runs, seeds, sets, args.plot, name)
            print(f"chart: {args.plot}")
    line = json.dumps(out)
    print(line)
    if args.save:
        Path(args.save).write_text(line + "\n")


def load_baseline(path: str, runs: list[str], seeds: list[int]
                  ) -> dict[tuple[str, int], dict[str, Any]]:
    """Each (run, seed)'s figures from a run saved by ``--save`` — or from its printed
    output, whose last line is the same JSON. Every run and seed asked for must be there,
    with every figure, or nothing runs (ValueError saying what is missing)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"--baseline: cannot read {path!r}: {e.strerror}") from None
    data: Any = None
    for candidate in [text, *reversed([ln for ln in text.splitlines()
                                       if ln.startswith("{")])]:
        try:
            data = json.loads(candidate)
            break
        except ValueError:
            continue
    if not isinstance(data, dict) or not isinstance(data.get("seeds"), list):
        raise ValueError(f"--baseline: {path!r} is not the output of policy_seeds.py "
                         "(no JSON line with its seeds)")
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for which in runs:
        run = data.get(which)
        rows = run.get("per_seed") if isinstance(run, dict) else None
        if not isinstance(rows, list):
            raise ValueError(f"--baseline: {path!r} has no {which} run (it has "
                             f"{', '.join(r for r in FIGURES if r in data) or 'none'}); "
                             f"add --runs to match")
        for r in rows:
            if isinstance(r, dict) and isinstance(r.get("seed"), int):
                out[(which, r["seed"])] = r
        missing = [s for s in seeds if (which, s) not in out]
        if missing:
            raise ValueError(f"--baseline: {path!r} lacks seeds {missing} of the {which} run "
                             f"(it has {sorted(s for w, s in out if w == which)})")
        keys = [key for _, key, _, _ in FIGURES[which]]
        for s in seeds:
            absent = [k for k in keys if k not in out[(which, s)]]
            if absent:
                raise ValueError(f"--baseline: {path!r} lacks {', '.join(absent)} for seed {s} "
                                 f"of the {which} run (saved by an older policy_seeds.py?)")
    return out


def sign_test(better: int, worse: int) -> float:
    """Two-sided sign test: how likely a split this uneven (or more) is when each seed is
    as likely to come out better as worse (ties left out)."""
    n, k = better + worse, min(better, worse)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def compare(base: dict[tuple[str, int], dict[str, Any]],
            new: dict[tuple[str, int], dict[str, Any]], runs: list[str], seeds: list[int],
            base_name: str = "defaults") -> dict[str, Any]:
    """The --set policy against the defaults (or a saved ``baseline``), seed by seed: per
    figure with a goal, the mean change and its standard error, on how many seeds it is
    better or worse, a sign test; then the goals missed by each and the seed x goal pairs
    that changed side. Printed and returned (``goals_missed`` keyed by ``base_name``)."""
    print(f"\ncompared with the {base_name}, seed by seed (better: toward the goal's side)")
    out: dict[str, Any] = {}
    missed = {base_name: 0, "policy": 0}
    flipped = {"newly_met": 0, "newly_missed": 0}
    for which in runs:
        for name, key, op, goal in FIGURES[which]:
            if not op:
                continue
            diffs, better, worse = [], 0, 0
            for s in seeds:
                a, b = base[(which, s)][key], new[(which, s)][key]
                ma, mb = meets(a, op, goal), meets(b, op, goal)
                missed[base_name] += ma is False
                missed["policy"] += mb is False
                flipped["newly_met"] += ma is False and mb is True
                flipped["newly_missed"] += ma is True and mb is False
                if a is None or b is None:
                    continue
                d = (b - a) if op == "≥" else (a - b)  # > 0: better
                diffs.append(b - a)
                better += d > 1e-12
                worse += d < -1e-12
            if not diffs:
                continue
            mean = sum(diffs) / len(diffs)
            se = (math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
                            / len(diffs)) if len(diffs) > 1 else 0.0)
            p = sign_test(better, worse)
            out[f"{which}.{key}"] = {"mean_change": mean, "se": se, "better": better,
                                     "worse": worse, "sign_test_p": round(p, 4)}
            print(f"  {which} {name}: {mean:+.4g} on average (± {se:.2g} s.e.); of "
                  f"{len(diffs)} seeds {better} better, {worse} worse; sign test p = {p:.2g}")
    met, lost = flipped["newly_met"], flipped["newly_missed"]
    print(f"  goals missed: {missed[base_name]} with the {base_name}, {missed['policy']} with "
          f"this policy (seed x goal pairs: {met} newly met, {lost} newly missed)")
    out["goals_missed"] = missed
    out["pairs"] = flipped
    return out


def plot(base: dict[tuple[str, int], dict[str, Any]],
         new: dict[tuple[str, int], dict[str, Any]], runs: list[str], seeds: list[int],
         sets: dict[str, Any], path: str, base_name: str = "defaults") -> None:
    """One panel per goal's figure: per seed, the defaults' (or the baseline's) value and
    the policy's joined by a line (green where the policy is better, red where worse), the
    goal dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(which, name, key, op, goal) for which in runs
              for name, key, op, goal in FIGURES[which] if op]
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    label = ", ".join(f"{k}={v}" for k, v in sets.items()) or "this checkout"
    for ax, (which, name, key, op, goal) in zip(axes.flat, panels, strict=False):
        scale = 100.0 if key == "utilisation" else 1.0
        for s in seeds:
            a, b = base[(which, s)][key], new[(which, s)][key]
            if a is None or b is None:
                continue
            good = (b >= a) if op == "≥" else (b <= a)
            ax.plot([s, s], [a * scale, b * scale], color="tab:green" if good else "tab:red",
                    lw=1.5, zorder=1)
            ax.scatter([s], [a * scale], color="0.55", s=18, zorder=2,
                       label=f"the {base_name}" if s == seeds[0] else None)
            ax.scatter([s], [b * scale], color="tab:blue", s=18, zorder=3,
                       label=label if s == seeds[0] else None)
        ax.axhline(goal * scale, color="k", ls="--", lw=1, label="the goal")
        unit = " (%)" if key == "utilisation" else ""
        ax.set_title(f"{'3 days' if which == '3day' else 'the month'}: {name}{unit}, "
                     f"goal {op} {goal * scale:g}", fontsize=10)
        ax.set_xlabel("seed")
        ax.set_xticks(seeds if len(seeds) <= 21 else seeds[:: max(1, len(seeds) // 20)])
        ax.tick_params(labelsize=8)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower right", fontsize=9, frameon=False)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{label} against the {base_name}, seed by seed "
                 "(green: toward the goal, red: away from it)", fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
