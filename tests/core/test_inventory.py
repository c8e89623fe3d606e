"""The declared inventory (core/inventory.py) by hand: every key of a node, replicas, MIG
indices and layouts, NVLink domains, host resources — and every error word for word with its
path and line (semantics 8)."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.core.inventory import (
    GPU_MEMORY_MIB,
    GpuSpec,
    Inventory,
    InventoryError,
    NodeSpec,
    carve,
    load_inventory,
    make_node,
)


def bad(text: str) -> InventoryError:
    with pytest.raises(InventoryError) as info:
        load_inventory(text, "inv.yaml")
    return info.value


def test_a_full_node_entry():
    inv = load_inventory("""
nodes:
  - name: h
    replicas: 2
    rack: r7
    model: H100-80GB
    gpus: 4
    mig: [3, 2, 3]
    mig_layout:
      3: [7g.80gb]
    nvlink: [[0, 1], [2, 3]]
    cpu_milli: 64000
    host_memory_mib: 512000
    gpu_memory_mib: 80000
  - {name: plain, gpus: 1}
""", "inv.yaml")
    assert inv.source == "declared"
    h0, h1, plain = inv.nodes
    assert [n.name for n in inv.nodes] == ["h-0", "h-1", "plain"]
    assert h0 == NodeSpec("h-0", (
        GpuSpec(0, "H100-80GB", 80000, False, "GPU-h-0-0", None),
        GpuSpec(1, "H100-80GB", 80000, False, "GPU-h-0-1", None),
        GpuSpec(2, "H100-80GB", 80000, True, "GPU-h-0-2", None),
        GpuSpec(3, "H100-80GB", 80000, True, "GPU-h-0-3", (("7g.80gb", 0),))),
        "r7", 64000, 512000, ((0, 1), (2, 3)))
    assert h1.gpus[3].mig_layout == (("7g.80gb", 0),) and h1.rack == "r7"
    assert plain == NodeSpec("plain", (GpuSpec(0, "GPU", 0, False, "GPU-plain-0", None),))
    assert inv.gpu_count == 9
    assert inv.node("plain") is plain
    with pytest.raises(KeyError):
        inv.node("nope")


def test_mig_all_and_a_layout_for_every_mig_gpu():
    inv = load_inventory("""
nodes:
  - name: a
    model: A100-40GB
    gpus: 2
    mig: all
    mig_layout: [3g.20gb, 2g.10gb@0, 1g.5gb]
