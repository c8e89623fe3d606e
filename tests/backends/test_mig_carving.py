"""dynamic_mig (carving on demand): MIG instances the core carved are created for the work through
the privileged launcher (``mig-create`` / ``mig-destroy``, launcher/mig.py) and destroyed when
it ends — only those: an admin's instances are never touched.

No GPU here: the launcher's verbs run against the NVML stand-in (tests/inventory/fake_nvml.py,
which keeps the instances it is asked to create and refuses overlapping placements and the
destruction of an instance in use, as NVML does). Through the real launcher process the
verbs meet the real ``pynvml`` and, with no driver, say so. bench/gpu_check.py reads (never
changes) MIG on a GPU machine."""

from __future__ import annotations

import io
import json
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.backends.base import Launch
from jupyter_gpubudget.backends.devices import DeviceError
from jupyter_gpubudget.inventory.nvml import discover
from jupyter_gpubudget.launcher.config import LauncherError, make_config
from jupyter_gpubudget.launcher.mig import mig_create, mig_destroy

from ..inventory.fake_nvml import FakeNvml, hgx_h200
from ..service.test_local_backend import LocalBackend as make_backend

EMPTY = "GPU-fake-05"  # in MIG mode, no instance yet
ADMIN = "GPU-fake-06"  # the admin's layout: 3g.71gb@0, 2g.35gb@4, 1g.18gb@6


def node_gpus() -> list[dict]:
    gpus = hgx_h200(mig_gpus=(6,))
    gpus[5]["mig"] = []
    return gpus


@pytest.fixture
def carving(tmp_path):
    nv = FakeNvml(node_gpus())
    cfg = make_config(str(tmp_path / "jobs"), {"dynamic_mig": True,
                                               "mig_root": str(tmp_path / "mig")})
    return nv, cfg, tmp_path / "mig"


def create(nv, cfg, *args: str) -> dict:  # noqa: ANN001
    return mig_create(cfg, list(args), io.BytesIO(), nvml=nv)


def destroy(nv, cfg, holder: str) -> dict:  # noqa: ANN001
    return mig_destroy(cfg, [holder], io.BytesIO(), nvml=nv)


def instances(nv: FakeNvml, gpu: int) -> list[tuple[str, int, str]]:
    return [(m.profile, m.start, m.uuid)
            for m in discover(nv, node_name="n", dynamic_mig=True).mig_instances if m.gpu == gpu]


def test_an_instance_is_created_for_its_holder_and_destroyed_with_it(carving):
    nv, cfg, root = carving
    assert create(nv, cfg, "w1.1", EMPTY, "1g.18gb", "2", "1") == {"uuid": "MIG-fake-5-gi0"}
    assert create(nv, cfg, "w1.1", EMPTY, "3g.71gb", "4", "4") == {"uuid": "MIG-fake-5-gi1"}
    assert instances(nv, 5) == [("1g.18gb", 2, "MIG-fake-5-gi0"), ("3g.71gb", 4, "MIG-fake-5-gi1")]
    rec = root / "w1.1.json"
    assert stat.S_IMODE(rec.stat().st_mode) == 0o600 and stat.S_IMODE(root.stat().st_mode) == 0o700
    assert [r["uuid"] for r in json.loads(rec.read_text())] == ["MIG-fake-5-gi0", "MIG-fake-5-gi1"]
    assert destroy(nv, cfg, "w1.1") == {"destroyed": ["MIG-fake-5-gi0", "MIG-fake-5-gi1"]}
    assert instances(nv, 5) == [] and not rec.exists()
    assert destroy(nv, cfg, "w1.1") == {"destroyed": []}  # nothing left: nothing done


def test_refusals_create_nothing(carving):
    nv, cfg, root = carving
    layout = instances(nv, 6)
    cases = [
        ((ADMIN, "1g.18gb", "4", "1"), "slots may be taken"),  # the admin's 2g.35gb is there
        (("GPU-fake-00", "1g.18gb", "0", "1"), "not in MIG mode"),
        ((EMPTY, "5g.50gb", "0", "4"), "has no MIG profile '5g.50gb'"),
        (("GPU-fake-99", "1g.18gb", "0", "1"), "no GPU GPU-fake-99"),
        ((EMPTY, "1g.18gb", "9", "1"), "memory slots"),
        ((EMPTY, "1g.18gb", "7", "2"), "memory slots"),
        ((EMPTY, "1g.18gb;id", "0", "1"), "profile"),
        (("../../etc", "1g.18gb", "0", "1"), "gpu"),
    ]
    for args, why in cases:
        with pytest.raises(LauncherError, match=why.replace("(", r"\(")):
            create(nv, cfg, "w2.1", *args)
    with pytest.raises(LauncherError, match="holder"):
        create(nv, cfg, "../w", EMPTY, "1g.18gb", "0", "1")
    assert instances(nv, 6) == layout and instances(nv, 5) == []
    assert not (root / "w2.1.json").exists()
    # the admin's instances are not the service's to destroy
    assert destroy(nv, cfg, "w2.1") == {"destroyed": []} and instances(nv, 6) == layout
    # carving is the admin's choice, in root's config
    off = make_config(str(root.parent / "jobs"), {"mig_root": str(root)})
    with pytest.raises(LauncherError, match="off in the launcher's config"):
        create(nv, off, "w3.1", EMPTY, "1g.18gb", "0", "1")
    assert instances(nv, 5) == []


