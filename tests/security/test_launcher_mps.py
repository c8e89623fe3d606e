"""MPS shares of batch jobs under sudo isolation: the jobs run as their users'
accounts, whose MPS servers only a root control daemon can start, and the service is an
unprivileged user. So the privileged launcher runs the daemons (``mps-acquire``,
``mps-release``, ``mps-ensure``), with directories and program from its root-owned config;
the service names only the share and the GPUs, and those are checked like any other input.

No NVIDIA driver here: the stand-in ``tests/backends/fake_mps_control.py`` (it records every
call, with its uid) sits in a root-owned directory named by the config, and a file stands in
for the driver's /proc/driver/nvidia/version."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.hub import demo_setup
from tests.fixtures.unixusers import PREFIX, ensure_accounts, shared_tmp

from .conftest import require_root
from .test_file_modes import as_user

PY = sys.executable
BOB = PREFIX + "bob"
ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "backends" / "fake_mps_control.py"
GPU = "GPU-fake-01"


class Setup:
    def __init__(self) -> None:
        self.svc = demo_setup.ensure_service_user()
        ensure_accounts(["bob"])
        self.base = shared_tmp("gpubudget-launcher-mps-")
        self.jobs = self.base / "jobs"
        self.bin = self.base / "bin"
        self.bin.mkdir(mode=0o755)
        self.control = self.bin / "nvidia-cuda-mps-control"
        shutil.copy(FAKE, self.control)
        self.control.chmod(0o755)
        self.driver = self.base / "driver-version"
        self.driver.write_text("NVRM version: stand-in\n")
        self.mps = self.base / "mps"
        self.cfg = demo_setup.launcher_config(self.base, self.jobs, demo_setup.SERVICE_USER)
        self.write_config()

    def write_config(self, **extra: str) -> None:
        cfg = json.loads(self.cfg.read_text())
        cfg.update({"mps_root": str(self.mps), "mps_control": str(self.control),
                    "mps_driver_probe": str(self.driver), **extra})
        self.cfg.write_text(json.dumps(cfg))

    def calls(self, what: str | None = None) -> list[dict]:
        try:
            lines = (self.bin / "calls.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        return [c for c in map(json.loads, lines) if what is None or c["what"] == what]

    def kill_daemons(self) -> None:
        for c in self.calls("daemon"):
            try:
                os.kill(c["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass

    def sudo(self, *argv: str, timeout: float = 60) -> tuple[int, dict]:
        """The launcher as the service's account runs it: ``sudo -n`` with the pinned config."""
        r = subprocess.run(
            ["setpriv", f"--reuid={demo_setup.SERVICE_USER}",
             f"--regid={demo_setup.SERVICE_USER}", "--init-groups", "--", "sudo", "-n", PY,
             "-I", "-m", "jupyter_gpubudget.launcher", "--config", str(self.cfg), *argv],
            input=b"{}", capture_output=True, cwd="/", timeout=timeout,
            env={"PATH": "/usr/bin:/bin"})
        lines = r.stdout.decode().strip().splitlines()
        assert lines, (r.returncode, r.stderr.decode())
        return r.returncode, json.loads(lines[-1])


@pytest.fixture(scope="module")
def setup():
    require_root()
    s = Setup()
    dropin = demo_setup.install_sudoers(demo_setup.SERVICE_USER, PY, s.cfg)
    try:
        yield s
    finally:
        dropin.unlink(missing_ok=True)
        s.kill_daemons()


