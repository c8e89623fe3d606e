"""BudgetSpawner's pure parts: placement -> environment, slice choices and options, the spawn
form, GPU-idle measurement with a fake NVML, and the entry point / traitlets help."""

from __future__ import annotations

import re
import types

import pytest
from jupyterhub.spawner import LocalProcessSpawner
from traitlets import TraitError

from jupyter_gpubudget.backends.devices import DeviceError
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.core.offer import slice_choices
from jupyter_gpubudget.hub.idle import gpu_busy
from jupyter_gpubudget.hub.placement import describe, placement_env
from jupyter_gpubudget.hub.spawner import BudgetSpawner, normalise_slice
from jupyter_gpubudget.inventory.nvml import discover
from jupyter_gpubudget.service.handlers.sessions import check_offered
from jupyter_gpubudget.service.validate import Invalid, parse_session, request_from_choice

from ..inventory import fake_nvml

GPU = {"node": "n1", "gpu": 3, "kind": "gpu", "milli": 1000, "mig_start": -1, "profile": None}
MIG = {"node": "n1", "gpu": 6, "kind": "mig", "milli": 143, "mig_start": 2, "profile": "1g.10gb"}
MPS = {"node": "n2", "gpu": 0, "kind": "mps", "milli": 250, "mig_start": -1, "profile": None,
       "gpu_memory_mib": 4096}
CPU = {"node": "n1", "gpu": -1, "kind": "cpu", "milli": 0}


def test_declared_inventory_gets_stable_derived_ids():
    env = placement_env([GPU, MIG])
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-n1-3,MIG-n1-6-1g.10gb-2"
    assert placement_env([GPU])["CUDA_VISIBLE_DEVICES"] == "GPU-n1-3"  # same every time


def test_mps_share_sets_the_mps_variables():
    env = placement_env([MPS])
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-n2-0"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"


def test_cpu_only_hides_every_gpu():
    assert placement_env([CPU])["CUDA_VISIBLE_DEVICES"] == ""
    assert placement_env([])["CUDA_VISIBLE_DEVICES"] == ""


def test_nvml_discovery_gives_real_uuids():
    disc = discover(fake_nvml.FakeNvml(fake_nvml.hgx_h200()), node_name="n1")
    mig = {**MIG, "profile": "1g.18gb", "mig_start": 6}
    assert placement_env([GPU, mig], disc)["CUDA_VISIBLE_DEVICES"] == "GPU-fake-03,MIG-fake-6-c"
    with pytest.raises(DeviceError, match="no MIG instance 1g.10gb at slot 2"):
        placement_env([MIG], disc)  # not in NVML's layout: never a made-up id


def test_describe():
    assert describe([MIG]) == "n1 GPU 6 MIG 1g.10gb"
    assert describe([GPU, MPS]) == "n1 GPU 3, n2 GPU 0 MPS 25%"
    assert describe(None) == "CPU only"


DEMO_INV = """\
nodes:
  - {name: a, model: H100-80GB, gpus: 8, mig: [6, 7]}
  - {name: b, model: H100-80GB, gpus: 8}
"""


def test_slice_choices_follow_the_inventory():
    keys = [c["key"] for c in slice_choices(load_inventory(DEMO_INV))]
    assert keys[:5] == ["cpu", "gpu:1", "gpu:2", "gpu:4", "gpu:8"]
    assert "mig:1g.10gb" in keys and "mig:7g.80gb" in keys and "mps:250" in keys
    no_mig = [c["key"] for c in slice_choices(load_inventory(
        "nodes:\n  - {name: a, model: H100-80GB, gpus: 1}\n"))]
    assert no_mig == ["cpu", "gpu:1", "mps:250", "mps:500"]


