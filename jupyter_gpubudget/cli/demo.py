"""A scripted morning on the demo cluster, scheduled by the real core and shown as it happens.

Two programs share 16 H100 GPUs. Genomics has already used most of its grant this week, so its
big training run is *unbacked*: it runs on idle GPUs, unprotected, and is the first to go when
backed work arrives. Notebook sessions land on MIG slices and MPS shares; a 12-GPU gang that
cannot fit gets a reservation, and a short debug job backfills in front of it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..core.accounts import load_budgets
from ..core.inventory import load_inventory
from ..core.model import (
    HOUR,
    ChargeInterval,
    Drain,
    Preempt,
    Reserve,
    SliceRequest,
    Start,
    Workload,
)
from ..core.scheduler import Scheduler

MIN = 60.0


@dataclass(frozen=True)
class Arrival:
    at_min: float
    workload: Workload
    runs_min: float  # how long it really runs once started


def _w(wid: str, project: str, user: str, req: SliceRequest, kind: str, min_runtime_h: float,
       limit_h: float | None, resumable: bool = False) -> Workload:
    return Workload(wid, project, user, req, 0.0, kind=kind, min_runtime=min_runtime_h * HOUR,
                    resumable=resumable, time_limit=limit_h * HOUR if limit_h else None)


SCRIPT = [
    Arrival(0, _w("genomics-train", "genomics", "erin", SliceRequest.whole(8), "batch", 2, 12,
                  resumable=True), 600),
    Arrival(0, _w("qcd-sweep-1", "lattice-qcd", "bob", SliceRequest.whole(4), "batch", 1, 3), 150),
    Arrival(5, _w("astro-notebook", "astro", "carol", SliceRequest.mig("1g.10gb"), "interactive",
                  8, None), 400),
    Arrival(6, _w("proteins-notebook", "proteins", "frank", SliceRequest.mig("3g.40gb"),
                  "interactive", 4, None), 300),
    Arrival(8, _w("genomics-debug", "genomics", "dana", SliceRequest.mps(500), "debug", 0.25, 1),
            30),
    Arrival(20, _w("qcd-sweep-2", "lattice-qcd", "alice", SliceRequest.whole(4), "batch", 1, 3),
            170),
    Arrival(30, _w("qcd-gang", "lattice-qcd", "bob", SliceRequest.whole(12), "batch", 2, 6), 240),
    Arrival(35, _w("astro-debug", "astro", "carol", SliceRequest.whole(1), "debug", 0.25, 0.5),
            20),
]


def example_path(name: str) -> Path:
    """Examples ship inside the repo's examples/ folder; fall back to the package data."""
    repo = Path(__file__).resolve().parents[2] / "examples" / name
    if repo.exists():
        return repo
    return Path(str(resources.files("jupyter_gpubudget") / "examples" / name))


def run_demo(console: Console | None = None, hours: float = 6.0) -> Scheduler:
    console = console or Console()
    budgets = load_budgets(example_path("budgets-demo.yaml").read_text(), "budgets-demo.yaml")
    inventory = load_inventory(example_path("inventory-demo.yaml").read_text(),
                               "inventory-demo.yaml")
    sched = Scheduler(budgets.accounts, inventory, budgets.policy)
    _shown_reservations.clear()
    _last_seen.clear()
    t0 = 7 * 24 * HOUR
    # earlier this week: genomics ran hot and is over its grant
    sched.meter.add(ChargeInterval("history", "genomics", "erin", 8000, t0 - 60 * HOUR, t0))
    sched.meter.add(ChargeInterval("history2", "lattice-qcd", "bob", 4000, t0 - 30 * HOUR, t0))
    console.rule("[bold]jupyter-gpubudget — scheduling demo on a declared inventory")
    console.print(f"inventory: {len(inventory.nodes)} nodes, {inventory.gpu_count} GPUs "
                  f"(declared in inventory-demo.yaml; no NVIDIA driver needed)")
    _standings(console, sched, t0, "standings at 07:00")

    runs = {a.workload.id: a.runs_min * MIN for a in SCRIPT}
    ends: dict[str, float] = {}
    events = sorted({a.at_min for a in SCRIPT} | {m for m in range(0, int(hours * 60) + 1, 15)})
    arrivals = {m: [a for a in SCRIPT if a.at_min == m] for m in events}
    now = t0
    for m in events:
        # completions due before this moment
        for wid, end in sorted(ends.items(), key=lambda kv: kv[1]):
            if end <= t0 + m * MIN and wid in sched.running:
                del ends[wid]
                _show(console, end, [f"[green]done[/]  {wid}"])
                _apply(console, sched, end, sched.finish(wid, end), runs, ends)
        now = t0 + m * MIN
        for a in arrivals.get(m, []):
            w = a.workload
            w = Workload(w.id, w.project, w.user, w.request, now, w.kind, w.min_runtime,
                         w.resumable, w.time_limit)
            _show(console, now, [f"[cyan]submit[/] {w.id} ({w.project}, {_req(w.request)}, "
                                 f"{w.kind}, protected {w.min_runtime / HOUR:g} h asked)"])
            _apply(console, sched, now, sched.submit(w, now), runs, ends)
        if m % 15 == 0:
            _apply(console, sched, now, sched.cycle(now), runs, ends)
    _gpu_map(console, sched, now)
    _standings(console, sched, now, f"standings at {_clock(now)}")
    return sched


