"""A deposed leader's late job, adopted by the new leader within the start grace, is charged
from when Slurm started it (sacct Start), not from when the old leader committed its start —
on the real Slurm test cluster, two service replicas (their leases, ledgers, Slurm backends
and scheduling loops) on one real PostgreSQL ledger.

The pause is the one fake, as in test_fenced_launch: the old leader's ``backend.launch`` is
held after its lease check and before sbatch until the test lets it go (a real process cannot
be stopped at that exact moment). Everything else is real: slurmctld, slurmdbd, sbatch,
squeue, sacct, PostgreSQL and its lease row.
"""

from __future__ import annotations

import subprocess
import time

from jupyter_gpubudget.service.leader import NotLeader
from tests.fixtures.postgres import postgres_server  # noqa: F401
from tests.slurm.test_fenced_launch import (
    alive_jobs,
    cycles_until,
    expire,
    paused,
    replicas,  # noqa: F401 - a fixture
    run_cycle,
    submit,
)


def sacct_start(cluster, name: str) -> tuple[str, float] | None:  # noqa: ANN001
    """(job id, Start) of the job with this name in Slurm's accounting, once it started."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "--format=JobID,JobName,State,Start",
                          "--starttime=now-1hour", "--endtime=now", f"--name={name}"],
                         env={**cluster.env, "SLURM_TIME_FORMAT": "%s"}, capture_output=True,
                         text=True, timeout=30, check=True).stdout
    for line in out.splitlines():
        jid, _, state, start = (line.split("|") + ["", "", "", ""])[:4]
        if start.strip().isdigit() and not state.startswith("PENDING"):
            return jid, float(start)
    return None


def test_a_late_job_adopted_within_the_start_grace_is_charged_from_its_slurm_start(
        replicas, slurm_accounts):  # noqa: F811
    a, b = replicas
    cluster = slurm_accounts
    a.lead()
    wid = submit(a.ledger)
    at, go = paused(a.backend, "launch")
    t, errors = run_cycle(a)
    assert at.wait(60), "the leader never launched the job"
    committed = a.ledger.open_interval(wid).start
    expire(a)  # a is paused past its lease, after its lease check, before sbatch ...
    b.lead()  # ... b takes over: attempt 1 is starting (within the start grace)
    b.cycle()
    assert b.ledger.open_interval(wid).seq == 1
    time.sleep(2.0)
    go.set()  # a's sbatch of attempt 1 goes through now, late
    t.join(60)
    assert any(isinstance(e, NotLeader) for e in errors), errors  # (a records nothing)
    name = f"gpubudget.{wid}.1"
    started = cluster.wait("the late job started in Slurm", lambda: sacct_start(cluster, name))
    cycles_until(b, lambda: alive_jobs(cluster, wid))
    b.cycle()  # (b's cycles see it running)
    row, iv = b.ledger.get(wid), b.ledger.open_interval(wid)
    assert iv.seq == 1 and alive_jobs(cluster, wid) == [name]  # adopted, not requeued
    # charged from Slurm's start of the job (whole seconds), not from the commit 2 s before
    assert iv.start == started[1] and iv.start >= committed + 1.0, (iv.start, started, committed)
    assert row.started_at == iv.start and row.backend_ref == started[0]
