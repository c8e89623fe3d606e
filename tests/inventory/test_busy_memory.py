"""The memory a running workload's GPUs use, read by the busy sampler (``inventory/busy.py``)
for the sidebar: a whole GPU's, a MIG instance's own, an MPS share's whole GPU; nothing (None:
unknown) without a driver or where NVML cannot tell. NVML is the test fake (this machine has
no GPU): it answers ``nvmlDeviceGetMemoryInfo`` with the figures each test sets."""

from __future__ import annotations

from jupyter_gpubudget.inventory.busy import BusySampler, Running
from tests.inventory.fake_nvml import FakeNvml, hgx_h200

GIB = 2**30


def fake() -> FakeNvml:
    gpus = hgx_h200(mig_gpus=(6,))
    gpus[0]["memory_used_gib"] = 12.5
    gpus[2]["memory_used_gib"] = 40
    gpus[6]["mig"][0]["memory_used_gib"] = 3  # the 3g.71gb instance
    return FakeNvml(gpus)


def test_whole_gpu_mig_instance_and_mps_share():
    s = BusySampler(fake(), node="n1")
    whole = s.memory([{"node": "n1", "gpu": 0, "milli": 1000}])
    assert whole == [{"gpu": 0, "mig_start": None, "shared": False,
                      "used_bytes": int(12.5 * GIB), "total_bytes": 141 * GIB}]
    # a MIG instance: its own memory, not the GPU's
    mig = s.memory([{"node": "n1", "gpu": 6, "milli": 428, "mig_start": 0}])
    assert mig == [{"gpu": 6, "mig_start": 0, "shared": False, "used_bytes": 3 * GIB,
                    "total_bytes": 71 * GIB}]
    # an MPS share sees its whole GPU's memory, and says so
    mps = s.memory([{"node": "n1", "gpu": 2, "milli": 250}])
    assert mps[0]["shared"] and mps[0]["used_bytes"] == 40 * GIB
    # another node's slices are not this machine's
    assert s.memory([{"node": "n2", "gpu": 0, "milli": 1000}]) is None


def test_tick_keeps_the_latest_reading_per_workload_even_without_utilisation():
    s = BusySampler(fake(), node="n1")  # no GPU here reports utilisation: busy unknown
    run = Running("w1", [{"node": "n1", "gpu": 0, "milli": 1000}], started_at=100.0)
    assert s.tick([run], now=130.0) == []  # no busy samples ...
    at, mem = s.memory_of("w1")  # ... but the memory is known
    assert at == 130.0 and mem[0]["used_bytes"] == int(12.5 * GIB)
    s.tick([], now=160.0)  # the workload ended: forgotten
    assert s.memory_of("w1") is None


def test_no_driver_or_a_lost_gpu_is_unknown():
    s = BusySampler(FakeNvml(None), node="n1")
    assert s.memory([{"node": "n1", "gpu": 0, "milli": 1000}]) is None
    assert s.off
    gpus = hgx_h200(mig_gpus=())
    gpus[1]["lost"] = True
    s = BusySampler(FakeNvml(gpus), node="n1")
    # one slice unreadable: the workload's memory is unknown, not partly shown
    assert s.memory([{"node": "n1", "gpu": 0, "milli": 1000},
                     {"node": "n1", "gpu": 1, "milli": 1000}]) is None
