"""MPS control daemons (launcher/mps.py) and the local backend running jobs on MPS shares.

No NVIDIA driver here: a stand-in ``nvidia-cuda-mps-control`` (fake_mps_control.py: it
daemonizes, listens on its pipe directory, answers the front end and quits like the real one,
and records every call) is put on PATH, and a file stands in for the driver's
/proc/driver/nvidia/version. bench/gpu_check.py covers a real GPU machine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.backends.base import Launch
from jupyter_gpubudget.backends.mps import MpsDaemons, MpsUnavailable
from jupyter_gpubudget.inventory.nvml import discover

from ..inventory.fake_nvml import FakeNvml, hgx_h200
from ..service.test_local_backend import LocalBackend

FAKE = Path(__file__).with_name("fake_mps_control.py")


class Fake:
    def __init__(self, tmp: Path) -> None:
        self.bin = tmp / "bin"
        self.bin.mkdir()
        prog = self.bin / "nvidia-cuda-mps-control"
        shutil.copy(FAKE, prog)
        prog.chmod(0o755)
        self.driver = tmp / "driver-version"
        self.driver.write_text("NVRM version: stand-in\n")
        self.root = tmp / "mps"

    def calls(self, what: str | None = None, argv: list[str] | None = None) -> list[dict]:
        try:
            lines = (self.bin / "calls.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        out = [json.loads(x) for x in lines]
        return [c for c in out if (what is None or c["what"] == what)
                and (argv is None or c["argv"] == argv)]

    def daemons(self, **kw: object) -> MpsDaemons:
        return MpsDaemons(self.root, driver_probe=self.driver, timeout=10, **kw)  # type: ignore[arg-type]

    def kill_all(self) -> None:
        for c in self.calls("daemon"):
            try:
                os.kill(c["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def fake(tmp_path, monkeypatch):
    f = Fake(tmp_path)
    monkeypatch.setenv("PATH", f"{f.bin}:{os.environ['PATH']}")
    yield f
    f.kill_all()


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_one_daemon_per_gpu_counted_by_its_shares(fake):
    m = fake.daemons()
    assert m.missing() is None
    pipe_a = m.acquire("GPU-aaaa", "w1.1")
    assert pipe_a == str(fake.root / "GPU-aaaa" / "pipe")
    (started,) = fake.calls("daemon")
    assert started["env"] == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa",
                              "CUDA_MPS_PIPE_DIRECTORY": pipe_a,
                              "CUDA_MPS_LOG_DIRECTORY": str(fake.root / "GPU-aaaa" / "log")}
    assert _mode(fake.root / "GPU-aaaa" / "pipe") == 0o700
    assert _mode(fake.root / "GPU-aaaa" / "log") == 0o700
    assert "started for GPU-aaaa" in (fake.root / "GPU-aaaa" / "log" / "control.log").read_text()
    # a second share on the same GPU: the same daemon
    assert m.acquire("GPU-aaaa", "w2.1") == pipe_a
    assert len(fake.calls("daemon")) == 1 and m.holders("GPU-aaaa") == {"w1.1", "w2.1"}
    # another GPU: its own daemon, its own directories
    pipe_b = m.acquire("GPU-bbbb", "w3.1")
    assert pipe_b != pipe_a and len(fake.calls("daemon")) == 2
    assert fake.calls("daemon")[1]["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb"
    # the first of two shares ends: the daemon stays
    assert m.release("w1.1") == [] and m.alive("GPU-aaaa")
    assert fake.calls(argv=[]) and not any("quit" in str(c) for c in fake.calls())
    # the last one ends: quit through the same pipe directory; the other GPU's daemon stays
    assert m.release("w2.1") == ["GPU-aaaa"]
    assert not m.alive("GPU-aaaa") and m.alive("GPU-bbbb")
    assert "command quit" in (fake.root / "GPU-aaaa" / "log" / "control.log").read_text()
    assert m.release("w2.1") == []  # idempotent
    # the service restarts: the holders are still known, and the last one stops the daemon
    again = fake.daemons()
    assert again.holders("GPU-bbbb") == {"w3.1"} and again.held_by("w3.1") == ["GPU-bbbb"]
    assert again.release("w3.1") == ["GPU-bbbb"] and not again.alive("GPU-bbbb")


def test_a_dead_daemon_is_started_again(fake):
    m = fake.daemons()
    m.acquire("GPU-aaaa", "w1.1")
    assert m.ensure("GPU-aaaa") is False  # alive: nothing to do
    os.kill(fake.calls("daemon")[0]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while m.alive("GPU-aaaa"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert m.ensure("GPU-aaaa") is True
    assert len(fake.calls("daemon")) == 2 and m.alive("GPU-aaaa")
    os.kill(fake.calls("daemon")[1]["pid"], signal.SIGKILL)
    time.sleep(0.2)
    m.acquire("GPU-aaaa", "w2.1")  # a new share finds it dead too
    assert len(fake.calls("daemon")) == 3 and m.alive("GPU-aaaa")
    assert m.ensure("GPU-idle") is False  # no shares: never started


def test_without_the_program_or_the_driver_nothing_is_assumed(fake, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    m = fake.daemons()
    assert "'nvidia-cuda-mps-control' is not found on PATH (/usr/bin:/bin)" in m.missing()
    with pytest.raises(MpsUnavailable, match="is not found"):
        m.acquire("GPU-aaaa", "w1.1")
    assert not fake.root.exists() and fake.calls() == []
    monkeypatch.setenv("PATH", f"{fake.bin}:/usr/bin:/bin")
    m = MpsDaemons(fake.root, driver_probe=tmp_path / "absent")
    with pytest.raises(MpsUnavailable, match="need an NVIDIA driver.*absent is missing"):
        m.acquire("GPU-aaaa", "w1.1")
    assert fake.calls() == []


def test_a_daemon_that_does_not_start_is_an_error(fake):
    (fake.bin / "nvidia-cuda-mps-control").write_text("#!/bin/sh\necho 'no GPU found' >&2\n"
                                                      "exit 3\n")
    m = fake.daemons()
    with pytest.raises(MpsUnavailable, match=r"-d for GPU-aaaa failed \(exit status 3\): no GPU"):
        m.acquire("GPU-aaaa", "w1.1")
    assert m.holders("GPU-aaaa") == set()


def test_other_users_need_a_root_daemon(fake):
    why = fake.daemons(other_users=True).missing()
    if os.geteuid() == 0:  # the daemon runs as root: it starts each user's MPS server
        assert why is None
    else:
        assert "need the MPS control daemon to run as root" in why
    assert fake.daemons(other_users=False).missing() is None


# ---------------------------------------------------------------------- the local backend
def _wait(pred, timeout=20.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def mps_slice(gpu: int, milli: int) -> dict:
    return {"node": "n", "gpu": gpu, "kind": "mps", "milli": milli, "mig_start": -1,
            "profile": None, "gpu_memory_mib": 0}


def test_local_backend_runs_shares_under_their_gpus_daemon(fake, tmp_path):
    b = LocalBackend(state_dir=str(tmp_path / "jobs"), mps_state_dir=str(fake.root),
                     stop_grace=2)
    b.mps.driver_probe = fake.driver
    b.use_inventory(discover(FakeNvml(hgx_h200()), node_name="n").inventory)
    cmd = ["/bin/sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES $CUDA_MPS_PIPE_DIRECTORY '
           '$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"; exec sleep 60']
    b.launch(Launch("j1", 1, "bob", "p", cmd, [mps_slice(1, 250)]))
    b.launch(Launch("j2", 1, "bob", "p", cmd, [mps_slice(1, 500)]))
    pipe = fake.root / "GPU-fake-01" / "pipe"
    for w, pct in (("j1", 25), ("j2", 50)):
        _wait(lambda w=w: (tmp_path / "jobs" / w / "1" / "output.log").exists() and (
            tmp_path / "jobs" / w / "1" / "output.log").read_text())
        assert (tmp_path / "jobs" / w / "1" / "output.log").read_text().split() == [
            "GPU-fake-01", str(pipe), str(pct)]
    (daemon,) = fake.calls("daemon")
    assert daemon["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-fake-01"
    if os.geteuid() == 0:  # jobs run as other users: they reach the pipe directory
        assert _mode(pipe) == 0o711
    assert b.stop("j1", 1).alive is False and b.mps.alive("GPU-fake-01")
    assert b.stop("j2", 1).alive is False and not b.mps.alive("GPU-fake-01")
    # a job that ends by itself lets go when its end is seen
    b.launch(Launch("j3", 1, "bob", "p", ["/bin/sh", "-c", "exit 0"], [mps_slice(2, 250)]))
    _wait(lambda: not b.status("j3", 1).alive)
    assert not b.mps.alive("GPU-fake-02") and b.mps.holders("GPU-fake-02") == set()
    assert len(fake.calls("daemon")) == 2


def test_local_backend_refuses_a_share_without_the_daemon(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    b = LocalBackend(state_dir=str(tmp_path / "jobs"), mps_state_dir=str(fake.root))
    b.mps.driver_probe = fake.driver
    b.use_inventory(discover(FakeNvml(hgx_h200()), node_name="n").inventory)
    with pytest.raises(MpsUnavailable, match="MPS share on GPU-fake-01: .*is not found"):
        b.launch(Launch("j1", 1, "bob", "p", ["/bin/true"], [mps_slice(1, 250)]))
    assert not (tmp_path / "jobs" / "j1").exists()
    # a declared inventory has no GPU to run a daemon for: the share runs (no GPU visible)
    d = LocalBackend(state_dir=str(tmp_path / "jobs2"), mps_state_dir=str(fake.root))
    d.launch(Launch("j2", 1, "bob", "p", ["/bin/true"], [mps_slice(1, 250)]))
    _wait(lambda: not d.status("j2", 1).alive)
    assert d.status("j2", 1).exit_code == 0 and fake.calls() == []