def test_the_launcher_runs_one_root_daemon_per_gpu_for_the_services_shares(setup):
    rc, out = setup.sudo("mps-acquire", "w1.1", GPU)
    pipe = setup.mps / GPU / "pipe"
    assert rc == 0 and out == {"pipes": {GPU: str(pipe)}}, out
    rc, out = setup.sudo("mps-acquire", "w2.1", GPU)
    assert rc == 0 and out == {"pipes": {GPU: str(pipe)}}, out
    (daemon,) = setup.calls("daemon")  # one daemon for both shares, run as root
    assert daemon["uid"] == 0
    assert daemon["env"] == {"CUDA_VISIBLE_DEVICES": GPU, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
                             "CUDA_MPS_LOG_DIRECTORY": str(setup.mps / GPU / "log")}
    # the jobs' users reach the pipe directory; nobody but root lists or changes the holders
    for d, mode in ((setup.mps, 0o711), (pipe, 0o711), (setup.mps / GPU / "holders", 0o700),
                    (setup.mps / GPU / "log", 0o700)):
        st = d.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, mode), d
    assert as_user(BOB, ["test", "-x", str(pipe)]).returncode == 0  # bob reaches the pipe
    assert as_user(BOB, ["ls", str(setup.mps)]).returncode != 0  # but lists nothing
    listing = as_user(demo_setup.SERVICE_USER, ["ls", str(setup.mps / GPU / "holders")])
    assert listing.returncode != 0 and not listing.stdout
    # supervision: a daemon that died is started again for the shares still holding it
    setup.kill_daemons()
    rc, out = setup.sudo("mps-ensure", "w1.1")
    assert rc == 0 and out == {"restarted": [GPU]}, out
    assert len(setup.calls("daemon")) == 2
    rc, out = setup.sudo("mps-ensure", "w1.1")
    assert rc == 0 and out == {"restarted": []}, out
    # the daemon stops with its last share, and only then
    rc, out = setup.sudo("mps-release", "w1.1")
    assert rc == 0 and out == {"stopped": []}, out
    rc, out = setup.sudo("mps-release", "w2.1")
    assert rc == 0 and out == {"stopped": [GPU]}, out
    assert setup.calls("call")[-1]["uid"] == 0  # the quit came from root
    rc, out = setup.sudo("mps-release", "w2.1")  # again: nothing left to do
    assert rc == 0 and out == {"stopped": []}, out


@pytest.mark.parametrize("argv", [
    ["mps-acquire", "../../etc", GPU],
    ["mps-acquire", "w.1", "GPU-../../../etc"],
    ["mps-acquire", "w.1", "0"],
    ["mps-acquire", "w.1", "GPU-a;touch /tmp/x"],
    ["mps-acquire", "w.1"],
    ["mps-acquire", "w.1", GPU, GPU],
    ["mps-acquire", "w.1", *[f"GPU-{i}" for i in range(65)]],
    ["mps-release", "a/b"],
    ["mps-release", "w.1", "extra"],
    ["mps-ensure", ".hidden"],
])
def test_hostile_arguments_are_refused_and_start_nothing(setup, argv):
    before = len(setup.calls())
    rc, out = setup.sudo(*argv)
    assert rc == 2 and "error" in out, out
    assert len(setup.calls()) == before
    assert not any(p.name.startswith(".") or "etc" in p.name for p in setup.mps.glob("*"))


def test_mps_paths_anyone_but_root_could_change_are_refused(setup):
    own = shared_tmp("gpubudget-mps-owned-")
    os.chown(own, setup.svc.pw_uid, setup.svc.pw_gid)  # the service's account owns it
    try:
        for extra in ({"mps_root": str(own / "mps")},
                      {"mps_control": str(own / "nvidia-cuda-mps-control")}):
            if "mps_control" in extra:
                shutil.copy(FAKE, own / "nvidia-cuda-mps-control")
                (own / "nvidia-cuda-mps-control").chmod(0o755)
            setup.write_config(**extra)
            before = len(setup.calls())
            rc, out = setup.sudo("mps-acquire", "w9.1", GPU)
            assert rc == 2 and "root" in out["error"], (extra, out)
            assert len(setup.calls()) == before and not (own / "mps").exists()
        # no driver: said, nothing started
        setup.write_config(mps_driver_probe=str(setup.base / "no-driver"))
        rc, out = setup.sudo("mps-acquire", "w9.1", GPU)
        assert rc == 2 and "need an NVIDIA driver" in out["error"], out
    finally:
        setup.write_config()


