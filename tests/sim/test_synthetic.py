"""The seeded synthetic workload."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.core.capacity import Cluster
from jupyter_gpubudget.core.placement import place
from jupyter_gpubudget.sim.synthetic import (
    SyntheticSpec,
    generate,
    offered_load,
    synthetic_inventory,
)


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    spec = SyntheticSpec(workloads=500, days=3, gpus=64, seed=9)
    a, b = generate(spec, ["x", "y"]), generate(spec, ["x", "y"])
    assert a.jobs == b.jobs
    c = generate(SyntheticSpec(workloads=500, days=3, gpus=64, seed=10), ["x", "y"])
    assert c.jobs != a.jobs


def test_mix_of_kinds_and_load() -> None:
    spec = SyntheticSpec(workloads=2000, days=7, gpus=128, seed=1, load=0.8)
    t = generate(spec, ["x", "y", "z"], [2, 1, 1])
    kinds = {k: sum(j.kind == k for j in t.jobs) for k in ("interactive", "debug", "batch")}
    assert kinds == {"interactive": 900, "debug": 700, "batch": 400}
    assert len({j.id for j in t.jobs}) == 2000
    assert offered_load(t, 128) == pytest.approx(0.8, abs=0.15)
    share_x = sum(j.project == "x" for j in t.jobs) / len(t.jobs)
    assert 0.4 < share_x < 0.6
    # interactive sessions of one user never overlap (think-time gaps)
    by_user: dict[str, list[tuple[float, float]]] = {}
    for j in t.jobs:
        if j.kind == "interactive":
            by_user.setdefault(j.user, []).append((j.submit, j.submit + j.duration))
    overlaps = sum(1 for s in by_user.values() for a, b in zip(s, s[1:], strict=False) if b[0] < a[1])
    assert overlaps <= len(by_user)  # only where a chain wrapped around the span


def test_every_request_fits_the_inventory() -> None:
    spec = SyntheticSpec(workloads=400, days=2, gpus=64, seed=2)
    t = generate(spec, ["x"])
    inv = synthetic_inventory(spec.gpus, spec.mig_node_share)
    assert inv.gpu_count == 64
    assert any(g.mig for n in inv.nodes for g in n.gpus)
    shapes = {j.request for j in t.jobs}
    for req in shapes:
        assert place(Cluster(inv), req, float("inf")) is not None, req