def test_an_instance_in_use_is_kept_and_destroyed_later(carving):
    nv, cfg, root = carving
    uuid = create(nv, cfg, "w4.1", EMPTY, "2g.35gb", "0", "2")["uuid"]
    inst = nv.gpus[5]["mig"][0]
    inst["busy"] = True  # a process of the job is still on it
    with pytest.raises(LauncherError, match="still in use"):
        destroy(nv, cfg, "w4.1")
    assert instances(nv, 5) == [("2g.35gb", 0, uuid)]
    assert json.loads((root / "w4.1.json").read_text())[0]["uuid"] == uuid
    inst["busy"] = False
    assert destroy(nv, cfg, "w4.1") == {"destroyed": [uuid]} and instances(nv, 5) == []


def test_the_launcher_process_says_when_nvml_has_no_driver(tmp_path):
    cfg = tmp_path / "launcher.json"
    cfg.write_text(json.dumps({"jobs_root": str(tmp_path / "jobs"), "dynamic_mig": True,
                               "mig_root": str(tmp_path / "mig")}))
    r = subprocess.run([sys.executable, "-I", "-m", "jupyter_gpubudget.launcher", "--config",
                        str(cfg), "mig-create", "w5.1", EMPTY, "1g.18gb", "0", "1"],
                       capture_output=True, timeout=60, input=b"{}", cwd="/")
    out = json.loads(r.stdout.decode().strip().splitlines()[-1])
    if Path("/proc/driver/nvidia/version").exists():
        pytest.fail("this machine has an NVIDIA driver: run bench/gpu_check.py instead")
    assert r.returncode == 2 and "no NVIDIA driver" in out["error"], out
    assert not (tmp_path / "mig" / "w5.1.json").exists()


class CarvingBackend:
    """A local backend whose launcher's NVML is the stand-in: the MIG verbs run in this process
    (the launcher's own functions, with its config), every other verb as the real launcher
    process."""

    def __init__(self, tmp: Path, nv: FakeNvml) -> None:
        self.nv = nv
        self.cfg = make_config(str(tmp / "jobs"), {"dynamic_mig": True,
                                                   "mig_root": str(tmp / "mig")})
        self.backend = make_backend(state_dir=str(tmp / "jobs"), stop_grace=2)
        real = self.backend._launcher
        verbs = {"mig-create": mig_create, "mig-destroy": mig_destroy}

        def launcher(verb: str, *args: str, **kw: object) -> dict:
            if verb not in verbs:
                return real(verb, *args, **kw)
            try:
                return verbs[verb](self.cfg, list(args), io.BytesIO(), nvml=self.nv)
            except LauncherError as e:
                raise RuntimeError(f"launcher {verb}: {e}") from None

        self.backend._launcher = launcher  # type: ignore[method-assign]
        self.backend.use_inventory(discover(nv, node_name="n", dynamic_mig=True).inventory)


def _wait(pred, timeout: float = 20.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def mig_slice(gpu: int, profile: str, start: int) -> dict:
    return {"node": "n", "gpu": gpu, "kind": "mig", "profile": profile, "mig_start": start}


def test_the_local_backend_runs_a_job_on_an_instance_it_had_created(tmp_path):
    nv = FakeNvml(node_gpus())
    b = CarvingBackend(tmp_path, nv).backend
    cmd = ["/bin/sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"; exec sleep 60']
    b.launch(Launch("j1", 1, "bob", "p", cmd, [mig_slice(5, "3g.71gb", 0)]))
    log = tmp_path / "jobs" / "j1" / "1" / "output.log"
    _wait(lambda: log.exists() and log.read_text().strip())
    assert log.read_text().split() == ["MIG-fake-5-gi0"]
    assert instances(nv, 5) == [("3g.71gb", 0, "MIG-fake-5-gi0")]
    # an existing instance (the admin's) is used as it is, never created
    env = b.job_devices([mig_slice(6, "2g.35gb", 4)], "j9.1")
    assert env == {"CUDA_VISIBLE_DEVICES": "MIG-fake-6-b"}
    assert b.stop("j1", 1).alive is False
    _wait(lambda: not b.status("j1", 1).alive)
    assert instances(nv, 5) == []  # destroyed with its job
    assert len(instances(nv, 6)) == 3


def test_a_carve_that_fails_starts_nothing_and_leaves_nothing(tmp_path):
    nv = FakeNvml(node_gpus())
    b = CarvingBackend(tmp_path, nv).backend
    b.launch(Launch("j2", 1, "bob", "p", ["/bin/sleep", "60"], [mig_slice(5, "1g.18gb", 0)]))
    # the second slice's slots are the first's: NVML refuses, the first is destroyed again
    two = [mig_slice(5, "2g.35gb", 2), mig_slice(5, "1g.18gb", 0)]
    with pytest.raises(DeviceError, match="MIG 1g.18gb at slot 0 of GPU-fake-05: .*slots may "
                                          "be taken"):
        b.launch(Launch("j3", 1, "bob", "p", ["/bin/true"], two))
    assert not (tmp_path / "jobs" / "j3").exists()
    assert [p for p, _, _ in instances(nv, 5)] == ["1g.18gb"]  # j2's, untouched
    b.stop("j2", 1)
    assert instances(nv, 5) == []


def test_ended_attempts_are_forgotten_after_a_while(tmp_path, monkeypatch):
    """A long-running service does not remember every attempt it ever released."""
    from jupyter_gpubudget.backends import local

    monkeypatch.setattr(local, "RELEASED_KEPT", 3)
    b = CarvingBackend(tmp_path, FakeNvml(node_gpus())).backend
    calls: list[str] = []
    b.mps.release = lambda holder: calls.append(holder) or []  # type: ignore[method-assign]
    for i in range(5):
        b.release_devices(f"w{i}", 1)
    b.release_devices("w4", 1)  # remembered: not asked again
    assert calls == [f"w{i}.1" for i in range(5)]
    assert list(b._released) == ["w2.1", "w3.1", "w4.1"]
