"""MIG profile tables, NVLink-aware picking, and the declared inventory's errors."""

import pytest

from jupyter_gpubudget.core import mig
from jupyter_gpubudget.core.capacity import CapacityError, Cluster
from jupyter_gpubudget.core.inventory import InventoryError, load_inventory
from jupyter_gpubudget.core.model import Placement, SliceAlloc, SliceRequest
from jupyter_gpubudget.core.placement import place


def test_tables_match_nvidia_profiles():
    h200 = mig.profiles_for("H200-141GB")
    assert set(h200) == {"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}
    assert h200["1g.18gb"].milli == 143  # 1/7 of a GPU
    assert h200["7g.141gb"].milli == 1000
    assert mig.profiles_for("A100-40GB")["3g.20gb"].starts == (0, 4)
    assert mig.profiles_for("T4") == {}


def test_seven_small_instances_fit_and_an_eighth_does_not():
    inv = load_inventory("nodes: [{name: n, model: A100-40GB, gpus: 1, mig: all}]")
    c = Cluster(inv)
    for i in range(7):
        p = place(c, SliceRequest.mig("1g.5gb"), 0)
        assert p is not None
        c.allocate(f"w{i}", p)
    assert place(c, SliceRequest.mig("1g.5gb"), 0) is None
    assert c.gpu((0, 0)).compute_used == 7


def test_small_instances_keep_room_for_large_ones():
    inv = load_inventory("nodes: [{name: n, model: H100-80GB, gpus: 2, mig: all}]")
    c = Cluster(inv)
    for i in range(3):
        c.allocate(f"s{i}", place(c, SliceRequest.mig("1g.10gb"), 0))
    # all three small ones packed on one GPU, at the top slots: a 4g still fits on it
    assert {s.gpu for w in ("s0", "s1", "s2") for s in c.allocations[w].slices} == {0}
    assert mig.fits("H100-80GB", "4g.40gb", c.gpu((0, 0)).mask, c.gpu((0, 0)).compute_used)


def test_overlapping_mig_allocation_is_refused():
    inv = load_inventory("nodes: [{name: n, model: H100-80GB, gpus: 1, mig: all}]")
    c = Cluster(inv)
    c.allocate("a", Placement((SliceAlloc("n", 0, "mig", 429, 0, "3g.40gb"),)))
    with pytest.raises(CapacityError):
        c.allocate("b", Placement((SliceAlloc("n", 0, "mig", 571, 0, "4g.40gb"),)))
    with pytest.raises(CapacityError):
        c.allocate("c", Placement((SliceAlloc("n", 0, "gpu", 1000),)))


def test_whole_gpus_stay_in_one_nvlink_domain():
    inv = load_inventory("""
nodes:
  - {name: n, model: A100-80GB, gpus: 8, nvlink: [[0, 1, 2, 3], [4, 5, 6, 7]]}
""")
    c = Cluster(inv)
    c.allocate("x", Placement((SliceAlloc("n", 0, "gpu"),)))  # domain 0 has 3 left
    p = place(c, SliceRequest.whole(3), 0)
    assert {s.gpu for s in p.slices} == {1, 2, 3}  # the tighter domain
    p = place(c, SliceRequest.whole(4), 0)
    assert {s.gpu for s in p.slices} == {4, 5, 6, 7}


def test_mps_shares_pack_before_opening_a_gpu():
    inv = load_inventory("nodes: [{name: n, model: H100-80GB, gpus: 2}]")
    c = Cluster(inv)
    c.allocate("a", place(c, SliceRequest.mps(600), 0))
    p = place(c, SliceRequest.mps(400), 0)
    assert p.slices[0].gpu == c.allocations["a"].slices[0].gpu
    c.allocate("b", p)
    assert place(c, SliceRequest.whole(1), 0) is not None  # the other GPU is still whole


BAD_INVENTORIES = [
    ("nodes: []\n", "nodes", 1, "no nodes"),
    ("nodes:\n  - {name: a, gpus: 2, colour: red}\n", "nodes[0].colour", 2, "unknown key"),
    ("nodes:\n  - {name: a}\n", "nodes[0]", 2, "missing required key 'gpus'"),
    ("nodes:\n  - {name: a, gpus: 2, model: T4, mig: [0]}\n", "nodes[0].mig", 2, "no MIG"),
    ("nodes:\n  - {name: a, gpus: 2, model: H100-80GB, mig: [5]}\n", "nodes[0].mig[0]", 2,
     "does not exist"),
    ("nodes:\n  - {name: a, gpus: 2}\n  - {name: a, gpus: 2}\n", "nodes[1].name", 3, "duplicate"),
    ("nodes:\n  - {name: a, gpus: 2.5}\n", "nodes[0].gpus", 2, "whole number"),
    ("nodes:\n  - {name: a, gpus: 2, nvlink: [[0, 1], [1]]}\n", "nodes[0].nvlink[1][0]", 2,
     "two NVLink"),
]


# plain ids: mutmut passes the ids back to pytest, which would not match escaped newlines
@pytest.mark.parametrize(("text", "path", "line", "words"), BAD_INVENTORIES,
                         ids=[f"{b[1]}-{b[3]}" for b in BAD_INVENTORIES])
def test_bad_inventory(text, path, line, words):
    with pytest.raises(InventoryError) as info:
        load_inventory(text, "inv.yaml")
    assert words in info.value.message and info.value.path == path and info.value.line == line


def test_bulk_load_checks_like_allocate_and_indexes_the_same():
    inv = load_inventory("nodes: [{name: n, model: H100-80GB, gpus: 4, mig: [3]}]")
    placements = [("a", Placement((SliceAlloc("n", 0, "gpu"),))),
                  ("b", Placement((SliceAlloc("n", 1, "mps", 400),))),
                  ("c", Placement((SliceAlloc("n", 3, "mig", 143, 6, "1g.10gb"),)))]
    one_by_one, bulk = Cluster(inv), Cluster(inv)
    for wid, p in placements:
        one_by_one.allocate(wid, p)
    bulk.load(placements)
    assert bulk.whole_buckets == one_by_one.whole_buckets
    assert bulk.shared == one_by_one.shared and bulk.mig_index == one_by_one.mig_index
    with pytest.raises(CapacityError):
        Cluster(inv).load([*placements, ("d", Placement((SliceAlloc("n", 0, "gpu"),)))])


def _as_rows(table):
    return [(p.name, p.compute, p.size, p.starts, p.memory_gb) for p in table.values()]


def test_profile_tables_are_nvidia_smis_by_hand():
    """``nvidia-smi mig -lgip`` / ``-lgipp`` on each model: name, compute slices, memory
    slots, allowed placements, memory — built by mig._table from the six memory sizes."""
    h100 = [("1g.10gb", 1, 1, (0, 1, 2, 3, 4, 5, 6), 10), ("1g.20gb", 1, 2, (0, 2, 4, 6), 20),
            ("2g.20gb", 2, 2, (0, 2, 4), 20), ("3g.40gb", 3, 4, (0, 4), 40),
            ("4g.40gb", 4, 4, (0,), 40), ("7g.80gb", 7, 8, (0,), 80)]
    assert _as_rows(mig._table((10, 20, 20, 40, 40, 80))) == h100
    assert _as_rows(mig.MIG_TABLES["H100-80GB"]) == h100
    assert _as_rows(mig.MIG_TABLES["A100-80GB"]) == h100
    assert _as_rows(mig._table((5, 10, 10, 20, 20, 40), with_1g_double=False)) == [
        ("1g.5gb", 1, 1, (0, 1, 2, 3, 4, 5, 6), 5), ("2g.10gb", 2, 2, (0, 2, 4), 10),
        ("3g.20gb", 3, 4, (0, 4), 20), ("4g.20gb", 4, 4, (0,), 20),
        ("7g.40gb", 7, 8, (0,), 40)]
    assert [r[0] for r in _as_rows(mig.MIG_TABLES["H200-141GB"])] == [
        "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]
    assert [p.milli for p in mig.MIG_TABLES["H200-141GB"].values()] == [
        143, 143, 286, 429, 571, 1000]


def test_slot_masks_occupy_and_release_exactly_their_span():
    t = mig.profiles_for("H100-80GB")
    assert mig.occupy(t["3g.40gb"], 4, 0) == 0b11110000
    assert mig.occupy(t["1g.20gb"], 2, 0b1) == 0b1101
    assert mig.release(t["3g.40gb"], 4, 0b11110001) == 0b1
    assert mig.release(t["1g.10gb"], 6, 0b11000000) == 0b10000000
    assert mig.release(t["2g.20gb"], 0, 0b11) == 0
    assert mig.release(t["1g.10gb"], 3, 0b1) == 0b1  # releasing a free slot changes nothing
    for p in t.values():
        for start in p.starts:
            for mask in (0, 0b10101010, 0xFF):
                span = ((1 << p.size) - 1) << start
                assert mig.release(p, start, mig.occupy(p, start, mask)) == mask & ~span
    assert mig.FULL_MASK == 0xFF and mig.SLOTS == 8 and mig.COMPUTE == 7
