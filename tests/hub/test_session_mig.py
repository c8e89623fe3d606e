"""Notebook sessions on MIG slices the core carved (dynamic_mig): the hub creates the instance
before the server starts, the server sees its ``MIG-<uuid>``, and every end of the server
destroys it again — only what was created for that session (hub/mig.py).

The real ``BudgetSpawner.start`` / ``poll`` / ``stop`` run, with the stand-ins of
test_session_mps.py (the service's endpoints, the server) and the NVML stand-in
(tests/inventory/fake_nvml.py: it creates and destroys instances and refuses overlapping
placements, as NVML does) for both discovery and creation."""

from __future__ import annotations

import json
import os
import socket

import pytest

from jupyter_gpubudget.hub import mig as hubmig
from jupyter_gpubudget.inventory.nvml import discover
from jupyter_gpubudget.launcher.mig import MigError

from ..inventory.fake_nvml import FakeNvml, hgx_h200
from .test_session_mps import Server, Service

NODE = socket.gethostname()  # the hub discovers its own host


def mig_slice(gpu: int, profile: str, start: int) -> dict:
    return {"node": NODE, "gpu": gpu, "kind": "mig", "profile": profile, "mig_start": start,
            "milli": 0, "gpu_memory_mib": 0}


@pytest.fixture
def nv(monkeypatch):
    gpus = hgx_h200(mig_gpus=(6,))
    gpus[5]["mig"] = []  # in MIG mode, nothing created yet
    fake = FakeNvml(gpus)
    monkeypatch.setattr(hubmig, "NVML", fake)
    return fake


def instances(nv: FakeNvml, gpu: int) -> list[tuple[str, int, str]]:
    return [(m.profile, m.start, m.uuid)
            for m in discover(nv, node_name=NODE, dynamic_mig=True).mig_instances
            if m.gpu == gpu]


def spawner(tmp_path, service: Service, **kw: object):  # noqa: ANN001, ANN201
    import types

    from jupyter_gpubudget.hub.spawner import BudgetSpawner

    kw = {"heartbeat_interval": 3600, "idle_limit": 0, "snapshot_on_preempt": False,
          "dynamic_mig": True, "mig_state_dir": str(tmp_path / "mig"),
          "mps_state_dir": str(tmp_path / "mps"), **kw}
    sp = BudgetSpawner(user=types.SimpleNamespace(name="alice", url="/user/alice/"),
                       backend_spawner_class=Server, **kw)
    sp.user_options = {"project": "astro", "slice": "mig:3g.71gb"}
    sp.api = service  # type: ignore[method-assign]
    return sp


needs_root = pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                reason="creating MIG instances is the root hub's")


@needs_root
async def test_a_session_runs_on_an_instance_created_for_it(nv, tmp_path):
    service = Service([mig_slice(5, "3g.71gb", 4)])
    sp = spawner(tmp_path, service)
    await sp.start()
    assert instances(nv, 5) == [("3g.71gb", 4, "MIG-fake-5-gi0")]
    assert sp.child.seen["CUDA_VISIBLE_DEVICES"] == "MIG-fake-5-gi0"
    rec = tmp_path / "mig" / "session-s1.json"
    assert [r["uuid"] for r in json.loads(rec.read_text())] == ["MIG-fake-5-gi0"]
    # the hub restarts: the spawner from its database destroys what the old process made
    state = sp.get_state()
    sp._watch_task.cancel()
    again = spawner(tmp_path, service)
    again.load_state(state)
    await again.stop()
    assert instances(nv, 5) == [] and not rec.exists()
    assert service.sessions["s1"]["state"] == "ended"
    await again.stop()  # idempotent
    assert len(instances(nv, 6)) == 3  # the admin's layout, untouched throughout


@needs_root
async def test_a_server_that_exits_gives_its_instance_back(nv, tmp_path):
    sp = spawner(tmp_path, Service([mig_slice(5, "1g.18gb", 0)]))
    await sp.start()
    assert sp.child.seen["CUDA_VISIBLE_DEVICES"] == "MIG-fake-5-gi0"
    sp.child.running = False
    assert await sp.poll() == 0
    assert instances(nv, 5) == []


@needs_root
async def test_an_existing_instance_is_used_as_it_is(nv, tmp_path):
    sp = spawner(tmp_path, Service([mig_slice(6, "2g.35gb", 4)]))
    await sp.start()
    assert sp.child.seen["CUDA_VISIBLE_DEVICES"] == "MIG-fake-6-b"
    await sp.stop()
    assert len(instances(nv, 6)) == 3 and not (tmp_path / "mig").exists()


@needs_root
async def test_a_carve_nvml_refuses_fails_the_start_and_leaves_nothing(nv, tmp_path):
    # two slices; the second overlaps the admin's 2g.35gb: the first is destroyed again
    service = Service([mig_slice(5, "1g.18gb", 0), mig_slice(6, "1g.18gb", 5)])
    sp = spawner(tmp_path, service)
    with pytest.raises(MigError, match="MIG 1g.18gb at slot 5 of GPU-fake-06: .*slots may be "
                                       "taken"):
        await sp.start()
    assert sp.child is None
    assert service.sessions["s1"]["reason"] == "failed"
    assert instances(nv, 5) == [] and len(instances(nv, 6)) == 3


async def test_an_unprivileged_hub_refuses_saying_why(nv, tmp_path, monkeypatch):
    monkeypatch.setattr(hubmig.os, "geteuid", lambda: 1000)
    service = Service([mig_slice(5, "1g.18gb", 0)])
    sp = spawner(tmp_path, service)
    with pytest.raises(MigError, match="creating one needs root; this hub runs unprivileged"):
        await sp.start()
    assert sp.child is None and instances(nv, 5) == []
    # with dynamic_mig off the hub creates nothing: the placement names a missing instance
    off = spawner(tmp_path, Service([mig_slice(5, "1g.18gb", 0)]), dynamic_mig=False)
    off._discovery = discover(nv, node_name=NODE)
    with pytest.raises(ValueError, match="has no MIG instance 1g.18gb at slot 0"):
        await off.start()
    assert instances(nv, 5) == []