def test_requests_no_hardware_could_hold_are_refused():
    inv = load_inventory(DEMO_INV)
    check_offered(inv, request_from_choice("mig:1g.10gb"))
    check_offered(inv, request_from_choice("gpu:8"))
    for key, field, words in [("mig:9g.1gb", "slice", "offers '9g.1gb'"),
                              ("mig:1g.18gb", "slice", "offers '1g.18gb'"),
                              ("gpu:64", "gpus", "has 14 whole GPUs")]:
        with pytest.raises(Invalid) as e:
            check_offered(inv, request_from_choice(key))
        assert e.value.field == field and words in e.value.message, key


def test_choice_keys_and_user_options_become_requests():
    assert request_from_choice("cpu").kind == "cpu"
    assert request_from_choice("gpu:2").gpus == 2
    assert request_from_choice("mig:1g.10gb").profile == "1g.10gb"
    assert request_from_choice("mps:250").milli == 250
    with pytest.raises(Invalid) as e:
        request_from_choice("tpu:1")
    assert e.value.field == "slice"
    assert normalise_slice({"slice": "mig:1g.10gb"}) == {"slice": "1g.10gb"}
    assert normalise_slice({"gpus": "2"}) == {"gpus": 2}
    assert normalise_slice({}) == {"slice": "cpu"}


def test_session_body_errors_name_the_field():
    ok = parse_session({"user": "alice", "project": "p", "slice": "gpu:1", "min_runtime": "2h"})
    assert ok["request"].gpus == 1 and ok["min_runtime"] == 7200
    for body, field in [({"project": "p"}, "user"), ({"user": "a"}, "project"),
                        ({"user": "a", "project": "p", "slice": "mps:5000"}, "slice"),
                        ({"user": "a", "project": "p", "min_runtime": "soon"}, "min_runtime"),
                        ({"user": "a", "project": "p", "colour": 1}, "colour")]:
        with pytest.raises(Invalid) as e:
            parse_session(body)
        assert e.value.field == field, body


def test_form_refuses_a_project_the_user_does_not_belong_to():
    sp = BudgetSpawner.__new__(BudgetSpawner)  # no hub needed for the form logic
    BudgetSpawner.__init__(sp)
    sp._offer = {"projects": ["lattice-qcd", "astro"]}
    opts = sp.options_from_form({"project": ["astro"], "slice": ["mig:1g.10gb"],
                                 "min_runtime": ["2h"]})
    assert opts == {"project": "astro", "slice": "mig:1g.10gb", "min_runtime": "2h"}
    with pytest.raises(Exception) as e:
        sp.options_from_form({"project": ["genomics"], "slice": ["cpu"]})
    assert "not a member of project 'genomics'" in str(e.value)
    assert "lattice-qcd, astro" in str(e.value)


def test_form_and_user_options_name_a_cluster_or_none():
    sp = BudgetSpawner.__new__(BudgetSpawner)
    BudgetSpawner.__init__(sp)
    sp._offer = {"projects": ["p"], "clusters": [{"name": "ws"}, {"name": "hpc"}]}
    base = {"project": ["p"], "slice": ["gpu:1"], "min_runtime": ["1h"]}
    assert sp.options_from_form({**base, "cluster": ["hpc"]})["cluster"] == "hpc"
    assert "cluster" not in sp.options_from_form({**base, "cluster": [""]})  # soonest
    with pytest.raises(Exception) as e:
        sp.options_from_form({**base, "cluster": ["gpu-farm"]})
    assert "no cluster 'gpu-farm'" in str(e.value) and "ws, hpc" in str(e.value)
    assert normalise_slice({"slice": "gpu:1", "cluster": "hpc"}) == {"slice": "gpu:1",
                                                                     "cluster": "hpc"}
    assert normalise_slice({"gpus": 2, "cluster": ""}) == {"gpus": 2}
    with pytest.raises(Exception, match="cluster: expected a cluster's name"):
        normalise_slice({"slice": "cpu", "cluster": ["hpc"]})


class _ClusterSpawner(LocalProcessSpawner):
    pass


