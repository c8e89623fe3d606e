"""Small builders for core tests, and an independent capacity checker."""

from __future__ import annotations

from jupyter_gpubudget.core import mig as migtab
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import HOUR, MILLI, SliceRequest, Workload

TWO_PROJECTS = """
accounts:
  lab:
    grant: 200
    children:
      a: {grant: 100, members: [ann]}
      b: {grant: 100, members: [ben]}
"""


def tree(text: str = TWO_PROJECTS):
    return load_budgets(text).accounts


def inventory(nodes: int = 1, gpus: int = 4, model: str = "H100-80GB", mig: tuple[int, ...] = (),
              racks: int = 1, **kw) -> Inventory:
    return Inventory(tuple(make_node(f"n{i}", model, gpus, mig=mig, rack=f"r{i % racks}", **kw)
                           for i in range(nodes)))


def job(wid: str, project: str = "a", gpus: int = 1, at: float = 0.0, *, user: str = "u",
        req: SliceRequest | None = None, min_runtime: float = 0.0, kind: str = "batch",
        resumable: bool = False, limit: float | None = HOUR) -> Workload:
    return Workload(wid, project, user, req or SliceRequest.whole(gpus), at, kind=kind,
                    min_runtime=min_runtime, resumable=resumable, time_limit=limit)


def check_capacity(inv: Inventory, running) -> None:
    """Recompute occupancy from placements alone (not from the core's Cluster) and assert
    nothing is allocated twice or beyond its size."""
    specs = {n.name: n for n in inv.nodes}
    milli: dict[tuple[str, int], int] = {}
    whole: dict[tuple[str, int], int] = {}
    masks: dict[tuple[str, int], int] = {}
    compute: dict[tuple[str, int], int] = {}
    host: dict[str, list[int]] = {}
    for w in running:
        assert w.placement is not None
        seen = set()
        for s in w.placement.slices:
            h = host.setdefault(s.node, [0, 0])
            h[0] += s.cpu_milli
            h[1] += s.memory_mib
            if s.gpu < 0:
                continue
            key = (s.node, s.gpu)
            assert key not in seen, f"{w.id} holds {key} twice"
            seen.add(key)
            gspec = specs[s.node].gpus[s.gpu]
            if s.kind == "mig":
                assert gspec.mig
                p = migtab.profiles_for(gspec.model)[s.profile]
                assert s.mig_start in p.starts
                span = ((1 << p.size) - 1) << s.mig_start
                assert not masks.get(key, 0) & span, f"MIG overlap on {key}"
                masks[key] = masks.get(key, 0) | span
                compute[key] = compute.get(key, 0) + p.compute
                assert compute[key] <= migtab.COMPUTE
            else:
                assert not gspec.mig
                if s.kind == "gpu":
                    whole[key] = whole.get(key, 0) + 1
                milli[key] = milli.get(key, 0) + s.milli
                assert milli[key] <= MILLI, f"{key} over-allocated: {milli[key]}"
                assert whole.get(key, 0) <= 1
                if whole.get(key, 0):
                    assert milli[key] == MILLI
    for name, (cpu, mem) in host.items():
        spec = specs[name]
        assert not spec.cpu_milli or cpu <= spec.cpu_milli
        assert not spec.memory_mib or mem <= spec.memory_mib
