"""How busy a finished Slurm job's GPUs were, from Slurm's own GPU accounting (pure).

Where the cluster records GPU usage (``AccountingStorageTRES`` with ``gres/gpumem`` and
``gres/gpuutil``, gathered by ``AcctGatherProfile`` / the NVML GPU plugin on the nodes), a
job's steps carry them in sacct's TRES usage fields, as in::

    123.0|0|4500|1|billing=8,cpu=8,gres/gpu=2,mem=64G,node=1|cpu=01:12:30,energy=0,fs/disk=2012,gres/gpumem=21794M,gres/gpuutil=150,mem=1184K,pages=0,vmem=0|cpu=01:12:30,energy=0,fs/disk=2012,gres/gpumem=21794M,gres/gpuutil=150,mem=1184K,pages=0,vmem=0

(``sacct -n -P --format=`` :data:`SACCT_GPU_FIELDS`). ``gres/gpuutil`` is a percentage
summed over the step's GPUs (two GPUs fully busy: 200); ``TRESUsageInTot`` sums the step's
tasks, ``TRESUsageInAve`` is their mean. A job's busy fraction is the steps' busy
GPU-seconds (``gpuutil/100 × ElapsedRaw``, the ``extern`` step left out) over the GPU-seconds
it held (its GPUs × its own ``ElapsedRaw``), at most 1. A job none of whose steps reports
``gres/gpuutil`` (the cluster records no GPU accounting, or the job used no GPU) has no
figure (None): unknown, never 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SACCT_GPU_FIELDS = "JobID,JobName,ElapsedRaw,NTasks,AllocTRES,TRESUsageInAve,TRESUsageInTot"

_SIZE = re.compile(r"^([0-9]*\.?[0-9]+)([KMGTP]?)$")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """A job's GPU figures from sacct: busy fraction (None: unknown), the largest
    ``gres/gpumem`` of its steps (bytes, None: not recorded), its elapsed seconds."""

    job_id: str
    name: str
    busy: float | None
    gpumem_bytes: int | None
    elapsed_s: float


def parse_tres(text: str) -> dict[str, str]:
    """``cpu=8,gres/gpu=2,mem=64G`` -> {'cpu': '8', 'gres/gpu': '2', 'mem': '64G'}."""
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        key, eq, value = item.strip().partition("=")
        if eq and key:
            out[key] = value.strip()
    return out


def tres_bytes(value: str) -> int | None:
    """A TRES size (``21794M``, ``1184K``, ``4096``: bytes without a unit) in bytes."""
    m = _SIZE.match((value or "").strip())
    if m is None:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def gpus_of(alloc_tres: str) -> int:
    """GPUs a job or step holds: ``gres/gpu=N`` (else the sum of typed ``gres/gpu:T=N``)."""
    tres = parse_tres(alloc_tres)
    if "gres/gpu" in tres:
        try:
            return int(tres["gres/gpu"])
        except ValueError:
            return 0
    n = 0
    for k, v in tres.items():
        if k.startswith("gres/gpu:"):
            try:
                n += int(v)
            except ValueError:
                pass
    return n


def _num(value: str) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if x >= 0 else None


def _step_util(ntasks: str, ave: str, tot: str) -> float | None:
    """The step's ``gres/gpuutil`` summed over its tasks (percent), or None."""
    t = _num(parse_tres(tot).get("gres/gpuutil", ""))
    if t is not None:
        return t
    a = _num(parse_tres(ave).get("gres/gpuutil", ""))
    if a is None:
        return None
    n = _num(ntasks)
    return a * (n if n else 1.0)


def parse_gpu_usage(text: str) -> dict[str, GpuUsage]:
    """``sacct -n -P --format=<SACCT_GPU_FIELDS>`` lines (the job and its steps) -> per job
    id (the allocation's line, e.g. ``123`` or an array task's ``123_4``), its figures."""
    jobs: dict[str, tuple[str, float, int]] = {}  # job id -> (name, elapsed, GPUs)
    busy_s: dict[str, float] = {}
    mem: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 7:
            continue
        jid, name, elapsed, ntasks, alloc, ave, tot = parts[:7]
        base, dot, step = jid.partition(".")
        base = base.split("+", 1)[0]  # a heterogeneous job's component: its leader
        if not dot:
            el = _num(elapsed) or 0.0
            old = jobs.get(base)
            gpus = gpus_of(alloc) + (old[2] if old else 0)
            jobs[base] = (old[0] if old and old[0] else name, max(el, old[1] if old else 0),
                          gpus)
            continue
        if step == "extern":
            continue
        util = _step_util(ntasks, ave, tot)
        if util is not None:
            busy_s[base] = busy_s.get(base, 0.0) + util / 100 * (_num(elapsed) or 0.0)
        for field in (tot, ave):
            b = tres_bytes(parse_tres(field).get("gres/gpumem", ""))
            if b is not None:
                mem[base] = max(mem.get(base, 0), b)
    out = {}
    for jid, (name, elapsed, gpus) in jobs.items():
        busy = None
        if jid in busy_s and gpus > 0 and elapsed > 0:
            busy = min(1.0, busy_s[jid] / (gpus * elapsed))
        out[jid] = GpuUsage(jid, name, busy, mem.get(jid), elapsed)
    return out
