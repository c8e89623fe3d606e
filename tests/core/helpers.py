"""Small builders for core tests, and an independent capacity checker."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from jupyter_gpubudget.core import mig as migtab
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import HOUR, MILLI, SliceRequest, Workload

#: running under mutmut (``make mutation``): see tests/core/conftest.py
MUTATION = "MUTANT_UNDER_TEST" in os.environ


def prop_settings(max_examples: int, mutation_examples: int | None = None) -> settings:
    """Hypothesis settings of a core property: ``max_examples`` random examples in an
    ordinary run; under mutmut ``mutation_examples`` (default a quarter, at least 10),
    derandomized and without the example database, so that every mutant meets the same
    examples and a run's verdicts can be reproduced. ``GPUBUDGET_PROP_SCALE=N`` runs N times
    the examples (a search for rare counterexamples: the scheduler's properties found five
    bugs only at 30× and more)."""
    common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                        HealthCheck.data_too_large,
                                                        HealthCheck.filter_too_much])
    if MUTATION:
        n = mutation_examples if mutation_examples is not None else max(10, max_examples // 4)
        return settings(max_examples=n, derandomize=True, database=None, **common)
    scale = max(1, int(os.environ.get("GPUBUDGET_PROP_SCALE", "1") or "1"))
    return settings(max_examples=max_examples * scale, **common)


TWO_PROJECTS = """
accounts:
  lab:
    grant: 200
    children:
      a: {grant: 100, members: [ann]}
      b: {grant: 100, members: [ben]}
"""


#: two programs, three projects (p, q under prog1; r under prog2); grants to format in
THREE_PROJECTS = """
accounts:
  prog1:
    grant: {g1}
    children:
      p: {{grant: {gp}}}
      q: {{grant: {gq}}}
  prog2:
    grant: {g2}
    children:
      r: {{grant: {gr}}}
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


# ---------------------------------------------------------------- an independent recount


class Recount:
    """Occupancy recomputed from placements alone, by rules restated from docs/core.md
    (semantics 1), never through the core's Cluster: which GPUs are held whole, MPS milli and
    GPU memory per GPU, MIG memory slots and compute slices per GPU, host CPU and memory per
    node."""

    def __init__(self, inv: Inventory) -> None:
        self.inv = inv
        self.specs = {n.name: n for n in inv.nodes}
        self.whole: dict[tuple[str, int], str] = {}
        self.milli: dict[tuple[str, int], int] = {}
        self.mem: dict[tuple[str, int], int] = {}
        self.mask: dict[tuple[str, int], int] = {}
        self.compute: dict[tuple[str, int], int] = {}
        self.cpu: dict[str, int] = {}
        self.host_mem: dict[str, int] = {}
        self.holders: dict[tuple[str, int], set[str]] = {}

    def problem(self, wid: str, slices) -> str | None:  # noqa: C901 - a plain restatement
        """Why these slices (one placement) may not all be added now, or None."""
        trial = Recount(self.inv)
        for k, v in vars(self).items():
            if isinstance(v, dict) and k != "specs":
                setattr(trial, k, {kk: (set(vv) if isinstance(vv, set) else vv)
                                   for kk, vv in v.items()})
        for s in slices:
            why = trial._add_one(wid, s)
            if why:
                return why
        return None

    def _add_one(self, wid: str, s) -> str | None:
        spec = self.specs.get(s.node)
        if spec is None:
            return "unknown node"
        cpu = self.cpu.get(s.node, 0) + s.cpu_milli
        mem = self.host_mem.get(s.node, 0) + s.memory_mib
        if (spec.cpu_milli and cpu > spec.cpu_milli) or (spec.memory_mib
                                                         and mem > spec.memory_mib):
            return "host"
        if s.gpu >= len(spec.gpus):
            return "no such GPU"
        self.cpu[s.node], self.host_mem[s.node] = cpu, mem
        if s.gpu < 0:
            return None
        key = (s.node, s.gpu)
        if wid in self.holders.get(key, set()):
            return "held twice"
        g = spec.gpus[s.gpu]
        if s.kind == "mig":
            if not g.mig:
                return "not MIG"
            table = migtab.profiles_for(g.model)
            if s.profile not in table:
                return "no such profile"
            p = table[s.profile]
            if g.mig_layout is not None and (s.profile, s.mig_start) not in g.mig_layout:
                return "not in the layout"
            if s.mig_start not in p.starts:
                return "bad start"
            span = ((1 << p.size) - 1) << s.mig_start
            if self.mask.get(key, 0) & span:
                return "overlap"
            if self.compute.get(key, 0) + p.compute > migtab.COMPUTE:
                return "compute"
            self.mask[key] = self.mask.get(key, 0) | span
            self.compute[key] = self.compute.get(key, 0) + p.compute
        elif g.mig:
            return "MIG GPU takes MIG instances only"
        elif s.kind == "gpu":
            if key in self.whole or self.milli.get(key, 0):
                return "not free"
            self.whole[key] = wid
            self.milli[key] = MILLI
        else:
            if key in self.whole or s.milli <= 0 or self.milli.get(key, 0) + s.milli > MILLI:
                return "milli"
            if g.memory_mib and self.mem.get(key, 0) + s.gpu_memory_mib > g.memory_mib:
                return "GPU memory"
            self.milli[key] = self.milli.get(key, 0) + s.milli
            self.mem[key] = self.mem.get(key, 0) + s.gpu_memory_mib
        self.holders.setdefault(key, set()).add(wid)
        return None

    def add(self, wid: str, slices) -> None:
        why = self.problem(wid, slices)
        assert why is None, why
        for s in slices:
            assert self._add_one(wid, s) is None

    @classmethod
    def of(cls, inv: Inventory, allocations) -> Recount:
        """The recount of ``{workload id: placement}``."""
        r = cls(inv)
        for wid, p in allocations.items():
            r.add(wid, p.slices)
        return r

    def free_whole(self, node: str) -> set[int]:
        return {g.index for g in self.specs[node].gpus
                if not g.mig and (node, g.index) not in self.whole
                and not self.milli.get((node, g.index), 0)}