def test_each_cluster_gets_its_own_spawner_and_bad_entries_are_refused():
    sp = BudgetSpawner(cluster_spawners={
        "hpc": {"class": f"{__name__}._ClusterSpawner", "config": {"cmd": ["hpc-server"]}}},
        backend_spawner_config={"cmd": ["ws-server"]})
    child = sp._construct_child("ws")
    assert type(child) is LocalProcessSpawner and child.cmd == ["ws-server"]
    assert sp._construct_child("ws") is child  # kept while on the same cluster
    child = sp._construct_child("hpc")  # a start granted on hpc: hpc's own spawner
    assert type(child) is _ClusterSpawner and child.cmd == ["hpc-server"]
    assert sp.get_state()["gpubudget_cluster"] == "hpc"
    # after a hub restart the spawner comes back as the cluster's
    state = {"child_state": {"pid": 4242}, "gpubudget_cluster": "hpc"}
    again = BudgetSpawner(cluster_spawners=sp.cluster_spawners)
    again.load_state(state)
    assert type(again.child) is _ClusterSpawner and again.child.pid == 4242
    for bad, says in [({"hpc": {"class": "no.such.Spawner"}}, "cluster_spawners.hpc.class"),
                      ({"hpc": {"class": "builtins.dict"}}, "is not a JupyterHub Spawner"),
                      ({"hpc": {"class": "jupyterhub.spawner.LocalProcessSpawner",
                                "config": {"colour": 1}}},
                       "cluster_spawners.hpc.config.colour"),
                      ({"hpc": "jupyterhub.spawner.LocalProcessSpawner"}, "expected {'class'")]:
        with pytest.raises(TraitError, match=re.escape(says)):
            BudgetSpawner(cluster_spawners=bad)


class FakeNvml:
    class NVMLError(Exception):
        pass

    def __init__(self, util: dict[str, int]) -> None:
        self.util = util

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, u: str) -> str:
        if u not in self.util:
            raise self.NVMLError("not found")
        return u

    def nvmlDeviceGetUtilizationRates(self, h: str):  # noqa: ANN201
        return types.SimpleNamespace(gpu=self.util[h], memory=0)


def test_gpu_busy_from_fake_nvml():
    nv = FakeNvml({"GPU-a": 0, "GPU-b": 40})
    assert gpu_busy(["GPU-a"], 5, nv) is False
    assert gpu_busy(["GPU-a", "GPU-b"], 5, nv) is True
    assert gpu_busy(["GPU-n1-0"], 5, nv) is None  # derived demo id: NVML cannot tell
    assert gpu_busy([], 5, nv) is None


def test_gpu_busy_without_a_driver_falls_back():
    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:
            raise self.NVMLError("Driver Not Loaded")

    assert gpu_busy(["GPU-a"], 5, NoDriver({})) is None


def test_every_knob_has_help_and_the_start_timeout_covers_the_queue():
    for name, trait in BudgetSpawner.class_traits(config=True).items():
        assert trait.help, f"BudgetSpawner.{name} has no help"
    sp = BudgetSpawner.__new__(BudgetSpawner)
    BudgetSpawner.__init__(sp, max_queue_wait=600, backend_start_timeout=60)
    assert sp.start_timeout >= 660


def test_entry_point_name():
    from importlib.metadata import entry_points

    eps = {e.name: e.value for e in entry_points(group="jupyterhub.spawners")}
    if "gpubudget" not in eps:
        from tests.hub.hubproc import require

        require(False, "the jupyterhub.spawners entry point 'gpubudget' (pyproject.toml)")
    assert eps["gpubudget"] == "jupyter_gpubudget.hub:BudgetSpawner"


def test_session_endpoints_have_openapi_paths():
    from jupyter_gpubudget.service.openapi import session_paths

    paths = session_paths()
    assert set(paths) == {"/sessions/offer", "/sessions/quote", "/sessions", "/sessions/{id}",
                          "/sessions/{id}/heartbeat", "/sessions/{id}/idle",
                          "/sessions/{id}/history", "/sessions/{id}/release"}
    assert paths["/sessions"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "required"] == ["user", "project"]
