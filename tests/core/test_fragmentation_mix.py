"""The mix FGD scores against, by hand (docs/core.md, "Fragmentation-aware placement"): the
shape of each kind of request, the decayed histogram of shapes (its weights, pruning,
renormalisation and version), the scheduler's live view of its shape counts (when it is
re-derived), and the mix's CPU per GPU-milli with the host-stranding it implies."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jupyter_gpubudget.core.capacity import Cluster
from jupyter_gpubudget.core.fragmentation import (
    MixView,
    Shape,
    ShapeMix,
    cluster_fragmentation,
    cpu_per_milli,
    cpu_stranded,
    index_for,
)
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import Placement, SliceAlloc, SliceRequest

A = Shape(1000, 1)
B = Shape(500, 1)
C = Shape(250, 1)


def test_the_shape_of_each_kind_of_request():
    models = frozenset({"A100-80GB", "H100-80GB"})
    assert Shape.of(SliceRequest.whole(2, cpu_milli=4000, memory_mib=64,
                                       gpu_model="A100-80GB|H100-80GB")) == Shape(
        1000, 2, 4000, 64, models)
    assert Shape.of(SliceRequest.whole(0, cpu_milli=5)) == Shape(0, 0, 5, 0, None)
    assert Shape.of(SliceRequest(kind="gpu", gpus=-1)) == Shape(0, 0, 0, 0, None)
    assert Shape.of(SliceRequest.mps(250, cpu_milli=7, memory_mib=8, gpu_model="T4")) == Shape(
        250, 1, 7, 8, frozenset({"T4"}))
    assert Shape.of(SliceRequest.cpu_only(cpu_milli=9, memory_mib=10, gpu_model="T4")) == Shape(
        0, 0, 9, 10, None)  # CPU-only work has no GPU model
    assert Shape.of(SliceRequest.mig("1g.10gb")) is None  # MIG packs by its own rule


def test_a_mix_starts_empty_and_refuses_a_decay_outside_zero_to_one():
    m = ShapeMix()
    assert (m.decay, m.threshold, m.max_shapes, m.version, len(m)) == (0.9995, 0.95, 256, 0, 0)
    for bad in (0.0, -1.0, 1.5):
        with pytest.raises(ValueError) as info:
            ShapeMix(decay=bad)
        assert str(info.value) == "decay must be in (0, 1]"
    assert ShapeMix(decay=1.0).decay == 1.0


def test_observations_weigh_more_the_newer_they_are():
    m = ShapeMix(decay=0.5)
    m.observe(A)
    m.observe(SliceRequest.mps(500))  # a request counts by its shape
    m.observe(SliceRequest.mig("1g.10gb"))  # MIG: nothing changes
    assert m.weights == {A: 2.0, B: 4.0} and m.version == 2
    assert m.typical() == [(B, 4 / 6), (A, 2 / 6)]
    m.observe(C, weight=0.5)
    assert m.weights[C] == 4.0 and m.version == 3
    plain = ShapeMix(decay=1.0)
    plain.observe(A)
    plain.observe(A)
    assert plain.weights == {A: 2.0}


def test_the_weights_are_renormalised_before_they_overflow():
    """With decay 1/2 the increment doubles with every observation and passes 1e100 after
    333 of them: the weights are divided down, keeping their ratios."""
    m = ShapeMix(decay=0.5)
    m.observe(A)
    for _ in range(400):
        m.observe(B)
    w = m.weights
    assert all(math.isfinite(x) and x > 0 for x in w.values())
    # A came first: weight 2, B's 400 after it: 4 + 8 + ... + 2^401 = 2^402 - 4
    assert w[A] / w[B] == pytest.approx(2.0 / (2.0 ** 402 - 4.0), rel=1e-9, abs=0.0)
    assert max(w.values()) < 1e102


def test_too_many_shapes_keep_the_heaviest_half():
    m = ShapeMix(decay=1.0, max_shapes=4)
    shapes = [Shape(100 * i, 1) for i in range(1, 6)]
    for s, w in zip(shapes, (3.0, 3.0, 3.0, 1.0), strict=False):
        m.observe(s, weight=w)
    assert len(m) == 4  # exactly the limit: nothing pruned
    m.observe(shapes[4], weight=2.0)
    # five shapes: the two heaviest stay; among equal weights the smaller shape first
    assert m.weights == {shapes[0]: 3.0, shapes[1]: 3.0}
    assert m.version == 5


def test_typical_shapes_cover_the_threshold():
    m = ShapeMix(decay=1.0)
    m.observe(A, weight=96.0)
    m.observe(B, weight=4.0)
    assert m.typical() == [(A, 1.0)]
    m2 = ShapeMix(decay=1.0, threshold=1.0)
    m2.observe(A, weight=96.0)
    m2.observe(B, weight=4.0)
    assert m2.typical() == [(A, 0.96), (B, 0.04)]
    # exactly at the threshold: enough
    m3 = ShapeMix(decay=1.0, threshold=0.95)
    m3.observe(A, weight=95.0)
    m3.observe(B, weight=5.0)
    assert m3.typical() == [(A, 1.0)]
    # weights below one in all: still a mix; and a new observation is seen at once
    m4 = ShapeMix(decay=1.0)
    m4.observe(B, weight=0.5)
    assert m4.typical() == [(B, 1.0)]
    m4.observe(A, weight=5.0)
    assert m4.typical() == [(A, 5.0 / 5.5), (B, 0.5 / 5.5)]


def key(req: SliceRequest) -> tuple[object, ...]:
    return req.shape


def test_the_schedulers_shape_counts_as_a_mix():
    a, b = key(SliceRequest.whole(1)), key(SliceRequest.mps(500))
    counts: dict[tuple[object, ...], float] = {a: 3.0, b: 1.0, key(SliceRequest.mig("1g.10gb")):
                                               5.0}
    mv = MixView(counts)
    assert mv.threshold == 0.95 and mv._ver == 0
    assert mv.typical() == [(A, 0.75), (B, 0.25)]  # plain counts: no decay; MIG left out
    assert mv._ver == 1
    counts[b] = 0.5  # a weight below one still counts
    counts[a] = 5.0
    counts[key(SliceRequest.mps(250))] = 0.0  # nothing: left out
    mv2 = MixView(counts, threshold=1.0)
    assert mv2.typical() == [(A, 5.0 / 5.5), (B, 0.5 / 5.5)]
    mv3 = MixView({a: 96.0, b: 4.0})
    assert mv3.typical() == [(A, 1.0)]
    assert MixView({a: 96.0, b: 4.0}, threshold=1.0).typical() == [(A, 0.96), (B, 0.04)]


def test_the_view_is_re_derived_on_a_new_shape_or_every_64th_look_after_1_percent_more():
    a, b = key(SliceRequest.whole(1)), key(SliceRequest.mps(500))
    counts: dict[tuple[object, ...], float] = {a: 100.0}
    mv = MixView(counts)
    mv.typical()  # look 1: derived
    assert mv._ver == 1
    counts[a] = 150.0  # 50 % more, no new shape
    for _ in range(62):  # looks 2..63: not summed again
        mv.typical()
    assert mv._ver == 1 and mv.typical() == [(A, 1.0)]  # look 64: summed, re-derived
    assert mv._ver == 2
    counts[a] = 151.5  # exactly 1 % more: not worth it, even on the 64th look
    for _ in range(64):
        mv.typical()
    assert mv._ver == 2
    counts[a] = 152.0  # more than 1 % over what it was derived from (150): on the 64th look
    for _ in range(63):
        mv.typical()
    assert mv._ver == 2
    mv.typical()
    assert mv._ver == 3
    counts[b] = 100.0  # a new shape: at once
    assert mv.typical() == [(A, 152.0 / 252.0), (B, 100.0 / 252.0)]
    assert mv._ver == 4


def test_cpu_per_gpu_milli_of_a_mix():
    typical = [(Shape(1000, 2, 4000), 0.5), (Shape(1, 1, 100), 0.25), (Shape(0, 0, 9000), 0.25)]
    # CPU-only shapes ask for no GPU: left out. (0.5·4000 + 0.25·100) / (0.5·2000 + 0.25·1)
    assert cpu_per_milli(typical) == pytest.approx((2000 + 25) / (1000 + 0.25))
    assert cpu_per_milli([(Shape(500, 1, 1000), 0.001)]) == pytest.approx(2.0)
    assert cpu_per_milli([(Shape(0, 0, 9000), 1.0)]) == 0.0
    # an MPS request of no milli asks for no GPU: its CPU is not counted either
    assert cpu_per_milli([(Shape(0, 1, 500), 0.5), (Shape(1000, 1, 1000), 0.5)]) == 1.0


def test_host_stranding():
    got = cpu_stranded(np.array([1000, 1000, 300]), np.array([200, 5000, 100]), 0.5)
    assert got.tolist() == [600.0, 0.0, 100.0]
    assert cpu_stranded(np.array([1000]), np.array([0]), 0.0).tolist() == [0.0]


# ---------------------------------------------------------------- the cluster's figure


def two_t4_nodes() -> Cluster:
    """Node a: GPU 0 holds a 600 share (400 free), GPU 1 is free; node b is out of service
    (its free capacity counts for nothing)."""
    c = Cluster(Inventory((make_node("a", "T4", 2), make_node("b", "T4", 2))),
                unhealthy=["b"])
    c.allocate("s", Placement((SliceAlloc("a", 0, "mps", 600),)))
    return c


def mix_of(*shapes: tuple[Shape, float]) -> ShapeMix:
    m = ShapeMix(decay=1.0)
    for s, w in shapes:
        m.observe(s, w)
    return m


def test_cluster_fragmentation_by_hand():
    """F = Σ_m p_m · f_m over a's 1400 free milli: a half-GPU share cannot use GPU 0's 400
    (f = 400); a quarter-GPU share can use all (f = 0); a 2-GPU gang or CPU-only work cannot
    use any of it (f = 1400)."""
    assert cluster_fragmentation(two_t4_nodes(), mix_of()) == 0.0  # nothing known: nothing
    assert cluster_fragmentation(two_t4_nodes(), mix_of((B, 1.0))) == 400 / 1400
    assert cluster_fragmentation(two_t4_nodes(), mix_of((B, 1.0), (C, 1.0))) == pytest.approx(
        0.5 * 400 / 1400, abs=0.0)
    assert cluster_fragmentation(two_t4_nodes(), mix_of((B, 3.0), (C, 1.0))) == pytest.approx(
        0.75 * 400 / 1400, abs=0.0)  # weighted by how often each shape arrives
    assert cluster_fragmentation(two_t4_nodes(), mix_of((Shape(1000, 2), 1.0))) == 1.0
    assert cluster_fragmentation(two_t4_nodes(), mix_of((Shape(0, 0, 100), 1.0))) == 1.0
    full = two_t4_nodes()
    full.allocate("w", Placement((SliceAlloc("a", 1),)))
    full.allocate("t", Placement((SliceAlloc("a", 0, "mps", 400),)))
    assert cluster_fragmentation(full, mix_of((B, 1.0))) == 0.0  # nothing free
    one = Cluster(Inventory((make_node("a", "T4", 1),)))
    one.allocate("s", Placement((SliceAlloc("a", 0, "mps", 999),)))
    assert cluster_fragmentation(one, mix_of((B, 1.0))) == 1.0  # one milli, stranded


def test_whole_gpus_go_by_fgd_only_when_shares_ask_for_host_room():
    cases = [((Shape(500, 1, 1000), 1.0),), ((Shape(500, 1, 0, 64), 1.0),),
             ((Shape(500, 1), 1.0), (Shape(1000, 1, 1000), 1.0)),
             ((Shape(500, 1), 1.0),), ((Shape(1000, 1, 1000), 1.0),),
             ((Shape(0, 0, 1000), 1.0),), ((Shape(1, 1, 1), 1.0),), ((Shape(1, 1, 0, 1), 1.0),)]
    got = [index_for(two_t4_nodes(), mix_of(*shapes)).sharing() for shapes in cases]
    assert got == [True, True, True, False, False, False, True, True]
    m = mix_of((Shape(500, 1), 1.0))
    cf = index_for(two_t4_nodes(), m)
    assert cf.sharing() is False
    m.observe(Shape(250, 1, 500), 1.0)  # the mix changed: asked again
    assert cf.sharing() is True


def test_the_index_follows_every_kind_of_slice_health_and_untracked_hosts():
    """Node a: GPU 0 whole, GPU 1 a 300 share, GPU 2 a MIG GPU (FGD never counts it), host
    CPU and memory tracked; nodes b and c: T4s without host tracking (free host: BIG). Each
    way the index learns a change — a few nodes reloaded, most rebuilt, a health flip
    refreshed — gives the same arrays, written out by hand."""
    from jupyter_gpubudget.core.fragmentation import BIG

    c = Cluster(Inventory((make_node("a", "H100-80GB", 3, mig=(2,), cpu_milli=8000,
                                     memory_mib=1000),
                           make_node("b", "T4", 2), make_node("c", "T4", 1))))
    cf = index_for(c, mix_of((B, 1.0)))
    cf.sync()
    big = int(BIG)

    def check(free, cpu, mem, ok) -> None:
        cf.sync()
        idx = cf.index
        assert idx.free.tolist() == free and idx.cpu.tolist() == cpu
        assert idx.mem.tolist() == mem and idx.ok.tolist() == ok

    check([[1000, 1000, 0], [1000, 1000, 0], [1000, 0, 0]], [8000, big, big],
          [1000, big, big], [True, True, True])
    c.allocate("w", Placement((SliceAlloc("a", 0, cpu_milli=1000, memory_mib=100),)))
    check([[0, 1000, 0], [1000, 1000, 0], [1000, 0, 0]], [7000, big, big], [900, big, big],
          [True, True, True])  # one node reloaded
    c.allocate("s", Placement((SliceAlloc("a", 1, "mps", 300, cpu_milli=500, memory_mib=50),)))
    c.allocate("m", Placement((SliceAlloc("a", 2, "mig", 143, 6, "1g.10gb"),)))
    c.allocate("t", Placement((SliceAlloc("b", 0, "mps", 200),)))
    free = [[0, 700, 0], [800, 1000, 0], [1000, 0, 0]]
    check(free, [6500, big, big], [850, big, big], [True, True, True])  # two: rebuilt
    c.set_healthy("a", False)
    check(free, [6500, big, big], [850, big, big], [False, True, True])  # refreshed
    c.set_healthy("a", True)
    check(free, [6500, big, big], [850, big, big], [True, True, True])
