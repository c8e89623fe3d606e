"""`gpubudget simulate`: replay a trace (or the built-in synthetic workload) through the core.

    gpubudget simulate                                   # built-in synthetic trace, no data needed
    gpubudget simulate --trace ../shared/traces/itp/cluster01.csv --budgets examples/budgets-itp.yaml
    gpubudget simulate --trace T --budgets A.yaml --compare B.yaml      # what-if, side by side
    gpubudget simulate --trace openb_pod_list_default.csv --nodes openb_node_list_gpu_node.csv \\
        --placement-repro --seeds 10                     # FGD-paper placement reproduction

Wire-up: ``add_simulate_parser(subparsers)`` adds the sub-command; its handler is
:func:`cmd_simulate` (set as ``func``), returning the exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_simulate_parser(subparsers: Any) -> argparse.ArgumentParser:
    from ..sim.costs import RESTORE_COST_S, SNAPSHOT_COST_S

    p = subparsers.add_parser(
        "simulate", help="replay a workload trace through the scheduler (what-if)",
        description="Replay a trace (native CSV, Microsoft ITP, Alibaba openb) or the built-in "
                    "synthetic workload through the scheduling core with a simulated clock, "
                    "and report waits, delivered share of grants, utilisation, preemptions "
                    "and fragmentation.")
    src = p.add_argument_group("workload")
    src.add_argument("--trace", help="trace file (default: the built-in synthetic workload)")
    src.add_argument("--format", choices=("native", "itp", "openb"),
                     help="trace format (default: detected from the header)")
    src.add_argument("--workloads", type=int, default=2000,
                     help="synthetic: number of workloads (default 2000)")
    src.add_argument("--days", type=float, default=7.0, help="synthetic: span in days (7)")
    src.add_argument("--load", type=float, default=0.85,
                     help="synthetic: offered GPU-hours / capacity (0.85)")
    src.add_argument("--seed", type=int, default=0, help="seed for synthetic data and failures")
    cl = p.add_argument_group("cluster and budgets")
    cl.add_argument("--budgets", help="budgets YAML (default: built-in example budgets)")
    cl.add_argument("--compare", metavar="B.yaml",
                    help="a second budgets YAML: run both and show the difference")
    cl.add_argument("--inventory", action="append", metavar="[NAME=]FILE",
                    help="declared inventory YAML; give it several times as NAME=FILE for "
                    "several named clusters under one budget tree (the report adds each "
                    "cluster's utilisation and shares)")
    cl.add_argument("--nodes", help="openb node list CSV (inventory for openb traces)")
    cl.add_argument("--gpus", type=int,
                    help="cluster size in GPUs when no inventory is given (8 per node)")
    sim = p.add_argument_group("simulation")
    sim.add_argument("--cycle-interval", type=float, default=600.0,
                     help="seconds between full scheduling cycles while work waits (600)")
    sim.add_argument("--snapshot-cost", type=float, default=SNAPSHOT_COST_S,
                     help="seconds to snapshot a preempted interactive session "
                     f"({SNAPSHOT_COST_S:g}, measured by bench/snapshot.py)")
    sim.add_argument("--restore-cost", type=float, default=RESTORE_COST_S,
                     help=f"seconds to restore it ({RESTORE_COST_S:g}, measured likewise)")
    sim.add_argument("--nonresumable", choices=("restart", "drop"), default="restart",
                     help="what a preempted non-resumable job does (restart from scratch)")
    sim.add_argument("--checkpoint-interval", type=float, default=None,
                     help="resumable jobs that declare none checkpoint every this many seconds "
                          "of their run and lose the progress since the last one when "
                          "preempted (default: the policy's, 1800; 0: they lose nothing)")
    sim.add_argument("--restart-overhead", type=float, default=None,
                     help="seconds a resumable job's restart spends reloading (default: the "
                          "policy's, 120)")
    sim.add_argument("--failure-rate", type=float, default=0.0,
                     help="random node failures per node per day (0)")
    sim.add_argument("--horizon", type=float, help="stop after this many simulated hours")
    sim.add_argument("--budget-change", action="append", default=[], metavar="HOURS:FILE",
                     help="switch to another budgets YAML this many simulated hours in "
                          "(repeatable)")
    sim.add_argument("--reservations", metavar="FILE.yaml",
                     help="replay advance reservations (bookings) through the core: the run "
                          "with them and the same run without them; reports the p50/p90 wait "
                          "of the work of projects that hold no booking in both, and each "
                          "booking's GPU-hours used and unused (docs/simulator.md)")
    out = p.add_argument_group("output")
    out.add_argument("--out", default="sim-out", help="directory for plots and JSON (sim-out)")
    out.add_argument("--json", help="write metrics JSON here (default: OUT/metrics.json)")
    out.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    out.add_argument("--report", metavar="FILE",
                     help="also write the usage report for the simulated period, in the "
                          "columns of the service's usage report (`gpubudget report`): CSV "
                          "when FILE ends in .csv, else JSON; with --compare, one per run "
                          "(the second's name gets -b before the suffix)")
    out.add_argument("--quiet", action="store_true", help="no table, no progress bar")
    op = p.add_argument_group("off-peak prices")
    op.add_argument("--off-peak", metavar="FACTOR|policy",
                    help="replay off-peak prices: the run without them and the run with them, "
                         "batch jobs that can wait moved to the windows; reports the share of "
                         "batch GPU-hours that moved there and the windows' utilisation before "
                         "and after. FACTOR: the budgets file's windows at this price (default "
                         "windows: Mon-Fri 20:00-07:00 and weekends, UTC); policy: the budgets "
                         "file's off_peak as it is")
    op.add_argument("--off-peak-share", type=float, default=1.0, metavar="SHARE",
                    help="share of the batch jobs that wait for the windows (1.0: all)")
    rp = p.add_argument_group("openb placement reproduction")
    rp.add_argument("--placement-repro", action="store_true",
                    help="place openb pods one at a time without departures until 130%% of "
                         "capacity is requested (FGD paper); needs --trace pods and --nodes")
    rp.add_argument("--seeds", type=int, default=10, help="seeds for --placement-repro (10)")
    p.set_defaults(func=cmd_simulate)
    return p


def cmd_simulate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..core.yamlnodes import ConfigError

    console = Console(stderr=False)
    if not console.is_terminal:  # piped: tables keep their names whole instead of 80 columns
        console = Console(stderr=False, width=160)
    try:
        if args.placement_repro:
            return _placement_repro(args, console)
        return _simulate(args, console)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _progress_bar(console: Any, total_jobs: int, quiet: bool, label: str):  # type: ignore[no-untyped-def]
    from contextlib import nullcontext

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if quiet or total_jobs < 2000:
        return nullcontext(None)
    return Progress(TextColumn(f"[bold]{label}"), BarColumn(),
                    TextColumn("{task.percentage:>3.0f}% of simulated time"),
                    TimeElapsedColumn(), console=console, transient=True)


def _simulate(args: argparse.Namespace, console: Any) -> int:
    from ..sim import report
    from ..sim.engine import BudgetChange, SimConfig
    from ..sim.run import prepare, read_budgets, run_one
    from ..sim.synthetic import SyntheticSpec

    spec = SyntheticSpec(workloads=args.workloads, days=args.days, load=args.load,
                         seed=args.seed, gpus=args.gpus or 64)
    setup = prepare(args.trace, args.budgets, fmt=args.format, inventory_path=args.inventory,
                    nodes_path=args.nodes, gpus=args.gpus, synthetic=spec)
    changes = []
    for spec_text in args.budget_change:
        at, sep, path = spec_text.partition(":")
        try:
            hours = float(at)
        except ValueError:
            hours = -1.0
        if not sep or hours < 0 or not path:
            print(f"error: --budget-change expects HOURS:FILE, got {spec_text!r}",
                  file=sys.stderr)
            return 2
        changes.append(BudgetChange(hours * 3600, read_budgets(path)[0].accounts))
    cfg = SimConfig(cycle_interval=args.cycle_interval, snapshot_cost=args.snapshot_cost,
                    restore_cost=args.restore_cost, nonresumable=args.nonresumable,
                    failure_rate=args.failure_rate, seed=args.seed, budget_changes=changes,
                    checkpoint_interval=args.checkpoint_interval,
                    restart_overhead=args.restart_overhead,
                    horizon=args.horizon * 3600 if args.horizon else None)
    booked = args.reservations or setup.trace.bookings
    if booked and (args.off_peak is not None or args.compare):
        what = "--reservations" if args.reservations else "a trace with reservation rows"
        print(f"error: {what} runs on its own (not with --off-peak or --compare)",
              file=sys.stderr)
        return 2
    if args.off_peak is not None:
        return _off_peak(args, setup, cfg, console)
    if booked:
        return _reservations(args, setup, cfg, console)
    runs = [(setup.budgets_name, setup.budgets)]
    if args.compare:
        b2, name2 = read_budgets(args.compare)
        if name2 == setup.budgets_name:
            name2 += " (B)"
        runs.append((name2, b2))
    if not args.quiet:
        console.print(f"[bold]{setup.trace.source}[/]: {len(setup.trace)} workloads on "
                      f"{setup.inventory.gpu_count} GPUs ({len(setup.inventory.nodes)} nodes, "
                      f"{setup.inventory.source} inventory)")
        _warn_unplaceable(setup, console)
    outdir = Path(args.out)
    results = []
    for name, budgets in runs:
        with _progress_bar(console, len(setup.trace), args.quiet, name) as prog:
            cb = None
            if prog is not None:
                task = prog.add_task(name, total=1.0)

                def cb(done: float, total: float, _t: Any = task, _p: Any = prog) -> None:
                    _p.update(_t, completed=min(1.0, done / total) if total else 1.0)
            res, m = run_one(setup, budgets, cfg, cb)
        m["budgets"] = name
        results.append((name, res, m))
        if not args.quiet:
            console.rule(f"budgets: {name}")
            report.print_report(m, console)
    outdir.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any]
    if len(results) == 1:
        payload = results[0][2]
    else:
        from ..sim import metrics

        payload = {"a": results[0][2], "b": results[1][2],
                   "diff": metrics.compare(results[0][2], results[1][2])}
        if not args.quiet:
            console.print(report.compare_table(results[0][2], results[1][2], results[0][0],
                                               results[1][0]))
    json_path = Path(args.json) if args.json else outdir / "metrics.json"
    report.write_json(payload, json_path)
    written = [json_path]
    if args.report:
        written += _write_reports(args.report, [res for _, res, _ in results])
    if not args.no_plots:
        for name, res, m in results:
            label = name if len(results) > 1 else ""
            written += report.write_plots(res, m, outdir, label=_safe(label))
    if not args.quiet:
        console.print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _write_reports(target: str, results: list[Any]) -> list[Path]:
    """The usage report of each run (``sim/usage.py``) as CSV or JSON."""
    from ..service.audit import safe_cell
    from ..sim import usage
    from ..usage_report import csv_text

    path = Path(target)
    out = []
    for k, res in enumerate(results):
        p = path if k == 0 else path.with_name(f"{path.stem}-b{path.suffix}")
        rep = usage.report(res)
        if p.suffix.lower() == ".csv":
            p.write_text(csv_text(rep, safe_cell), encoding="utf-8")
        else:
            p.write_text(json.dumps(rep, indent=2) + "\n", encoding="utf-8")
        out.append(p)
    return out


def _off_peak(args: argparse.Namespace, setup: Any, cfg: Any, console: Any) -> int:
    """``--off-peak``: both runs (sim/offpeak.py), a table, and the figures as JSON."""
    from ..sim import report
    from ..sim.offpeak import replay

    factor: float | None = None
    if args.off_peak != "policy":
        try:
            factor = float(args.off_peak)
        except ValueError:
            factor = -1.0
        if not 0 <= factor < 1:
            print(f"error: --off-peak expects a price factor from 0 up to 1 (not included) or "
                  f"'policy', got {args.off_peak!r}", file=sys.stderr)
            return 2
    if not 0 <= args.off_peak_share <= 1:
        print("error: --off-peak-share expects a share from 0 to 1", file=sys.stderr)
        return 2
    try:
        out = replay(setup.trace, setup.budgets, setup.inventory, cfg, factor,
                     args.off_peak_share)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        from rich.table import Table

        op = out["off_peak"]
        t = Table(title=f"off-peak at {op['factor']:g}× ({', '.join(op['windows'])}, "
                        f"{op['timezone']}); {out['jobs_moved']} batch jobs waited for a "
                        f"window (median {out['jobs_moved_wait_h_median']:g} h)")
        t.add_column("")
        t.add_column("before", justify="right")
        t.add_column("after", justify="right")
        for label, key, pct in (("batch GPU-hours in the windows", "batch_in_window_share", True),
                                ("utilisation in the windows", "window_utilisation", True),
                                ("utilisation outside them", "outside_utilisation", True),
                                ("batch GPU-hours", "batch_gpu_hours", False)):
            b, a = out["before"][key], out["after"][key]
            t.add_row(label, f"{b:.1%}" if pct else f"{b:,.0f}", f"{a:.1%}" if pct else f"{a:,.0f}")
        console.print(t)
        console.print(f"share of batch GPU-hours that moved into the windows: "
                      f"{out['moved_share']:+.1%}")
    json_path = Path(args.json) if args.json else Path(args.out) / "off-peak.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    report.write_json(out, json_path)
    return 0


def _reservations(args: argparse.Namespace, setup: Any, cfg: Any, console: Any) -> int:
    """``--reservations`` (or a trace's reservation rows, or both): the run with the
    bookings and without, what they cost the others (sim/bookings.py), a table, and the
    figures in the metrics JSON."""
    from dataclasses import replace

    from ..core.yamlnodes import ConfigError
    from ..sim import report
    from ..sim.bookings import cost_to_others, read_bookings
    from ..sim.run import run_one

    specs = setup.trace.bookings_from_start()
    if args.reservations:  # (a bad file: exit 2 naming field and line)
        from_file = read_bookings(args.reservations)
        ids = {s.id for s in specs}
        for s in from_file:
            if s.id in ids:
                raise ConfigError(f"a second reservation {s.id!r} (the trace has one)",
                                  f"reservations[{s.id}].id", s.line or None, s.source)
        specs = [*specs, *from_file]
    res, m = run_one(setup, setup.budgets, replace(cfg, bookings=specs), None)
    plain, _ = run_one(setup, setup.budgets, cfg, None)
    rep = cost_to_others(res, plain, res.booked.bookings, res.booked)
    m["budgets"] = setup.budgets_name
    m["reservations"] = rep
    if not args.quiet:
        from rich.table import Table

        report.print_report(m, console)

        def h(s: float | None) -> str:
            return "-" if s is None else f"{s / 3600:.2f} h"

        t = Table(title=f"reservations: what they cost the others ({rep['others_jobs']} "
                        "jobs of projects without a booking)")
        t.add_column("")
        t.add_column("without", justify="right")
        t.add_column("with", justify="right")
        for label, key in (("wait p50", "others_wait_p50_s"), ("wait p90", "others_wait_p90_s")):
            t.add_row(label, h(rep[key]["without"]), h(rep[key]["with"]))
        console.print(t)
        b = Table(title="reservations: booked GPU-hours")
        for col in ("booking", "project", "GPUs", "booked", "used", "unused"):
            b.add_column(col, justify="left" if col in ("booking", "project") else "right")
        for r in rep["bookings"]:
            b.add_row(r["id"], r["project"], str(r["gpus"]), f"{r['booked_gpu_hours']:.2f}",
                      f"{r['used_gpu_hours']:.2f}", f"{r['unused_gpu_hours']:.2f}")
        console.print(b)
    json_path = Path(args.json) if args.json else Path(args.out) / "metrics.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    report.write_json(m, json_path)
    return 0


def _warn_unplaceable(setup: Any, console: Any) -> None:
    """Say so when some requests can never fit the inventory (they will never start)."""
    from ..sim.engine import fits_somewhere

    seen: dict[object, bool] = {}
    bad = 0
    for j in setup.trace.jobs:
        key = j.request
        if key not in seen:
            seen[key] = fits_somewhere(setup.inventory, j)
        bad += not seen[key]
    if bad:
        console.print(f"[yellow]warning:[/] {bad} workloads ask for more than any placement on "
                      "this inventory offers; they will never start (see --gpus / --inventory)")


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)


def _placement_repro(args: argparse.Namespace, console: Any) -> int:
    from ..sim import openb
    from ..sim.traces import load_openb_nodes, load_openb_pods

    if not args.trace or not args.nodes:
        print("error: --placement-repro needs --trace (openb pod list) and --nodes "
              "(openb node list)", file=sys.stderr)
        return 2
    pods = load_openb_pods(args.trace)
    nodes = load_openb_nodes(args.nodes)
    runs = openb.reproduce(nodes, pods, range(args.seeds))
    summary = openb.summarise(runs)
    if not args.quiet:
        from rich.table import Table

        t = Table(title=f"openb placement at 130% arrived, {args.seeds} seeds")
        for c in ("policy", "allocation mean", "std", "published"):
            t.add_column(c)
        pub = {"bestfit": "BestFit 93.08 ± 0.13", "default": "FGD 95.39 ± 0.08"}
        for pol, s in summary.items():
            t.add_row(pol, f"{s['mean']:.2f}%", f"{s['std']:.2f}", pub.get(pol, ""))
        console.print(t)
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    path = Path(args.json) if args.json else outdir / "openb_placement.json"
    path.write_text(json.dumps({"summary": summary,
                                "runs": {k: [r.to_dict() for r in v] for k, v in runs.items()}},
                               indent=2) + "\n")
    return 0