""")
    gpus = inv.nodes[0].gpus
    assert [g.mig for g in gpus] == [True, True]
    # 3g.20gb at the highest free start (4), 2g.10gb where asked (0), 1g.5gb at the highest
    # free start left (3... taken? 2 and 3 are free: 3)
    assert gpus[0].mig_layout == gpus[1].mig_layout == (("3g.20gb", 4), ("2g.10gb", 0),
                                                        ("1g.5gb", 3))
    assert gpus[0].memory_mib == GPU_MEMORY_MIB["A100-40GB"] == 40960


def test_node_errors_word_for_word():
    cases = [
        ("nodes: []\n", "nodes", 1, "the inventory has no nodes"),
        ("{}\n", "", 1, "missing required key 'nodes'"),
        ("nodes:\n  - {gpus: 1}\n", "nodes[0]", 2, "missing required key 'name'"),
        ("nodes:\n  - {name: a, gpus: -1}\n", "nodes[0].gpus", 2, "must be ≥ 0, got -1"),
        ("nodes:\n  - {name: a, gpus: 1, replicas: 0}\n", "nodes[0].replicas", 2,
         "must be ≥ 1, got 0"),
        ("nodes:\n  - {name: a, gpus: 1, replicas: 2}\n  - {name: a-1, gpus: 1}\n",
         "nodes[1].name", 3, "duplicate node name 'a-1' (also at line 2)"),
        ("nodes:\n  - {name: a, gpus: 1, cpu_milli: 1.5}\n", "nodes[0].cpu_milli", 2,
         "expected a whole number, got 1.5"),
        ("nodes:\n  - {name: a, gpus: 1, host_memory_mib: x}\n", "nodes[0].host_memory_mib", 2,
         "expected a number, got str 'x'"),
        ("nodes:\n  - {name: a, gpus: 1, gpu_memory_mib: 0.5}\n", "nodes[0].gpu_memory_mib",
         2, "expected a whole number, got 0.5"),
        ("nodes:\n  - {name: a, gpus: 1, rack: ''}\n", "nodes[0].rack", 2,
         "expected a non-empty string, got str ''"),
        ("nodes:\n  - {name: a, gpus: 2, model: T4, mig: all}\n", "nodes[0].mig", 2,
         "model 'T4' has no MIG profiles (known: A100-40GB, A100-80GB, H100-80GB, "
         "H200-141GB)"),
        ("nodes:\n  - {name: a, gpus: 2, model: H100-80GB, mig: [2]}\n", "nodes[0].mig[0]", 2,
         "GPU index 2 does not exist (the node has 2 GPUs)"),
        ("nodes:\n  - {name: a, gpus: 2, model: H100-80GB, mig: [-1]}\n", "nodes[0].mig[0]", 2,
         "must be ≥ 0, got -1"),
        ("nodes:\n  - {name: a, gpus: 2, nvlink: [[0, 2]]}\n", "nodes[0].nvlink[0][1]", 2,
         "GPU index 2 does not exist (the node has 2 GPUs)"),
        ("nodes:\n  - {name: a, gpus: 2, nvlink: [[0], [0, 1]]}\n", "nodes[0].nvlink[1][0]", 2,
         "GPU 0 is in two NVLink domains"),
        ("nodes:\n  - {name: a, gpus: 2, nvlink: [0]}\n", "nodes[0].nvlink[0]", 2,
         "expected a list, got int 0"),
    ]
    for text, path, line, msg in cases:
        e = bad(text)
        assert (e.message, e.path, e.line, e.source) == (msg, path, line, "inv.yaml"), text


def test_layout_errors_word_for_word():
    head = "nodes:\n  - name: a\n    model: H100-80GB\n    gpus: 2\n    mig: [1]\n"
    cases = [
        ("    mig_layout:\n      x: [1g.10gb]\n", "nodes[0].mig_layout.x", 7,
         "mig_layout: 'x' is not a GPU index"),
        ("    mig_layout:\n      0: [1g.10gb]\n", "nodes[0].mig_layout.0", 7,
         "mig_layout: GPU 0 is not in MIG mode (mig: [1])"),
        ("    mig_layout:\n      1: [1g.10gb@]\n", "nodes[0].mig_layout.1[0]", 7,
         "'1g.10gb@': expected a profile or profile@start (e.g. 1g.10gb@6)"),
        ("    mig_layout:\n      1: [2g.99gb]\n", "nodes[0].mig_layout.1", 7,
         "H100-80GB has no MIG profile '2g.99gb' (profiles: 1g.10gb, 1g.20gb, 2g.20gb, "
         "3g.40gb, 4g.40gb, 7g.80gb)"),
        ("    mig_layout:\n      1: [1g.10gb@-1]\n", "nodes[0].mig_layout.1[0]", 7,
         "'1g.10gb@-1': expected a profile or profile@start (e.g. 1g.10gb@6)"),
        ("    mig_layout:\n      1: [7g.80gb, 1g.10gb]\n", "nodes[0].mig_layout.1", 7,
         "1g.10gb does not fit beside 7g.80gb"),
        ("    mig_layout:\n      1: [3g.40gb@2]\n", "nodes[0].mig_layout.1", 7,
         "3g.40gb does not fit at slot 2 (free slots for it: [0, 4])"),
        ("    mig_layout:\n      1: [4g.40gb, 4g.40gb@0]\n", "nodes[0].mig_layout.1", 7,
         "4g.40gb does not fit at slot 0 (free slots for it: none)"),
        ("    mig_layout: 3\n", "nodes[0].mig_layout", 6, "expected a mapping, got int 3"),
    ]
    for text, path, line, msg in cases:
        e = bad(head + text)
        assert (e.message, e.path, e.line) == (msg, path, line), text


def test_make_node_and_carve():
    n = make_node("n", "H200-141GB", 3, mig=(1, 2), rack="r", cpu_milli=5, memory_mib=6,
                  nvlink=((0, 1, 2),), mig_layout={2: (("7g.141gb", 0),), 0: (("x", 0),)})
    assert n.gpus[0] == GpuSpec(0, "H200-141GB", 143771, False, "GPU-n-0", None)
    assert n.gpus[1].mig_layout is None and n.gpus[2].mig_layout == (("7g.141gb", 0),)
    assert (n.rack, n.cpu_milli, n.memory_mib, n.nvlink) == ("r", 5, 6, ((0, 1, 2),))
    assert make_node("m", "Other", 1).gpus[0].memory_mib == 0
    assert make_node("m", "Other", 1, gpu_memory_mib=7).gpus[0].memory_mib == 7
    assert Inventory((n,)).gpu_count == 3
    assert carve("H100-80GB", []) == ()
    assert carve("H100-80GB", [("1g.10gb", None)] * 7) == tuple(
        ("1g.10gb", s) for s in (6, 5, 4, 3, 2, 1, 0))
    with pytest.raises(ValueError, match=r"^1g.10gb does not fit beside 1g.10gb, 1g.10gb"):
        carve("H100-80GB", [("1g.10gb", None)] * 8)
    assert carve("A100-40GB", [("4g.20gb", None), ("2g.10gb", None), ("1g.5gb", None)]) == (
        ("4g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6))
