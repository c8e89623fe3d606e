"""Putting a simulation together: trace + budgets + inventory → result and metrics.

Used by ``gpubudget simulate`` and the benchmarks; no printing here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.accounts import Budgets, load_budgets
from ..core.inventory import Inventory, load_inventory, make_node
from ..core.model import gpu_fraction
from . import metrics
from .engine import SimConfig, SimResult, simulate
from .synthetic import SyntheticSpec, generate, synthetic_inventory
from .traces import Trace, TraceError, assign_projects, load_openb_nodes, load_trace

#: Budgets used when none are given (the built-in demo): two programs, five projects.
DEFAULT_BUDGETS = """\
window: 7d
policy:
  min_runtime_cap: {interactive: 8h, batch: 2d, debug: 1h}
accounts:
  physics:
    grant: 5000
    children:
      lattice: {grant: 3000}
      astro:   {grant: 2000}
  biology:
    grant: 3000
    children:
      genomics: {grant: 2000}
      imaging:  {grant: 1000}
  ml:
    grant: 2000
    children:
      foundation: {grant: 2000}
"""


def read_budgets(path: str | Path | None) -> tuple[Budgets, str]:
    if path is None:
        return load_budgets(DEFAULT_BUDGETS, "<built-in budgets>"), "built-in"
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TraceError(f"cannot read budgets: {e.strerror}", "", None, str(p)) from None
    return load_budgets(text, str(p)), p.stem


def default_gpus(trace: Trace, target_load: float = 0.8) -> int:
    """A cluster size for traces that come without one: whole 8-GPU nodes, big enough for the
    largest request and for an offered load of about ``target_load``."""
    work = 0.0
    for j in trace.jobs:
        work += gpu_fraction(j.request) * j.duration
    avg = work / max(trace.span, 1.0)
    need = max(trace.max_gpus, avg / target_load, 8)
    return 8 * math.ceil(need / 8)


def gpu_inventory(gpus: int, model: str = "H100-80GB", mig_nodes: int = 0) -> Inventory:
    """``gpus`` GPUs of one model, 8 per node, 4 nodes per rack; the last ``mig_nodes`` nodes
    have every GPU in MIG mode."""
    n = math.ceil(gpus / 8)
    nodes = []
    for i in range(n):
        count = min(8, gpus - 8 * i)
        mig = tuple(range(count)) if i >= n - mig_nodes else ()
        nodes.append(make_node(f"n{i:04d}", model, count, mig=mig, rack=f"r{i // 4:03d}"))
    return Inventory(tuple(nodes), "declared")


@dataclass(slots=True)
class Setup:
    trace: Trace
    inventory: Inventory
    budgets: Budgets
    budgets_name: str


def cluster_inventories(specs: list[str]) -> Inventory:
    """Several named clusters from ``NAME=FILE`` declared inventories (one budget tree over
    all of them): each file's nodes are put in cluster NAME."""
    from jupyter_gpubudget.core.inventory import InventoryError, merge_clusters

    parts: dict[str, Inventory] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise InventoryError(f"{spec!r}: with several inventories, give each as NAME=FILE",
                                 source="--inventory")
        if name in parts:
            raise InventoryError(f"cluster {name!r} is given twice", source="--inventory")
        p = Path(path)
        parts[name] = load_inventory(p.read_text(encoding="utf-8"), str(p))
    return merge_clusters(parts)


def prepare(trace_path: str | None, budgets_path: str | None, *, fmt: str | None = None,
            inventory_path: str | list[str] | None = None, nodes_path: str | None = None,
            gpus: int | None = None, synthetic: SyntheticSpec | None = None) -> Setup:
    budgets, bname = read_budgets(budgets_path)
    inv: Inventory | None = None
    paths = [inventory_path] if isinstance(inventory_path, str) else list(inventory_path or [])
    if len(paths) == 1 and "=" not in paths[0]:
        p = Path(paths[0])
        inv = load_inventory(p.read_text(encoding="utf-8"), str(p))
    elif paths:
        inv = cluster_inventories(paths)
    elif nodes_path:
        from .openb import openb_inventory

        inv = openb_inventory(load_openb_nodes(nodes_path))
    if trace_path is None:
        spec = synthetic or SyntheticSpec()
        if gpus:
            spec = SyntheticSpec(**{**_asdict(spec), "gpus": gpus})
        projects = sorted(budgets.accounts.projects())
        grants = budgets.accounts.effective_grants(1.0)
        trace = generate(spec, projects, [grants.get(p, 0.0) for p in projects])
        if inv is None:
            inv = synthetic_inventory(spec.gpus, spec.mig_node_share)
    else:
        trace = load_trace(trace_path, fmt)
        trace = assign_projects(trace, budgets.accounts)
        if inv is None:
            size = gpus or default_gpus(trace)
            has_mig = any(j.request.kind == "mig" for j in trace.jobs)
            mig_nodes = max(1, round(size / 8 / 8)) if has_mig else 0
            if has_mig and not gpus:
                size += 8 * mig_nodes
            inv = gpu_inventory(size, mig_nodes=mig_nodes)
    return Setup(trace, inv, budgets, bname)


def _asdict(spec: SyntheticSpec) -> dict[str, Any]:
    return {f: getattr(spec, f) for f in spec.__slots__}  # type: ignore[attr-defined]


def run_one(setup: Setup, budgets: Budgets, config: SimConfig,
            progress: Callable[[float, float], None] | None = None
            ) -> tuple[SimResult, dict[str, Any]]:
    res = simulate(setup.trace, budgets.accounts, setup.inventory, budgets.policy, config,
                   progress)
    return res, metrics.compute(res)
