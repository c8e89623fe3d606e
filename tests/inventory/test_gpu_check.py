"""bench/gpu_check.py as a program: on a machine without an NVIDIA driver (these) it says so
and exits non-zero, checking nothing; on a GPU machine its placements' device ids are found
through NVML."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_gpu_check_reads_utilisation_and_gpm_as_the_busy_sampler_does():
    """Its utilisation section on the NVML fake (this machine has no GPU): a whole GPU's
    device utilisation, a MIG instance's GPM sample pair, and unknown (never 0) for a MIG
    instance on a GPU without GPM."""
    import importlib.util

    from tests.inventory.fake_nvml import FakeNvml, hgx_h200

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    gpus = hgx_h200(mig_gpus=(1, 2))[:3]
    gpus[0]["util"] = 40
    gpus[1]["mig"][0]["util"] = 75
    gpus[2]["gpm"] = False
    start = gpus[1]["mig"][0].get("start", 0)
    out = mod.utilisation("n", [0], [(1, start, "3g.71gb"), (2, start, "3g.71gb")], wait=0.01,
                          nvml=FakeNvml(gpus))
    assert out["GPU0"]["fraction"] == pytest.approx(0.4) and out["GPU0"]["source"] == "device"
    mig = f"GPU1 MIG 3g.71gb@{start}"
    assert out[mig]["fraction"] == pytest.approx(0.75) and out[mig]["source"] == "gpm"
    assert out[f"GPU2 MIG 3g.71gb@{start}"]["fraction"] is None
