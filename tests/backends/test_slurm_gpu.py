"""Slurm's GPU accounting read for finished jobs (``backends/slurm_gpu.py``): the busy fraction
of a job from its steps' ``gres/gpuutil``, the largest ``gres/gpumem``, and unknown (None,
never 0) for a job whose steps record none.

The real Slurm on this machine has no GPUs, so these strings are not captured from it: they
are ``sacct -n -P --format=JobID,JobName,ElapsedRaw,NTasks,AllocTRES,TRESUsageInAve,
TRESUsageInTot`` lines written in the shapes Slurm prints (the TRES usage lists of sacct's
man page — ``cpu=…,energy=…,fs/disk=…,gres/gpumem=…,gres/gpuutil=…,mem=…,pages=…,vmem=…`` —
as clusters with ``AccountingStorageTRES=gres/gpumem,gres/gpuutil`` report them; a job's
allocation line has empty usage fields, its ``batch``/``extern``/numbered steps carry them).
The real-Slurm side (a job without GPU accounting reads as unknown) is
``tests/slurm/test_gpu_busy.py``."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.backends.slurm_gpu import (
    gpus_of,
    parse_gpu_usage,
    parse_tres,
    tres_bytes,
)

AVE = ("cpu=01:12:30,energy=0,fs/disk=2012,gres/gpumem={mem},gres/gpuutil={util},mem=1184K,"
       "pages=0,vmem=0")

# a one-GPU training job: its batch step computed 90 % of its hour
ONE_GPU = "\n".join([
    "4711|gpubudget.w-1.1|3600||billing=8,cpu=8,gres/gpu=1,mem=64G,node=1||",
    "4711.batch|batch|3600|1|cpu=8,gres/gpu=1,mem=64G,node=1|"
    + AVE.format(mem="21794M", util=90) + "|" + AVE.format(mem="21794M", util=90),
    "4711.extern|extern|3600|1|billing=8,cpu=8,gres/gpu=1,mem=64G,node=1|"
    "cpu=00:00:00,energy=0,fs/disk=5329,mem=0,pages=0,vmem=0|"
    "cpu=00:00:00,energy=0,fs/disk=5329,mem=0,pages=0,vmem=0",
])

# two GPUs, two srun steps one after the other: 30 min at 150 % (of 200) then 30 min at 50 %
TWO_STEPS = "\n".join([
    "4712|gpubudget.w-2.1|3600||billing=16,cpu=16,gres/gpu:h100=2,gres/gpu=2,mem=128G,node=1||",
    "4712.batch|batch|3600|1|cpu=16,gres/gpu:h100=2,gres/gpu=2,mem=128G,node=1|"
    "cpu=00:00:03,energy=0,fs/disk=2012,mem=4K,pages=0,vmem=0|"
    "cpu=00:00:03,energy=0,fs/disk=2012,mem=4K,pages=0,vmem=0",
    "4712.0|python|1800|2|cpu=16,gres/gpu:h100=2,gres/gpu=2,mem=128G,node=1|"
    + AVE.format(mem="40G", util=75) + "|" + AVE.format(mem="80G", util=150),
    "4712.1|python|1800|1|cpu=16,gres/gpu:h100=2,gres/gpu=2,mem=128G,node=1|"
    + AVE.format(mem="12G", util=50) + "|",  # no Tot: the mean times the tasks
])

# a cluster that records no GPU accounting: the TRES usage lists have no gres/gpu* entry
NO_GPU_ACCT = "\n".join([
    "4713|gpubudget.w-3.1|600||billing=1,cpu=1,gres/gpu=1,mem=1G,node=1||",
    "4713.batch|batch|600|1|cpu=1,gres/gpu=1,mem=1G,node=1|"
    "cpu=00:09:58,energy=0,fs/disk=2012,mem=1184K,pages=0,vmem=0|"
    "cpu=00:09:58,energy=0,fs/disk=2012,mem=1184K,pages=0,vmem=0",
])


def test_tres_lists_sizes_and_gpus():
    assert parse_tres("cpu=8,gres/gpu=2,mem=64G") == {"cpu": "8", "gres/gpu": "2", "mem": "64G"}
    assert parse_tres("") == {}
    assert tres_bytes("21794M") == 21794 * 2**20
    assert tres_bytes("1184K") == 1184 * 1024 and tres_bytes("4096") == 4096
    assert tres_bytes("n/a") is None
    assert gpus_of("billing=16,cpu=16,gres/gpu:h100=2,gres/gpu=2,mem=128G,node=1") == 2
    assert gpus_of("cpu=1,gres/gpu:a100_3g.20gb=1,mem=1G") == 1  # typed only
    assert gpus_of("cpu=1,gres/gpumem=80G,gres/gpuutil=10,mem=1G") == 0  # not GPU counts


def test_one_gpu_job_busy_from_its_batch_step():
    u = parse_gpu_usage(ONE_GPU)["4711"]
    assert u.name == "gpubudget.w-1.1" and u.elapsed_s == 3600
    assert u.busy == pytest.approx(0.9)
    assert u.gpumem_bytes == 21794 * 2**20


def test_steps_summed_over_the_gpus_and_the_time_they_ran():
    u = parse_gpu_usage(TWO_STEPS)["4712"]
    # (1.5 × 1800 + 0.5 × 1800) busy GPU-seconds of 2 GPUs × 3600 s held
    assert u.busy == pytest.approx((1.5 * 1800 + 0.5 * 1800) / 7200)
    assert u.gpumem_bytes == 80 * 2**30


def test_no_gpu_accounting_is_unknown_not_zero():
    u = parse_gpu_usage(NO_GPU_ACCT)["4713"]
    assert u.busy is None and u.gpumem_bytes is None
    # a job that held no GPU has no figure either, and junk lines are skipped
    out = parse_gpu_usage("4714|cpu-job|60||cpu=1,mem=1G,node=1||\n"
                          "4714.batch|batch|60|1|cpu=1,mem=1G|" + AVE.format(mem="0", util=0)
                          + "|\nnot a line\n")
    assert out["4714"].busy is None


def test_utilisation_above_the_gpus_held_is_capped():
    text = ("5|j|100||gres/gpu=1||\n5.0|s|100|1|gres/gpu=1|"
            + AVE.format(mem="1G", util=180) + "|")
    assert parse_gpu_usage(text)["5"].busy == 1.0
