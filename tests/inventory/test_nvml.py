"""NVML discovery against a fake of the library (this machine has no GPU; the real library is
exercised by bench/gpu_check.py on a GPU machine), and the declared fallback."""

import pytest

from jupyter_gpubudget.core.model import SliceRequest
from jupyter_gpubudget.core.scheduler import Scheduler
from jupyter_gpubudget.inventory.nvml import NoNvidiaDriver, discover, load_inventory, model_name

from ..core.helpers import job, tree
from .fake_nvml import FakeNvml, hgx_h200


def test_model_names():
    assert model_name("NVIDIA H200", 141 * 2**30) == "H200-141GB"
    assert model_name("NVIDIA H100 80GB HBM3", 80 * 2**30) == "H100-80GB"
    assert model_name("NVIDIA A100-SXM4-40GB", 40 * 2**30) == "A100-40GB"
    assert model_name("NVIDIA A100 80GB PCIe", 80 * 2**30) == "A100-80GB"
    assert model_name("Tesla T4", 16 * 2**30) == "Tesla-T4"


def test_discovers_gpus_mig_instances_and_nvlink():
    found = discover(FakeNvml(hgx_h200()), node_name="hgx-1")
    (node,) = found.inventory.nodes
    assert found.inventory.source == "nvml" and node.name == "hgx-1"
    assert [g.mig for g in node.gpus] == [False] * 6 + [True, True]
    assert node.gpus[0].model == "H200-141GB" and node.gpus[0].uuid == "GPU-fake-00"
    assert node.nvlink == ((0, 1, 2, 3, 4, 5, 6, 7),)
    assert found.mig_uuid(6, "2g.35gb", 4) == "MIG-fake-6-b"
    assert {m.profile for m in found.mig_instances} == {"3g.71gb", "2g.35gb", "1g.18gb"}
    # the discovered inventory schedules: a 1g.18gb MIG request lands on a MIG GPU
    s = Scheduler(tree(), found.inventory)
    (d,) = s.submit(job("m", "a", req=SliceRequest.mig("1g.18gb")), 0.0)
    assert d.placement.slices[0].gpu in (6, 7)


def test_nvlink_domains_come_from_peers_and_pcie_gpus_have_none():
    # PCIe only: one domain per GPU, so a gang's default interconnect is the node, not NVLink
    pcie = [dict(g, nvlinks=0) for g in hgx_h200(mig_gpus=())][:4]
    (node,) = discover(FakeNvml(pcie), node_name="pcie").inventory.nodes
    assert node.nvlink == ((0,), (1,), (2,), (3,))
    s = Scheduler(tree(), discover(FakeNvml(pcie), node_name="pcie").inventory)
    assert s.cluster.default_interconnect == "node"
    # NVLink bridges joining pairs: two domains, not one
    pairs = [dict(g, bridge=g_i // 2) for g_i, g in enumerate(hgx_h200(mig_gpus=())[:4])]
    (node,) = discover(FakeNvml(pairs), node_name="pairs").inventory.nodes
    assert node.nvlink == ((0, 1), (2, 3))
    # a GPU without links beside linked ones is a domain of its own
    mixed = pairs[:2] + [dict(pairs[2], nvlinks=0)]
    (node,) = discover(FakeNvml(mixed), node_name="mixed").inventory.nodes
    assert node.nvlink == ((0, 1), (2,))


def test_no_driver_falls_back_to_declared(tmp_path):
    f = tmp_path / "inv.yaml"
    f.write_text("nodes: [{name: n, model: H100-80GB, gpus: 2}]\n")
    inv, msg = load_inventory(f, nvml=FakeNvml(None))
    assert inv.source == "declared" and inv.gpu_count == 2
    assert "no NVIDIA driver" in msg and str(f) in msg
    with pytest.raises(NoNvidiaDriver):
        load_inventory(None, nvml=FakeNvml(None))


def test_real_library_without_driver_is_reported_not_crashed(tmp_path):
    import pynvml  # nvidia-ml-py, a dependency
    f = tmp_path / "inv.yaml"
    f.write_text("nodes: [{name: n, gpus: 1}]\n")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        has_gpu = True
    except pynvml.NVMLError:
        has_gpu = False
    inv, msg = load_inventory(f)
    if has_gpu:
        assert inv.source == "nvml"
    else:
        assert inv.source == "declared" and "no NVIDIA driver" in msg


def test_the_mig_instances_nvml_reports_are_the_only_ones_placed_on():
    found = discover(FakeNvml(hgx_h200()), node_name="hgx-1")
    gpus = found.inventory.nodes[0].gpus
    for g in (gpus[6], gpus[7]):
        reported = {(m.profile, m.start) for m in found.mig_instances if m.gpu == g.index}
        assert g.mig_layout is not None and set(g.mig_layout) == reported
    s = Scheduler(tree(), found.inventory)
    placed = []
    for k in range(12):
        for d in s.submit(job(f"m{k}", "a", req=SliceRequest.mig("1g.18gb"), at=k), float(k)):
            sl = d.placement.slices[0]
            placed.append((sl.gpu, sl.profile, sl.mig_start))
            assert found.mig_uuid(sl.gpu, sl.profile, sl.mig_start)  # a real instance
    ones = [(m.gpu, m.profile, m.start) for m in found.mig_instances if m.profile == "1g.18gb"]
    assert sorted(placed) == sorted(ones)  # every existing 1g instance, and nothing carved
    # a profile no GPU has an instance of is never placed
    assert s.submit(job("big", "a", req=SliceRequest.mig("7g.141gb"), at=20), 20.0) == []
    # dynamic MIG: the core may carve instead
    carved = discover(FakeNvml(hgx_h200()), node_name="hgx-1", dynamic_mig=True)
    assert carved.inventory.nodes[0].gpus[6].mig_layout is None
