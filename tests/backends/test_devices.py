"""The one placement -> devices builder (backends/devices.py): exact environments for a whole
GPU, MIG instances with and without NVML UUIDs, MPS shares and a multi-GPU gang on one node."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.backends import devices as dev
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.inventory.nvml import discover

from ..inventory.fake_nvml import FakeNvml, hgx_h200


def gpu(i: int, node: str = "hgx-1") -> dict:
    return {"node": node, "gpu": i, "kind": "gpu", "milli": 1000, "mig_start": -1,
            "profile": None}


def mig(i: int, profile: str, start: int, node: str = "hgx-1") -> dict:
    return {"node": node, "gpu": i, "kind": "mig", "milli": 143, "mig_start": start,
            "profile": profile}


def mps(i: int, milli: int, mem: int = 0, node: str = "hgx-1") -> dict:
    return {"node": node, "gpu": i, "kind": "mps", "milli": milli, "mig_start": -1,
            "profile": None, "gpu_memory_mib": mem}


@pytest.fixture(scope="module")
def nvml_devices() -> dev.DeviceMap:
    return dev.device_map(discover(FakeNvml(hgx_h200()), node_name="hgx-1").inventory)


DECLARED = load_inventory("nodes: [{name: hgx-1, model: H200-141GB, gpus: 8, mig: [6, 7], "
                          "mig_layout: [3g.71gb, 2g.35gb, 1g.18gb]}]\n")


def test_whole_gpu_gets_its_nvml_uuid(nvml_devices):
    out = dev.build([gpu(3)], nvml_devices)
    assert out.env == {"CUDA_VISIBLE_DEVICES": "GPU-fake-03"}
    assert out.ids == ("GPU-fake-03",) and not out.declared and out.mps_gpus == ()


def test_mig_instance_gets_the_instance_uuid_not_the_gpus(nvml_devices):
    out = dev.build([mig(6, "2g.35gb", 4)], nvml_devices)
    assert out.env == {"CUDA_VISIBLE_DEVICES": "MIG-fake-6-b"} and not out.declared
    assert dev.build([mig(7, "1g.18gb", 6)], nvml_devices).ids == ("MIG-fake-7-c",)


def test_nvml_inventory_never_makes_an_id_up(nvml_devices):
    # an instance that does not exist (e.g. dynamic_mig carved it) and a GPU that is not there
    with pytest.raises(dev.DeviceError, match="GPU 6 has no MIG instance 1g.18gb at slot 5"):
        dev.build([mig(6, "1g.18gb", 5)], nvml_devices)
    with pytest.raises(dev.DeviceError, match="node hgx-1 has no GPU 9"):
        dev.build([gpu(9)], nvml_devices)
    with pytest.raises(dev.DeviceError, match="no GPU 0"):
        dev.build([gpu(0, node="elsewhere")], nvml_devices)


def test_declared_inventory_gets_stable_derived_ids():
    devices = dev.device_map(DECLARED)
    out = dev.build([gpu(3), mig(6, "1g.18gb", 6)], devices)
    assert out.env == {"CUDA_VISIBLE_DEVICES": "GPU-hgx-1-3,MIG-hgx-1-6-1g.18gb-6"}
    assert out.declared
    # the same without any inventory (the spawner with a declared service inventory)
    assert dev.build([gpu(3), mig(6, "1g.18gb", 6)]).env == out.env
    assert "not CUDA ids" in dev.DECLARED_NOTE


def test_admin_overrides_name_real_gpus_of_a_declared_inventory():
    devices = dev.device_map(DECLARED, {("hgx-1", 3): "GPU-4f1c6a2e"})
    out = dev.build([gpu(3)], devices)
    assert out.env == {"CUDA_VISIBLE_DEVICES": "GPU-4f1c6a2e"} and not out.declared
    out = dev.build([gpu(3), gpu(4)], devices)
    assert out.ids == ("GPU-4f1c6a2e", "GPU-hgx-1-4") and out.declared


def test_mps_share(nvml_devices):
    out = dev.build([mps(2, 250, 4096)], nvml_devices)
    assert out.env == {"CUDA_VISIBLE_DEVICES": "GPU-fake-02",
                       "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                       "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}
    assert out.mps_gpus == ("GPU-fake-02",)
    # with the GPU's control daemon: its pipe directory
    out = dev.build([mps(2, 333)], nvml_devices, {"GPU-fake-02": "/var/lib/gb/mps/GPU-fake-02/pipe"})
    assert out.env == {"CUDA_VISIBLE_DEVICES": "GPU-fake-02",
                       "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "33",
                       "CUDA_MPS_PIPE_DIRECTORY": "/var/lib/gb/mps/GPU-fake-02/pipe"}
    assert dev.build([mps(0, 3, node="n")]).env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"


def test_mps_share_needs_its_daemon_when_daemons_are_run(nvml_devices):
    with pytest.raises(dev.DeviceError, match="no MPS control daemon runs for GPU-fake-02"):
        dev.build([mps(2, 250)], nvml_devices, {})
    with pytest.raises(dev.DeviceError, match="MPS shares on 2 GPUs"):
        dev.build([mps(2, 250), mps(3, 250)], nvml_devices, {"GPU-fake-02": "/a",
                                                            "GPU-fake-03": "/b"})


def test_multi_gpu_gang_on_one_node(nvml_devices):
    out = dev.build([gpu(0), gpu(1), gpu(2), gpu(3)], nvml_devices)
    assert out.env == {"CUDA_VISIBLE_DEVICES": "GPU-fake-00,GPU-fake-01,GPU-fake-02,GPU-fake-03"}
    out = dev.build([gpu(5), mig(7, "3g.71gb", 0), mps(1, 500, 1024)], nvml_devices)
    assert out.env == {"CUDA_VISIBLE_DEVICES": "GPU-fake-05,MIG-fake-7-a,GPU-fake-01",
                       "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
                       "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "2=1024M"}
    with pytest.raises(dev.DeviceError, match="GPU-fake-05 appears twice"):
        dev.build([gpu(5), gpu(5)], nvml_devices)


def test_cpu_only_hides_every_gpu(nvml_devices):
    cpu = {"node": "hgx-1", "gpu": -1, "kind": "cpu", "milli": 0}
    assert dev.build([cpu], nvml_devices).env == {"CUDA_VISIBLE_DEVICES": ""}
    assert dev.build([]).env == {"CUDA_VISIBLE_DEVICES": ""}