BACKEND = r"""
import json, sys, time
from jupyter_gpubudget.backends.base import Launch
from jupyter_gpubudget.backends.local import LocalBackend
from jupyter_gpubudget.inventory.nvml import discover
from tests.inventory.fake_nvml import FakeNvml, hgx_h200

cfg, py, user, out = sys.argv[1:5]
b = LocalBackend(launcher_config=cfg, launcher_python=py, stop_grace=2, mps_check_interval=0)
assert b.isolation == "sudo", b.isolation
b.use_inventory(discover(FakeNvml(hgx_h200()), node_name="n").inventory)
share = {"node": "n", "gpu": 1, "kind": "mps", "milli": 250, "mig_start": -1, "profile": None,
         "gpu_memory_mib": 0}
cmd = ["/bin/sh", "-c", 'echo "$(id -u) $CUDA_VISIBLE_DEVICES $CUDA_MPS_PIPE_DIRECTORY" > '
       + out + '; exec sleep 60']
b.launch(Launch("m1", 1, user, "p", cmd, [share]))
deadline = time.monotonic() + 30
while not b.status("m1", 1).alive:
    assert time.monotonic() < deadline
    time.sleep(0.1)
print(json.dumps({"alive": b.status("m1", 1).alive}), flush=True)
sys.stdin.readline()  # the test kills the daemon, then lets the supervision run
print(json.dumps({"alive": b.status("m1", 1).alive}), flush=True)
print(json.dumps({"stop_alive": b.stop("m1", 1).alive}), flush=True)
"""


def test_the_local_backend_under_sudo_runs_a_share_under_a_root_daemon(setup):
    """The real path: the service (its own account) launches a job of bob's on an MPS share;
    the daemon is root's, the job runs as bob with that daemon's pipe, a dead daemon is
    started again while the job runs, and it quits when the job is stopped."""
    (setup.base / "outdir").mkdir()
    (setup.base / "outdir").chmod(0o777)
    out = setup.base / "outdir" / "share-env"
    before = len(setup.calls("daemon"))
    proc = subprocess.Popen(
        ["setpriv", f"--reuid={demo_setup.SERVICE_USER}", f"--regid={demo_setup.SERVICE_USER}",
         "--init-groups", "--", PY, "-c", BACKEND, str(setup.cfg), PY, BOB, str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
        env={"PATH": f"{Path(PY).parent}:/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert json.loads(line or b"{}") == {"alive": True}, proc.stderr.read() if not line \
            else line
        deadline = time.monotonic() + 20
        while not (out.exists() and out.read_text().strip()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pipe = setup.mps / GPU / "pipe"
        assert out.read_text().split() == [str(pwd.getpwnam(BOB).pw_uid), GPU, str(pipe)]
        daemons = setup.calls("daemon")[before:]
        assert len(daemons) == 1 and daemons[0]["uid"] == 0
        setup.kill_daemons()
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline()) == {"alive": True}
        assert len(setup.calls("daemon")[before:]) == 2  # started again by the supervision
        assert json.loads(proc.stdout.readline()) == {"stop_alive": False}
        assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
        assert not (setup.mps / GPU / "holders" / "m1.1").exists()
        front = setup.calls("call")
        assert front and front[-1]["uid"] == 0  # the quit came from root too
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("key", ["mps_root", "mps_control", "mps_driver_probe"])
def test_mps_settings_are_absolute_paths(key):
    from jupyter_gpubudget.launcher.config import LauncherError, make_config

    for bad in ("relative/dir", 7, "/a\x00b"):
        with pytest.raises(LauncherError, match=key):
            make_config("/var/lib/gpubudget/jobs", {key: bad})
    assert make_config("/var/lib/gpubudget/jobs").mps_root == Path("/var/lib/gpubudget/mps")


def test_the_launcher_runs_the_standard_library_and_itself_only():
    """What root executes when the service calls the launcher (MPS verbs included)."""
    r = subprocess.run([PY, "-I", "-c", "import sys; before = set(sys.modules)\n"
                        "import jupyter_gpubudget.launcher.__main__\n"
                        "print('\\n'.join(sorted(set(sys.modules) - before)))"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    foreign = [m for m in r.stdout.split() if m.split(".")[0] not in sys.stdlib_module_names
               and m != "jupyter_gpubudget" and not m.startswith("jupyter_gpubudget.launcher")]
    assert foreign == [] and "jupyter_gpubudget.launcher.mps" in r.stdout.split()
