"""FGD fragmentation: the vectorised index agrees with a plain re-statement of the definition,
hand-computed values hold, and the mix keeps the typical shapes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from jupyter_gpubudget.core.fragmentation import FragIndex, Shape, ShapeMix
from jupyter_gpubudget.core.model import SliceRequest


def naive_f(free: list[int], cpu: int, mem: int, model: str, s: Shape,
            use_mem: bool = False) -> float:
    total = sum(free)
    if s.gpus == 0 or (s.models is not None and model not in s.models):
        return total
    if cpu < s.cpu_milli or (use_mem and mem < s.memory_mib):
        return total
    if sum(1 for f in free if f >= s.milli) < s.gpus:
        return total
    return sum(f for f in free if f < s.milli)


def naive_F(free, cpu, mem, model, mix):  # type: ignore[no-untyped-def]
    return sum(p * naive_f(free, cpu, mem, model, s) for s, p in mix.typical())


def test_hand_computed_fragmentation() -> None:
    # one node, 4 GPUs with 1000, 600, 300, 0 milli free, 8 CPUs free
    idx = FragIndex([4], ["T4"], [8000], [10**6])
    idx.set_node(0, [1000, 600, 300, 0], 8000, 10**6)
    mix = ShapeMix(decay=1.0, threshold=1.0)
    half = Shape(500, 1, 2000)  # fits GPUs 0 and 1; stranded: 300
    whole2 = Shape(1000, 2, 2000)  # only one wholly free GPU: all 1900 stranded
    big_cpu = Shape(100, 1, 16000)  # not enough CPU: all 1900 stranded
    for s in (half, half, whole2, big_cpu):
        mix.observe(s)
    w = idx.weights(mix)
    f = idx.frag(np.array([0]), w)[0]
    assert f == pytest.approx(0.5 * 300 + 0.25 * 1900 + 0.25 * 1900)
    assert f == pytest.approx(naive_F([1000, 600, 300, 0], 8000, 10**6, "T4", mix))


def test_index_matches_definition_on_random_states() -> None:
    rng = random.Random(5)
    models = ["A", "B"]
    n = 30
    gpn = [rng.choice([1, 2, 4, 8]) for _ in range(n)]
    mods = [rng.choice(models) for _ in range(n)]
    idx = FragIndex(gpn, mods, [64000] * n, [10**6] * n)
    states = []
    for i in range(n):
        free = [rng.choice([0, 100, 250, 500, 700, 1000]) for _ in range(gpn[i])]
        cpu = rng.choice([0, 4000, 16000, 64000])
        idx.set_node(i, free, cpu, 10**6)
        states.append((free, cpu))
    mix = ShapeMix(decay=1.0, threshold=1.0)
    shapes = [Shape(250, 1, 4000), Shape(500, 1, 8000), Shape(1000, 1, 8000),
              Shape(1000, 2, 16000), Shape(1000, 8, 32000), Shape(0, 0, 4000),
              Shape(700, 1, 1000, models=frozenset({"B"}))]
    for k, s in enumerate(shapes):
        for _ in range(k + 1):
            mix.observe(s)
    w = idx.weights(mix)
    got = idx.frag(None, w)
    want = [naive_F(f, c, 10**6, mods[i], mix) for i, (f, c) in enumerate(states)]
    assert got == pytest.approx(want)

    for s in shapes[:5]:
        if s.milli < 1000:
            nodes, gpus = idx.candidates_share(s)
            d = idx.score_share(s, w, nodes, gpus)
            for j, (i, gi) in enumerate(zip(nodes.tolist(), gpus.tolist(), strict=True)):
                free, cpu = states[i]
                after = list(free)
                after[gi] -= s.milli
                exp = (naive_F(after, cpu - s.cpu_milli, 10**6, mods[i], mix)
                       - naive_F(free, cpu, 10**6, mods[i], mix))
                assert d[j] == pytest.approx(exp)
        else:
            cand = idx.candidates_whole(s)
            d = idx.score_whole(s, w, cand)
            for j, i in enumerate(cand.tolist()):
                free, cpu = states[i]
                after = list(free)
                taken = 0
                for k in range(len(after)):
                    if after[k] == 1000 and taken < s.gpus:
                        after[k], taken = 0, taken + 1
                exp = (naive_F(after, cpu - s.cpu_milli, 10**6, mods[i], mix)
                       - naive_F(free, cpu, 10**6, mods[i], mix))
                assert d[j] == pytest.approx(exp)


def test_fgd_prefers_the_placement_that_strands_least() -> None:
    # node 0 has a GPU with 500 free, node 1 is empty. Arrivals are mostly 500-milli shares:
    # a 500 share should fill node 0's half GPU, not open a fresh GPU on node 1.
    idx = FragIndex([2, 2], ["T4", "T4"], [32000, 32000], [10**6, 10**6])
    idx.set_node(0, [500, 1000], 32000, 10**6)
    mix = ShapeMix(decay=1.0)
    for _ in range(9):
        mix.observe(Shape(500, 1, 1000))
    mix.observe(Shape(1000, 2, 1000))
    best = idx.best_share(Shape(500, 1, 1000), mix)
    assert best[0] == (0, 0)
    # a 2-GPU whole request can only go to node 1
    assert idx.best_whole(Shape(1000, 2, 1000), mix) == [1]


def test_shape_mix_typical_and_decay() -> None:
    mix = ShapeMix(decay=1.0, threshold=0.9)
    a, b, c = Shape(1000, 1), Shape(500, 1), Shape(0, 0, 1000)
    for _ in range(60):
        mix.observe(a)
    for _ in range(35):
        mix.observe(b)
    for _ in range(5):
        mix.observe(c)
    typ = dict(mix.typical())
    assert set(typ) == {a, b}  # c is outside the 90 % most frequent
    assert typ[a] == pytest.approx(60 / 95)
    d = ShapeMix(decay=0.5)
    d.observe(a)
    d.observe(b)
    d.observe(b)
    assert dict(d.typical())[b] > 0.8
    assert Shape.of(SliceRequest.mig("1g.10gb")) is None
    assert Shape.of(SliceRequest.mps(250, cpu_milli=3)) == Shape(250, 1, 3)
    assert Shape.of(SliceRequest.whole(2, gpu_model="A|B")).models == frozenset({"A", "B"})


def _two_node_scheduler():  # type: ignore[no-untyped-def]
    from jupyter_gpubudget.core.accounts import load_budgets
    from jupyter_gpubudget.core.inventory import Inventory, make_node
    from jupyter_gpubudget.core.scheduler import Scheduler

    b = load_budgets("accounts:\n  p: {grant: 1000}\n", "b.yaml")
    inv = Inventory((make_node("a", "T4", 2, cpu_milli=16000, memory_mib=65536),
                     make_node("b", "T4", 2, cpu_milli=16000, memory_mib=65536)))
    return Scheduler(b.accounts, inv)


def test_scheduler_places_shares_by_fgd_when_attached() -> None:
    from jupyter_gpubudget.core.fragmentation import index_for
    from jupyter_gpubudget.core.model import Start, Workload

    mix = ShapeMix(decay=1.0)
    for _ in range(8):
        mix.observe(Shape(600, 1, 2000))  # mostly 600-milli shares
    mix.observe(Shape(400, 1, 2000))
    sched = _two_node_scheduler()
    index_for(sched.cluster, mix)

    def submit(wid: str, req: SliceRequest) -> Start:
        d = sched.submit(Workload(wid, "p", "u", req, 0.0), 0.0)
        assert isinstance(d[0], Start)
        return d[0]

    s1 = submit("w1", SliceRequest.mps(400, cpu_milli=2000))
    # a 600 share next: packing would fill w1's GPU (400 + 600 = 1000, nothing stranded)
    s2 = submit("w2", SliceRequest.mps(600, cpu_milli=2000))
    sl1, sl2 = s1.placement.slices[0], s2.placement.slices[0]
    assert (sl2.node, sl2.gpu) == (sl1.node, sl1.gpu)
    # another 400 share must not break a fresh GPU into 400 + an unusable-for-600 remainder
    # when ... a 600-share GPU would do; here all GPUs with room are empty: it opens one and
    # the index stays in step with the cluster
    s3 = submit("w3", SliceRequest.mps(400, cpu_milli=2000))
    sl3 = s3.placement.slices[0]
    assert (sl3.node, sl3.gpu) != (sl1.node, sl1.gpu)
    idx = index_for(sched.cluster).index
    index_for(sched.cluster).sync()
    used = {(s.node, s.gpu) for s in (sl1, sl3)}
    for name, i in (("a", 0), ("b", 1)):
        for gi in range(2):
            want = 1000 - sched.cluster.by_name[name].gpus[gi].used_milli
            assert idx.free[i, gi] == want, (name, gi, used)
    sched.finish("w2", 1.0)
    index_for(sched.cluster).sync()
    assert idx.free[sched.cluster.by_name[sl1.node].idx, sl1.gpu] == 600


def test_placement_uses_fgd_only_when_attached() -> None:
    from jupyter_gpubudget.core.capacity import Cluster
    from jupyter_gpubudget.core.fragmentation import index_for
    from jupyter_gpubudget.core.inventory import Inventory, make_node
    from jupyter_gpubudget.core.model import Placement, SliceAlloc
    from jupyter_gpubudget.core.placement import place

    inv = Inventory((make_node("a", "T4", 2, cpu_milli=16000, memory_mib=65536),
                     make_node("b", "T4", 2, cpu_milli=16000, memory_mib=65536)))

    def cluster() -> Cluster:
        c = Cluster(inv)
        c.allocate("w0", Placement((SliceAlloc("a", 0, "mps", 400),)))  # a/0: 600 free
        c.allocate("w1", Placement((SliceAlloc("b", 0, "mps", 100),)))  # b/0: 900 free
        return c

    req = SliceRequest.mps(400, cpu_milli=1000)
    packed = place(cluster(), req, float("inf"))
    assert packed is not None and (packed.slices[0].node, packed.slices[0].gpu) == ("a", 0)

    c = cluster()
    mix = ShapeMix(decay=1.0)
    for _ in range(10):
        mix.observe(Shape(500, 1, 1000))  # everyone asks for half a GPU
    index_for(c, mix)
    fgd = place(c, req, float("inf"))
    assert fgd is not None
    # a/0 would keep 200, useless to a 500 share; anywhere else nothing is stranded
    assert (fgd.slices[0].node, fgd.slices[0].gpu) != ("a", 0)


def test_attached_index_without_a_mix_still_places() -> None:
    from jupyter_gpubudget.core.capacity import Cluster
    from jupyter_gpubudget.core.fragmentation import index_for
    from jupyter_gpubudget.core.inventory import Inventory, make_node
    from jupyter_gpubudget.core.placement import place

    c = Cluster(Inventory((make_node("a", "T4", 2, cpu_milli=8000),)))
    index_for(c, ShapeMix())  # nothing observed yet: placement packs as without FGD
    for req in (SliceRequest.mps(300, cpu_milli=1000), SliceRequest.whole(1, cpu_milli=1000),
                SliceRequest.cpu_only(cpu_milli=1000)):
        p = place(c, req, float("inf"))
        assert p is not None
        c.allocate(f"w{req.kind}", p)
    assert c.used_milli == 1300


def test_index_follows_the_cluster_in_bulk_and_one_by_one() -> None:
    from jupyter_gpubudget.core.capacity import Cluster
    from jupyter_gpubudget.core.fragmentation import index_for
    from jupyter_gpubudget.core.inventory import Inventory, make_node
    from jupyter_gpubudget.core.model import Placement, SliceAlloc

    inv = Inventory(tuple(make_node(f"n{i}", "T4", 4, cpu_milli=32000) for i in range(40)))
    c = Cluster(inv)
    mix = ShapeMix(decay=1.0)
    mix.observe(Shape(300, 1, 1000))
    mix.observe(Shape(1000, 2, 4000))
    cf = index_for(c, mix)
    cf.index.weights(mix)  # register the shapes' columns

    def check() -> None:
        cf.sync()
        idx = cf.index
        for i, n in enumerate(c.nodes):
            assert idx.free[i].tolist() == [1000 - g.used_milli for g in n.gpus]
            assert idx.cpu[i] == n.cpu_total - n.cpu_used
        fresh = idx.cnt.copy(), idx.small.copy(), idx.total.copy()
        idx.recompute()
        assert (fresh[0] == idx.cnt).all() and (fresh[1] == idx.small).all()
        assert (fresh[2] == idx.total).all()

    for i in range(30):  # many nodes at once: bulk reload
        c.allocate(f"w{i}", Placement((SliceAlloc(f"n{i}", i % 4, "mps", 300, cpu_milli=1000),)))
    check()
    c.release("w3")  # one at a time
    c.allocate("x", Placement((SliceAlloc("n39", 0, "gpu", 1000, cpu_milli=4000),
                               SliceAlloc("n39", 1, "gpu", 1000))))
    check()


def test_cpu_stranded_by_hand() -> None:
    from jupyter_gpubudget.core.fragmentation import BIG, cpu_per_milli, cpu_stranded

    # ρ = 10 CPU milli per GPU milli (10 cores per GPU): 8 free GPUs need 80 cores
    got = cpu_stranded(np.array([8000, 8000, 2000, 0]), np.array([80000, 20000, 96000, 5000]),
                       10.0)
    assert got.tolist() == [0.0, 6000.0, 0.0, 0.0]  # 20 cores feed 2 GPUs: 6 are stranded
    assert cpu_stranded(np.array([8000]), np.array([int(BIG)]), 10.0).tolist() == [0.0]
    assert cpu_stranded(np.array([8000]), np.array([0]), 0.0).tolist() == [0.0]  # no ρ
    # ρ of a mix: (0.5·4000 + 0.25·8000 + 0.25·[CPU-only, left out]) / (0.5·500 + 0.25·2·1000)
    mix = [(Shape(500, 1, 4000), 0.5), (Shape(1000, 2, 8000), 0.25), (Shape(0, 0, 9000), 0.25)]
    assert cpu_per_milli(mix) == pytest.approx((2000 + 2000) / (250 + 500))
    assert cpu_per_milli([(Shape(500, 1), 1.0)]) == 0.0
    assert cpu_per_milli([]) == 0.0


def test_cpu_heavy_share_goes_to_the_cpu_rich_node() -> None:
    """Two nodes with two free GPUs each; node 0 has 20 cores, node 1 has 104. The mix asks
    4 cores per half GPU (ρ = 8 CPU milli per GPU milli). A share asking 12 cores for half a
    GPU fits the mix's next arrival on either node (ΔF ties), but on node 0 it leaves 8 cores
    for 1.5 GPUs: 1500 − 8000/8 = 500 milli that the mix can never use."""
    idx = FragIndex([2, 2], ["T4", "T4"], [20000, 104000], [10**6, 10**6])
    mix = ShapeMix(decay=1.0)
    for _ in range(10):
        mix.observe(Shape(500, 1, 4000))
    w = idx.weights(mix)
    assert idx.rho == pytest.approx(8.0)
    s = Shape(500, 1, 12000)
    # node 0: before max(0, 2000 − 20000/8) = 0, after 1500 − 8000/8 = 500; node 1: 0 and 0
    assert idx.strand_delta(np.array([0, 1]), s.cpu_milli, s.milli).tolist() == [500.0, 0.0]
    n, g = idx.candidates_share(s)
    assert np.round(idx.score_share(s, w, n, g), 6).tolist() == [0.0] * 4  # ΔF ties
    assert idx.best_share(s, mix)[0][0] == 1  # the host-stranding term: CPU-rich node
    idx.strand_weight = 0.0  # without it, best fit picks the fuller (CPU-poor) node
    assert idx.best_share(s, mix)[0][0] == 0
