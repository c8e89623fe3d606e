"""Fixed MIG layouts: on a real node the admin (or mig-parted, the GPU operator) decides which
MIG instances exist, and NVML reports them; the core places MIG slices only on those, never
carving new ones (that is the explicit dynamic mode: a GPU without a layout)."""

import pytest

from jupyter_gpubudget.core.capacity import CapacityError, Cluster
from jupyter_gpubudget.core.inventory import Inventory, carve, load_inventory, make_node
from jupyter_gpubudget.core.model import Placement, Policy, SliceAlloc, SliceRequest, Start
from jupyter_gpubudget.core.offer import slice_choices
from jupyter_gpubudget.core.placement import place
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler
from jupyter_gpubudget.core.yamlnodes import ConfigError

from .helpers import check_capacity, job, tree

HOUR = 3600.0
# GPU 1 is in MIG mode with four instances: one 3g.40gb and three 1g.10gb
LAYOUT = carve("H100-80GB", [("3g.40gb", None), ("1g.10gb", None), ("1g.10gb", None),
                             ("1g.10gb", None)])


def fixed(layout=LAYOUT, gpus: int = 2) -> Inventory:
    return Inventory((make_node("n0", "H100-80GB", gpus, mig=(1,), mig_layout={1: layout}),))


def test_carve_places_profiles_as_nvidia_smi_does_and_refuses_what_does_not_fit():
    assert LAYOUT == (("3g.40gb", 4), ("1g.10gb", 3), ("1g.10gb", 2), ("1g.10gb", 1))
    assert carve("H100-80GB", [("4g.40gb", 0), ("3g.40gb", 4)]) == (("4g.40gb", 0),
                                                                   ("3g.40gb", 4))
    with pytest.raises(ValueError, match="does not fit"):
        carve("H100-80GB", [("4g.40gb", 0), ("4g.40gb", None)])
    with pytest.raises(ValueError, match="no MIG profile"):
        carve("H100-80GB", [("9g.99gb", None)])


def test_only_the_instances_that_exist_are_placed_on():
    c = Cluster(fixed())
    got = [place(c, SliceRequest.mig("1g.10gb"), 0.0) for _ in range(1)][0]
    assert got is not None and (got.slices[0].profile, got.slices[0].mig_start) in set(LAYOUT)
    # profiles the layout does not have are never carved, though they would fit
    for profile in ("2g.20gb", "4g.40gb", "7g.80gb", "1g.20gb"):
        assert place(c, SliceRequest.mig(profile), 0.0) is None, profile
    # filling every instance: three 1g and one 3g, then nothing more
    taken = []
    for k, profile in enumerate(["1g.10gb"] * 3 + ["3g.40gb"]):
        p = place(c, SliceRequest.mig(profile), 0.0)
        assert p is not None
        c.allocate(f"w{k}", p)
        taken.append((p.slices[0].profile, p.slices[0].mig_start))
    assert sorted(taken) == sorted(LAYOUT)
    assert place(c, SliceRequest.mig("1g.10gb"), 0.0) is None


def test_capacity_refuses_an_instance_outside_the_layout():
    c = Cluster(fixed())
    with pytest.raises(CapacityError, match="layout"):
        c.allocate("x", Placement((SliceAlloc("n0", 1, "mig", 286, 0, "2g.20gb"),)))
    with pytest.raises(CapacityError, match="layout"):  # right profile, wrong slot
        c.allocate("y", Placement((SliceAlloc("n0", 1, "mig", 143, 0, "1g.10gb"),)))


def test_a_fixed_layout_without_a_full_instance_is_never_taken_as_a_whole_gpu():
    # GPU 0 busy; GPU 1 is MIG with small instances: a 1-GPU request waits
    state = ClusterState(tree(), fixed(), running=[
        job("busy", "b", gpus=1)], pending=[job("want", "a", gpus=1)])
    s = Scheduler(state.accounts, state.inventory, state.policy)
    s.submit(state.running[0], 0.0)
    ds = s.submit(job("want", "a", gpus=1, at=1.0), 1.0)
    assert not any(isinstance(d, Start) for d in ds)
    # a layout that is one full-size instance may take it
    full = fixed(carve("H100-80GB", [("7g.80gb", None)]))
    s2 = Scheduler(tree(), full, Policy(mig_first=False))
    s2.submit(job("busy", "b", gpus=1), 0.0)
    ds = s2.submit(job("want", "a", gpus=1, at=1.0), 1.0)
    assert [(d.placement.slices[0].gpu, d.placement.slices[0].profile) for d in ds
            if isinstance(d, Start)] == [(1, "7g.80gb")]


def test_the_scheduler_never_carves_and_never_allocates_twice():
    pending = [job(f"m{k}", "a", req=SliceRequest.mig(p), at=k)
               for k, p in enumerate(["1g.10gb", "2g.20gb", "1g.10gb", "3g.40gb", "1g.10gb",
                                      "1g.10gb", "4g.40gb"])]
    s = Scheduler.from_state(ClusterState(tree(), fixed(gpus=1 + 1), pending=pending))
    s.cycle(10 * HOUR)
    check_capacity(fixed(), s.running.values())
    started = {w.id: (w.placement.slices[0].profile, w.placement.slices[0].mig_start)
               for w in s.running.values() if w.placement and w.placement.slices[0].gpu == 1}
    assert sorted(started.values()) == sorted(LAYOUT)  # exactly the four instances
    assert {"m1", "m6"} <= set(s.pending)  # 2g.20gb, 4g.40gb: no such instance


def test_the_offer_lists_the_profiles_that_exist():
    keys = [c["key"] for c in slice_choices(fixed())]
    assert [k for k in keys if k.startswith("mig:")] == ["mig:1g.10gb", "mig:3g.40gb"]
    carved = Inventory((make_node("n0", "H100-80GB", 2, mig=(1,)),))
    assert "mig:7g.80gb" in [c["key"] for c in slice_choices(carved)]


def test_declared_layouts_and_their_errors_name_the_line():
    inv = load_inventory("""
nodes:
  - name: a
    model: H100-80GB
    gpus: 4
    mig: [2, 3]
    mig_layout:
      2: [3g.40gb, 1g.10gb, 1g.10gb, 1g.10gb]
      3: [4g.40gb@0, 3g.40gb@4]
""")
    g2, g3 = inv.nodes[0].gpus[2], inv.nodes[0].gpus[3]
    assert g2.mig_layout == LAYOUT and g3.mig_layout == (("4g.40gb", 0), ("3g.40gb", 4))
    for bad, words in [("2: [4g.40gb, 4g.40gb]", "does not fit"),
                       ("2: [1g.99gb]", "no MIG profile"),
                       ("1: [1g.10gb]", "not in MIG mode"),
                       ("2: [1g.10gb@x]", "profile@start"),
                       ("2: [4g.40gb@1]", "slot 1")]:
        with pytest.raises(ConfigError) as e:
            load_inventory(f"""
nodes:
  - name: a
    model: H100-80GB
    gpus: 4
    mig: [2, 3]
    mig_layout:
      {bad}
""")
        assert words in str(e.value) and e.value.line == 8, (bad, str(e.value))
