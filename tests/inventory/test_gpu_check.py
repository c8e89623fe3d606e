"""bench/gpu_check.py as a program: on a machine without an NVIDIA driver (these) it says so
and exits non-zero, checking nothing; on a GPU machine its placements' device ids are found
through NVML."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from jupyter_gpubudget.inventory.nvml import NoNvidiaDriver, discover

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def test_gpu_check_says_what_it_found():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=300)
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    try:
        discover()
    except NoNvidiaDriver as e:
        assert proc.returncode == 2
        assert proc.stderr.startswith("NO GPU: ") and "nothing was checked" in proc.stderr
        assert last == {"gpus": 0, "error": str(e)}
        return
    assert proc.returncode == 0, proc.stdout + proc.stderr  # a GPU machine
    assert last["gpus"] > 0 and last["device_ids_ok"] is True
