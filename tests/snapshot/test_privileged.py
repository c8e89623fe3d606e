"""The privileged CRIU verbs for an *unprivileged* caller, as sudo runs them (``$SUDO_UID``),
with the real CRIU: a caller dumps and resumes only its own processes, the images go to a
directory chosen by the privileged side, every dump is sealed, and a restore is refused for
images that were changed, not sealed, or sealed for another account. (The process is a plain
``sleep`` of the ``nobody`` account: this machine's Python is not readable by other accounts.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpubudget.snapshot.privcall import Privileged, PrivilegedError

NOBODY = 65534


def as_caller(uid: int) -> Privileged:
    """The privileged verbs as sudo would run them for ``uid`` (this test runs as root)."""
    return Privileged(command_prefix=["env", f"SUDO_UID={uid}"])


@pytest.fixture
def sleeper():
    p = subprocess.Popen(["sleep", "600"], user=NOBODY, group=NOBODY, start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    yield p
    p.kill()
    p.wait()


def _owner(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid


def test_unprivileged_caller_own_processes_sealed_images(criu_bin, sleeper, tmp_path):
    nobody = as_caller(NOBODY)
    # not its process
    with pytest.raises(PrivilegedError) as e:
        nobody.call("criu-dump", pid=os.getpid())
    assert e.value.reason == "not_a_kernel" and f"uid {NOBODY}" in e.value.message
    # it may not choose where root writes
    with pytest.raises(PrivilegedError) as e:
        nobody.call("criu-dump", pid=sleeper.pid, images_dir=str(tmp_path / "x"))
    assert e.value.reason == "bad_input" and e.value.message.startswith("images_dir:")
    # its own process: dumped into a directory chosen for it, handed to it, sealed
    out = nobody.call("criu-dump", pid=sleeper.pid, keep_stopped=True)
    images = Path(out["images_dir"])
    try:
        assert len(out["seal"]) == 64 and images.stat().st_uid == NOBODY
        assert all(p.stat().st_uid == NOBODY for p in images.iterdir())
        nobody.call("criu-finish", pid=sleeper.pid, kill=True)
        sleeper.wait(10)
        # changed images are refused
        bad = tmp_path / "bad"
        shutil.copytree(images, bad)
        core = next(bad.glob("core-*.img"))
        data = bytearray(core.read_bytes())
        data[-1] ^= 0xFF
        core.write_bytes(bytes(data))
        with pytest.raises(PrivilegedError) as e:
            nobody.call("criu-restore", images_dir=str(bad), seal=out["seal"])
        assert e.value.reason == "bad_input" and "seal" in e.value.message
        # no seal, or another account's
        with pytest.raises(PrivilegedError) as e:
            nobody.call("criu-restore", images_dir=str(images))
        assert e.value.message.startswith("seal:")
        with pytest.raises(PrivilegedError) as e:
            as_caller(NOBODY - 1).call("criu-restore", images_dir=str(images),
                                            seal=out["seal"])
        assert "seal" in e.value.message
        # its own, unchanged: restored, as its own account, the same program
        pid = nobody.call("criu-restore", images_dir=str(images), seal=out["seal"])["pid"]
        try:
            assert _owner(pid) == NOBODY
            assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"
        finally:
            os.kill(pid, 9)
        # the images it was given were never what root restored (a private copy was)
        assert images.exists() and not (images / "restored.pid").exists()
    finally:
        shutil.rmtree(images, ignore_errors=True)


def test_the_seal_key_is_roots_own(criu_bin, tmp_path):
    """Under sudo the key's location cannot be chosen by the caller."""
    env = {**os.environ, "SUDO_UID": str(NOBODY), "GPUBUDGET_SEAL_KEY": str(tmp_path / "k")}
    code = ("from jupyter_gpubudget.snapshot import criu; import os; criu._seal_key(); "
            f"print(os.path.exists({str(tmp_path / 'k')!r}))")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert p.stdout.strip() == "False", p.stderr
    assert os.stat("/var/lib/jupyter-gpubudget/criu-seal.key").st_mode & 0o077 == 0


def test_privileged_answers_json_errors_never_tracebacks(tmp_path):
    p = subprocess.run([sys.executable, "-m", "jupyter_gpubudget.snapshot.privileged",
                        "criu-restore", "--images-dir", str(tmp_path / "none")],
                       capture_output=True, text=True, timeout=60)
    out = json.loads(p.stdout)
    assert p.returncode == 2 and out["error"] in ("bad_input", "no_criu"), out
    assert "Traceback" not in p.stderr