def assert_cluster_matches(cluster, inv: Inventory, allocations=None) -> None:
    """The core's Cluster agrees with a recount from its placements: every GPU's and node's
    occupancy, the totals, and every look-up index (whole-GPU buckets, shared GPUs, MIG
    occupancy classes) as if rebuilt from scratch."""
    allocations = cluster.allocations if allocations is None else allocations
    assert cluster.allocations == allocations
    r = Recount.of(inv, allocations)
    used = 0
    for n in cluster.nodes:
        spec = r.specs[n.name]
        assert (n.cpu_used, n.mem_used) == (r.cpu.get(n.name, 0), r.host_mem.get(n.name, 0))
        assert set(n.free_whole) == r.free_whole(n.name), n.name
        for g in n.gpus:
            key = (n.name, g.index)
            assert g.mig == spec.gpus[g.index].mig
            assert g.whole == (key in r.whole), key
            assert g.used_milli == (0 if g.mig else r.milli.get(key, 0)), key
            assert g.mem_used == r.mem.get(key, 0), key
            assert (g.mask, g.compute_used) == (r.mask.get(key, 0), r.compute.get(key, 0))
            assert set(g.tenants) == r.holders.get(key, set()), key
            used += sum(g.tenants.values())
    assert cluster.used_milli == used == sum(
        s.milli for p in allocations.values() for s in p.slices if s.gpu >= 0)
    # indexes: healthy nodes only
    healthy = [n for n in cluster.nodes if n.healthy]
    want_buckets: dict[int, set[int]] = {}
    for n in healthy:
        want_buckets.setdefault(len(r.free_whole(n.name)), set()).add(n.idx)
    got_buckets = {k: set(b) for k, b in enumerate(cluster.whole_buckets) if b}
    assert got_buckets == want_buckets
    want_shared: dict[int, set] = {}
    want_mig: dict[tuple, dict[tuple[int, int], set]] = {}
    for n in healthy:
        for g in n.gpus:
            key = (n.name, g.index)
            if g.mig:
                occ = (r.mask.get(key, 0), r.compute.get(key, 0))
                want_mig.setdefault((g.model, g.layout), {}).setdefault(occ, set()).add(
                    (n.idx, g.index))
            elif 0 < r.milli.get(key, 0) < MILLI and key not in r.whole:
                want_shared.setdefault(r.milli[key], set()).add((n.idx, g.index))
    assert {u: set(b) for u, b in cluster.shared.items()} == want_shared
    got_mig = {cls: {occ: set(b) for occ, b in by.items()}
               for cls, by in cluster.mig_index.items() if by}
    assert got_mig == want_mig
    for by in cluster.mig_index.values():
        assert all(by.values()), "an empty MIG occupancy bucket is kept"
