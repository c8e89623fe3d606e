"""Capacity (docs/core.md, semantics 1) over random mixes: whole GPUs, MIG instances (fixed
layouts and carved GPUs) and MPS shares on the same GPUs and nodes; allocations that succeed,
fail halfway and are rolled back, releases and re-allocations, health flips, bulk loads and
placements. After every operation the core's Cluster is compared with an independent recount
from the placements (helpers.Recount), never through the code under test: allocate accepts
exactly what the recount accepts, a refusal changes nothing, and every look-up index is what
a rebuild from scratch would hold."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core import mig as migtab
from jupyter_gpubudget.core.capacity import CapacityError, Cluster
from jupyter_gpubudget.core.inventory import Inventory, carve, make_node
from jupyter_gpubudget.core.model import Placement, SliceAlloc, SliceRequest
from jupyter_gpubudget.core.placement import place

from .helpers import Recount, assert_cluster_matches, prop_settings

MODELS = ["H100-80GB", "A100-40GB", "H200-141GB"]


def layouts(model: str) -> list[tuple[tuple[str, int], ...] | None]:
    """None (carved freely) or one of a few fixed layouts of the model."""
    names = sorted(migtab.profiles_for(model), key=lambda n: migtab.profiles_for(model)[n].size)
    one, two = names[0], [n for n in names if n.startswith("2g")][0]
    three = [n for n in names if n.startswith("3g")][0]
    seven = [n for n in names if n.startswith("7g")][0]
    return [None,
            carve(model, [(three, None), (two, None), (one, None), (one, None)]),
            carve(model, [(seven, None)]),
            carve(model, [(one, None)] * 7)]


@st.composite
def inventories(draw) -> Inventory:
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        model = draw(st.sampled_from(MODELS))
        gpus = draw(st.integers(1, 4))
        mig = tuple(j for j in range(gpus) if draw(st.booleans()))
        lay = {j: draw(st.sampled_from(layouts(model))) for j in mig}
        nvlink = ((tuple(range(gpus // 2)), tuple(range(gpus // 2, gpus)))
                  if gpus >= 2 and draw(st.booleans()) else ())
        nodes.append(make_node(f"n{i}", model, gpus, mig=mig, rack=f"r{i % 2}",
                               cpu_milli=draw(st.sampled_from([0, 8000])),
                               memory_mib=draw(st.sampled_from([0, 64])),
                               mig_layout={j: lay[j] for j in mig if lay[j] is not None},
                               nvlink=nvlink))
    return Inventory(tuple(nodes))


@st.composite
def slices(draw, inv: Inventory) -> SliceAlloc:
    node = draw(st.sampled_from(inv.nodes))
    cpu = draw(st.sampled_from([0, 0, 1000, 5000]))
    mem = draw(st.sampled_from([0, 0, 16, 40]))
    kind = draw(st.sampled_from(["gpu", "mps", "mig", "cpu"]))
    if kind == "cpu":
        return SliceAlloc(node.name, -1, "cpu", 0, cpu_milli=cpu, memory_mib=mem)
    gpu = draw(st.integers(0, len(node.gpus)))  # one past the end now and then
    if kind == "gpu":
        return SliceAlloc(node.name, gpu, "gpu", 1000, cpu_milli=cpu, memory_mib=mem)
    if kind == "mps":
        return SliceAlloc(node.name, gpu, "mps", draw(st.sampled_from([0, 100, 250, 500, 700])),
                          gpu_memory_mib=draw(st.sampled_from([0, 20000, 41000])),
                          cpu_milli=cpu, memory_mib=mem)
    model = node.gpus[0].model
    table = migtab.profiles_for(model)
    profile = draw(st.sampled_from(sorted(table)))
    start = draw(st.sampled_from(table[profile].starts + (1,)))
    return SliceAlloc(node.name, gpu, "mig", table[profile].milli, start, profile,
                      cpu_milli=cpu, memory_mib=mem)


requests = st.one_of(
    st.builds(lambda n, single, links: SliceRequest.whole(n, single_node=single,
                                                          interconnect=links),
              st.integers(1, 5), st.booleans(), st.sampled_from([None, "nvlink", "node", "any"])),
    st.builds(SliceRequest.mig, st.sampled_from(
        ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb", "1g.5gb", "3g.20gb", "1g.18gb",
         "4g.71gb"])),
    st.builds(lambda m, mem: SliceRequest.mps(m, mem), st.sampled_from([100, 250, 500, 1000]),
              st.sampled_from([0, 30000])),
    st.builds(lambda c: SliceRequest.cpu_only(cpu_milli=c), st.sampled_from([0, 3000])),
)


def state_of(c: Cluster) -> object:
    return ([(n.cpu_used, n.mem_used, sorted(n.free_whole),
              [(g.used_milli, g.mem_used, g.whole, g.mask, g.compute_used, dict(g.tenants))
               for g in n.gpus]) for n in c.nodes], dict(c.allocations), c.used_milli)


@prop_settings(150, 30)
@given(st.data())
def test_allocate_accepts_exactly_what_the_recount_accepts(data):
    """Semantics 1, every operation: the core's allocate/release/load agree with the
    recount; a refused allocation (a slice that does not fit, anywhere in a multi-slice
    placement) leaves the cluster exactly as it was; indexes match a rebuild."""
    inv = data.draw(inventories())
    c = Cluster(inv)
    c.whole_gpu_on_mig = data.draw(st.booleans())
    allocations: dict[str, Placement] = {}
    for step in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(["alloc", "alloc", "place", "place", "release",
                                        "health", "reload"]))
        if op == "alloc":
            wid = f"w{step}"
            if allocations and data.draw(st.integers(0, 9)) == 0:
                wid = data.draw(st.sampled_from(sorted(allocations)))  # already placed
            p = Placement(tuple(data.draw(st.lists(slices(inv), min_size=1, max_size=4))))
            why = (f"{wid} is already placed" if wid in allocations
                   else Recount.of(inv, allocations).problem(wid, p.slices))
            before = state_of(c)
            try:
                c.allocate(wid, p)
            except CapacityError:
                assert why is not None, "allocate refused what fits"
                assert state_of(c) == before, "a refused allocation was not rolled back"
            else:
                assert why is None, f"allocate accepted what does not fit: {why}"
                allocations[wid] = p
        elif op == "place":
            req = data.draw(requests)
            p = place(c, req, 0.0)
            if p is not None:
                wid = f"p{step}"
                assert Recount.of(inv, allocations).problem(wid, p.slices) is None
                c.allocate(wid, p)
                allocations[wid] = p
        elif op == "release" and allocations:
            wid = data.draw(st.sampled_from(sorted(allocations)))
            assert c.release(wid) == allocations.pop(wid)
            assert c.release(wid) is None
        elif op == "health":
            node = data.draw(st.sampled_from(inv.nodes)).name
            c.set_healthy(node, data.draw(st.booleans()))
        elif op == "reload":  # the same state read back in bulk, as from the ledger
            fresh = Cluster(inv)
            fresh.load(sorted(allocations.items()))
            for n in c.nodes:
                fresh.set_healthy(n.name, n.healthy)
            assert state_of(fresh) == state_of(c)
            assert_cluster_matches(fresh, inv, allocations)
        assert_cluster_matches(c, inv, allocations)


@prop_settings(100, 25)
@given(st.data())
def test_placement_is_sound_complete_and_independent_of_history(data):
    """What placement proposes always fits (semantics 1) and matches the request; when it
    proposes nothing, nothing fits (whole GPUs, shares, instances, CPU); and the same
    occupancy reached by another history (a bulk load in another order) finds room just
    the same — no stale index or cache decides."""
    inv = data.draw(inventories())
    c = Cluster(inv)
    for k in range(data.draw(st.integers(0, 12))):
        p = place(c, data.draw(requests), 0.0)
        if p is not None:
            c.allocate(f"w{k}", p)
        if c.allocations and data.draw(st.integers(0, 3)) == 0:
            c.release(data.draw(st.sampled_from(sorted(c.allocations))))
    for _ in range(4):
        req = data.draw(requests)
        got = place(c, req, 0.0)
        other = Cluster(inv)
        other.load(sorted(c.allocations.items(), reverse=True))
        assert (place(other, req, 0.0) is None) == (got is None)
        r = Recount.of(inv, c.allocations)
        if got is None:
            assert not fits_somewhere(inv, r, req), f"nothing placed, but {req} fits"
            continue
        assert r.problem("new", got.slices) is None
        assert_matches_request(inv, got, req)


def assert_matches_request(inv: Inventory, p: Placement, req: SliceRequest) -> None:
    specs = {n.name: n for n in inv.nodes}
    first = p.slices[0]
    assert (first.cpu_milli, first.memory_mib) == (req.cpu_milli, req.memory_mib)
    assert all(s.cpu_milli == s.memory_mib == 0 for s in p.slices[1:])
    if req.kind == "gpu":
        assert len(p.slices) == req.gpus
        assert len({(s.node, s.gpu) for s in p.slices}) == req.gpus
        if req.single_node:
            assert len(p.nodes) == 1
        if req.gpus >= 2 and req.interconnect == "nvlink":  # one NVLink domain per node
            for node in p.nodes:
                groups = specs[node].nvlink or (tuple(g.index for g in specs[node].gpus),)
                held = {s.gpu for s in p.slices if s.node == node}
                assert any(held <= set(d) for d in groups), (node, held, groups)
        for s in p.slices:
            g = specs[s.node].gpus[s.gpu]
            if s.kind == "mig":  # a whole MIG GPU as its full-size instance
                assert req.gpus == 1 and s.milli == 1000 and s.mig_start == 0
            else:
                assert s.kind == "gpu" and not g.mig and s.milli == 1000
    elif req.kind == "mig":
        (s,) = p.slices
        assert s.kind == "mig" and s.profile == req.profile
        assert s.milli == migtab.profiles_for(specs[s.node].gpus[s.gpu].model)[s.profile].milli
    elif req.kind == "mps":
        (s,) = p.slices
        assert (s.kind, s.milli, s.gpu_memory_mib) == ("mps", req.milli, req.gpu_memory_mib)
    else:
        (s,) = p.slices
        assert (s.kind, s.gpu, s.milli) == ("cpu", -1, 0)


def fits_somewhere(inv: Inventory, r: Recount, req: SliceRequest) -> bool:
    """Brute force: is there any placement of ``req`` the recount would accept (healthy
    nodes, no reservations; a gang across nodes takes the host needs on its first node)?"""
    def host_ok(node: str) -> bool:
        return r.problem("x", [SliceAlloc(node, -1, "cpu", 0, cpu_milli=req.cpu_milli,
                                          memory_mib=req.memory_mib)]) is None

    if req.kind == "cpu" or (req.kind == "gpu" and req.gpus <= 0):
        return any(host_ok(n.name) for n in inv.nodes)
    if req.kind == "gpu":
        free = {n.name: len(r.free_whole(n.name)) for n in inv.nodes}
        # the interconnect (docs/core.md "Interconnect"): NVLink domains are the declared
        # groups (none declared: one), counting GPUs outside MIG mode only
        whole = {n.name: {g.index for g in n.gpus if not g.mig} for n in inv.nodes}
        groups = {n.name: [set(d) & whole[n.name] for d in
                           (n.nvlink or (tuple(g.index for g in n.gpus),))] for n in inv.nodes}
        max_domain = max((len(d) for gs in groups.values() for d in gs), default=0)
        level = req.interconnect or ("nvlink" if max_domain >= 2 else "node")
        if req.gpus >= 2 and level == "nvlink":  # the most free GPUs sharing one domain
            free = {n: max((len(d & r.free_whole(n)) for d in groups[n]), default=0)
                    for n in free}
        if any(free[n] >= req.gpus and host_ok(n) for n in free):
            return True
        if req.gpus == 1:
            # an idle MIG GPU as a whole, where a full-size instance may exist: not counted
            # here (it depends on the policy switch, which a bare Cluster leaves off)
            pass
        if req.single_node:
            return False
        if req.gpus >= 2 and (
                (level == "nvlink" and req.gpus <= max_domain)
                or (level == "node" and req.gpus <= max(len(w) for w in whole.values()))):
            return False  # a gang that fits one domain (one node) is never split
        return sum(free.values()) >= req.gpus and any(host_ok(n) and free[n] for n in free)
    for n in inv.nodes:
        if not host_ok(n.name):
            continue
        for g in n.gpus:
            if req.kind == "mig":
                if not g.mig or req.profile not in migtab.profiles_for(g.model):
                    continue
                p = migtab.profiles_for(g.model)[req.profile]
                for start in p.starts:
                    s = SliceAlloc(n.name, g.index, "mig", p.milli, start, req.profile)
                    if r.problem("x", [s]) is None:
                        return True
            elif not g.mig:
                s = SliceAlloc(n.name, g.index, "mps", req.milli, -1, None, req.gpu_memory_mib)
                if r.problem("x", [s]) is None:
                    return True
    return False