_shown_reservations: dict[str, float] = {}


def _apply(console: Console, sched: Scheduler, now: float, decisions: list, runs: dict,
           ends: dict) -> None:
    lines = []
    requeue = []
    for d in decisions:
        if isinstance(d, Start):
            w = sched.running[d.workload]
            ends[d.workload] = now + runs[d.workload]
            prot = (f"protected until {_clock(d.protected_until)}" if d.protected_until
                    and d.protected_until > now else "not protected")
            lines.append(f"[bold green]start[/] {d.workload} on {_where(d.placement)} — "
                         f"{'backed' if d.backed else '[yellow]unbacked[/]'}, {prot}")
        elif isinstance(d, Preempt):
            end = ends.pop(d.workload, None)
            victim = _last_seen.get(d.workload)
            lines.append(f"[bold red]preempt[/] {d.workload}: {d.reason}")
            if victim is not None and victim.resumable and end is not None:
                runs[d.workload] = max(end - now, MIN)  # the remaining work
                requeue.append(victim)
        elif isinstance(d, Reserve):
            if _shown_reservations.get(d.workload) == d.at:
                continue
            _shown_reservations[d.workload] = d.at
            lines.append(f"[magenta]reserve[/] {d.workload}: {len(d.placement.slices)} GPUs "
                         f"from {_clock(d.at)}; shorter work may backfill until then")
        elif isinstance(d, Drain):
            lines.append(f"drain {d.node}")
    for wid, w in sched.running.items():
        _last_seen[wid] = w
    if lines:
        _show(console, now, lines)
    for w in requeue:  # resumable work goes back in the queue with what it has left
        _show(console, now, [f"[cyan]requeue[/] {w.id} (resumable; "
                             f"{runs[w.id] / MIN:.0f} min of work left)"])
        again = Workload(w.id, w.project, w.user, w.request, now, w.kind, w.min_runtime,
                         w.resumable, w.time_limit)
        _apply(console, sched, now, sched.submit(again, now), runs, ends)


_last_seen: dict[str, Workload] = {}


def _show(console: Console, now: float, lines: list[str]) -> None:
    for line in lines:
        console.print(f"[dim]{_clock(now)}[/]  {line}")


def _clock(t: float | None) -> str:
    if t is None:
        return "--:--"
    minutes = int(round((t % (24 * HOUR)) / MIN)) + 7 * 60
    return f"{(minutes // 60) % 24:02d}:{minutes % 60:02d}"


def _req(r: SliceRequest) -> str:
    if r.kind == "gpu":
        return f"{r.gpus} GPU" + ("s" if r.gpus > 1 else "")
    if r.kind == "mig":
        return f"MIG {r.profile}"
    if r.kind == "mps":
        return f"MPS {r.milli / 10:g}%"
    return "CPU only"


def _where(p) -> str:
    parts = []
    for s in p.slices:
        if s.kind == "mig":
            parts.append(f"{s.node}/GPU{s.gpu} MIG {s.profile}@{s.mig_start}")
        elif s.kind == "mps":
            parts.append(f"{s.node}/GPU{s.gpu} MPS {s.milli / 10:g}%")
        else:
            parts.append(f"{s.node}/GPU{s.gpu}")
    if len(parts) > 3:
        return f"{parts[0]} … {parts[-1]} ({len(parts)} GPUs)"
    return ", ".join(parts)


def _gpu_map(console: Console, sched: Scheduler, now: float) -> None:
    table = Table(title=f"GPU map at {_clock(now)}")
    table.add_column("node")
    for i in range(8):
        table.add_column(f"GPU{i}")
    for node in sched.cluster.nodes:
        cells = []
        for g in node.gpus:
            names = ", ".join(sorted(g.tenants)) or "[dim]free[/]"
            if g.mig:
                names = f"[blue]MIG[/] {names}"
            cells.append(names)
        table.add_row(node.name, *cells)
    console.print(table)


def _standings(console: Console, sched: Scheduler, now: float, title: str) -> None:
    sched._standings(now)
    st = sched._st
    assert st is not None
    table = Table(title=title)
    for col in ("account", "grant (GPU-h/7d)", "used (GPU-h)", "standing", "running", "pending"):
        table.add_column(col, justify="right" if col != "account" else "left")
    for name in sched.accounts.accounts:
        depth = len(sched.accounts.path(name)) - 1
        running = sum(1 for w in sched.running.values() if name in sched.accounts.path(w.project))
        pending = sum(1 for w in sched.pending.values()
                      if w.project in sched.accounts and name in sched.accounts.path(w.project))
        s = st.standing[name]
        table.add_row("  " * depth + name, f"{st.grant.get(name, 0):.0f}", f"{st.usage[name]:.1f}",
                      "∞" if s == float("inf") else f"{s:.2f}", str(running), str(pending))
    console.print(table)


def add_demo_parser(sub: Any) -> argparse.ArgumentParser:
    d = sub.add_parser("demo", help="schedule a scripted morning on the demo cluster")
    d.add_argument("--hours", type=float, default=6.0, help="simulated hours to show")
    d.set_defaults(func=cmd_demo)
    return d


def cmd_demo(args: argparse.Namespace) -> int:
    run_demo(hours=args.hours)
    return 0
