"""A task of a job array finds its index in its environment: ``GPUBUDGET_ARRAY_INDEX`` and
``GPUBUDGET_ARRAY_ID`` everywhere (the service puts them in the task's env), and on Slurm
``SLURM_ARRAY_TASK_ID`` as in a Slurm array. The script only (no Slurm needed); the local
backend's run is in tests/service/test_arrays.py."""

from __future__ import annotations

from dataclasses import replace

from jupyter_gpubudget.backends.base import Launch
from jupyter_gpubudget.backends.local import ARRAY_ENV
from jupyter_gpubudget.backends.slurm import SlurmBackend
from jupyter_gpubudget.launcher.policy import SERVICE_ENV

LAUNCH = Launch(workload="a1b2_7", attempt=1, user="ann", project="astro",
                command=["python", "sweep.py"],
                placement=[{"node": "n0", "gpu": 0, "kind": "gpu", "milli": 1000}],
                env={"GPUBUDGET_ARRAY_INDEX": "7", "GPUBUDGET_ARRAY_ID": "a1b2"})


def test_the_slurm_job_script_exports_the_array_index_as_slurm_does():
    script = SlurmBackend().job_script(LAUNCH)
    assert "export SLURM_ARRAY_TASK_ID=7\n" in script
    assert "export GPUBUDGET_ARRAY_INDEX=7\n" in script
    assert "SLURM_ARRAY_TASK_ID" not in SlurmBackend().job_script(replace(LAUNCH, env={}))


def test_the_local_launcher_accepts_the_array_variables():
    assert set(ARRAY_ENV) <= SERVICE_ENV
