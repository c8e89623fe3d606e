"""The local backend on its own: placement -> CUDA environment, survive and find again."""

from __future__ import annotations

import os
import time

from jupyter_gpubudget.backends.base import Launch
from jupyter_gpubudget.backends.local import LocalBackend as _LocalBackend
from jupyter_gpubudget.inventory.nvml import discover
from tests.fixtures.unixusers import TEMPLATE, ensure_accounts
from tests.inventory.fake_nvml import FakeNvml, hgx_h200


def LocalBackend(**kw):  # noqa: ANN003, ANN201, N802 - as root, bob's jobs run as gbt-bob
    if os.geteuid() == 0:
        ensure_accounts(["bob"])
        kw.setdefault("unix_user_template", TEMPLATE)
    return _LocalBackend(**kw)


def test_job_devices_for_whole_mig_and_mps(caplog):
    b = _LocalBackend(gpu_uuids={"n/0": "GPU-abc"})
    # a declared inventory (none given): derived ids, said once in the log
    assert b.job_devices([{"node": "n", "gpu": 1, "kind": "gpu"}, {"node": "n", "gpu": 3}]) == {
        "CUDA_VISIBLE_DEVICES": "GPU-n-1,GPU-n-3"}
    assert caplog.text.count("device ids are not CUDA ids") == 1
    assert b.job_devices([{"node": "n", "gpu": 0, "kind": "gpu"}]) == {
        "CUDA_VISIBLE_DEVICES": "GPU-abc"}  # the admin's mapping
    # a MIG slice is its instance's id, never '<gpu>/<profile>/<start>'
    env = b.job_devices([{"node": "n", "gpu": 2, "kind": "mig", "profile": "1g.18gb",
                          "mig_start": 4}])
    assert env == {"CUDA_VISIBLE_DEVICES": "MIG-n-2-1g.18gb-4"}
    b.use_inventory(discover(FakeNvml(hgx_h200()), node_name="n").inventory)
    env = b.job_devices([{"node": "n", "gpu": 6, "kind": "mig", "profile": "2g.35gb",
                          "mig_start": 4}])
    assert env == {"CUDA_VISIBLE_DEVICES": "MIG-fake-6-b"}
    env = b.job_devices([{"node": "n", "gpu": 1, "kind": "mps", "milli": 250,
                          "gpu_memory_mib": 4096}])
    assert env == {"CUDA_VISIBLE_DEVICES": "GPU-fake-01", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                   "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}
    assert b.job_devices([{"node": "n", "gpu": -1, "kind": "cpu"}]) == {"CUDA_VISIBLE_DEVICES": ""}
    assert caplog.text.count("device ids are not CUDA ids") == 1


def _wait(pred, timeout=20.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_exit_code_is_recorded_and_found_by_a_new_backend(tmp_path):
    b = LocalBackend(state_dir=str(tmp_path))
    b.launch(Launch("w1", 1, "bob", "lattice", ["/bin/sh", "-c", "exit 3"], []))
    _wait(lambda: not b.status("w1", 1).alive)
    again = LocalBackend(state_dir=str(tmp_path))  # as after a service restart
    st = again.status("w1", 1)
    assert (st.alive, st.exit_code) == (False, 3) and st.ended_at is not None


def test_stop_terminates_the_process_group_and_orphans_are_listed(tmp_path):
    b = LocalBackend(state_dir=str(tmp_path), stop_grace=5)
    b.launch(Launch("w2", 1, "bob", "lattice", ["/bin/sh", "-c", "sleep 60 & wait"], []))
    _wait(lambda: (tmp_path / "w2" / "1" / "pid").exists())
    fresh = LocalBackend(state_dir=str(tmp_path))
    assert fresh.status("w2", 1).alive
    assert fresh.orphans(set()) == [("w2", 1)] and fresh.orphans({("w2", 1)}) == []
    st = b.stop("w2", 1)
    assert not st.alive and not b.status("w2", 1).alive
    assert not b.status("never", 1).launched


def test_allowed_commands():
    b = LocalBackend(allowed_commands=["python train\\.py .*", "/usr/bin/sleep [0-9]+"])
    assert b.check_command(["/bin/sh", "-c", "python train.py --lr 1"]) is None
    assert b.check_command(["rm", "-rf", "/"]) is not None
    # a program name is resolved on the job PATH before it is matched
    assert b.resolve_command(["sleep", "3"]) == ["/usr/bin/sleep", "3"]
    assert b.check_command(["sleep", "3"]) is None
    assert b.check_command(["/usr/bin/../bin/sleep", "3"]) is None
    assert b.check_command(["/tmp/sleep", "3"]) is not None
    assert LocalBackend().check_command(["anything"]) is None
