"""Busy time of a finished Slurm job from the real test cluster's accounting: this cluster
records no GPU usage (its GPUs are device files, ``AccountingStorageTRES`` has no
``gres/gpuutil``), so the job's steps carry none and its busy time stays unknown — no sample
for the ledger, never a 0. (How figures are read where a cluster records them:
``tests/backends/test_slurm_gpu.py``; how they reach the ledger: ``tests/service/
test_engine_busy.py``.)"""

from __future__ import annotations

from jupyter_gpubudget.backends.slurm_gpu import SACCT_GPU_FIELDS, parse_gpu_usage
from tests.slurm.test_backend import backend, launch, wait  # noqa: F401


def test_a_job_without_gpu_accounting_has_unknown_busy_time(backend):  # noqa: F811
    la = launch(backend, "sleep 1", [{"node": "gpu2", "gpu": 0, "kind": "gpu", "milli": 1000}])
    wait(lambda: not backend.status(la.workload, 1).alive, 30, "the job ends")
    name = f"gpubudget.{la.workload}.1"
    rec = backend.accounting([name])[0]
    # sacct has the job and its steps (the usage fields filled), but no GPU figure
    raw = wait(lambda: (out := backend._run([
        "sacct", "-n", "-P", f"--format={SACCT_GPU_FIELDS}", f"--name={name}",
        f"--starttime={backend.accounting_lookback}", "--endtime=now"]))
        and ".batch|" in out and out, 30, "the batch step's record")
    steps = [ln for ln in raw.splitlines() if ln.startswith(rec.job_id + ".")]
    assert steps and all("gres/gpuutil" not in ln for ln in steps), raw
    usage = parse_gpu_usage(raw)[rec.job_id]
    assert usage.name == name and usage.busy is None
    assert backend.gpu_busy([(la.workload, 1, rec.start, rec.end, "slurm")]) == []
