"""A plain job that runs after another is Slurm's own dependent job on the real test
cluster: while its predecessor runs, it waits in Slurm, held, with ``afterok:<the
predecessor's Slurm id>`` (squeue's Dependency, ``%E``); the core still decides its start,
and it is then released where the core placed it and runs as that same Slurm job, charged
as sacct's Elapsed × GPUs. When its condition can no longer hold (the predecessor failed),
the service cancels it with the reason and its held Slurm job is cancelled too. Everything is
real: slurmctld, slurmdbd, sbatch, scontrol, squeue, sacct, the service's loop and ledger."""

from __future__ import annotations

import time
import uuid

from tests.slurm.test_slurm_arrays import job, service, squeue  # noqa: F401 - the fixture

ENDED = ("done", "failed", "cancelled", "lost")


def _slurm_jobs_of(cluster, wid: str) -> list[list[str]]:  # noqa: ANN001
    """squeue's alive jobs of the workload ``wid``: (id, name, state, dependency)."""
    return [r for r in squeue(cluster, "%i", "%j", "%T", "%E")
            if f".{wid}." in r[1] and r[2] in ("PENDING", "RUNNING", "COMPLETING")]


def _run_until(ledger, loop, cluster, first: str, then: str, deadline_s: float):  # noqa: ANN001, ANN202
    """Cycle until ``then`` has ended; what squeue showed of ``then`` while ``first`` ran."""
    seen: list[list[str]] = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        loop.cycle()
        if ledger.get(first).state == "running" and not seen:
            seen = _slurm_jobs_of(cluster, then)
        if ledger.get(then).state in ENDED:
            break
        time.sleep(0.5)
    return seen


def test_a_job_after_another_waits_in_slurm_with_its_dependency(service):  # noqa: F811
    ledger, loop, cluster = service
    train = job(ledger, 20, workload_id="train" + uuid.uuid4().hex[:8])
    ev = job(ledger, 2, workload_id="eval" + uuid.uuid4().hex[:8], after=([train], "afterok"))
    seen = _run_until(ledger, loop, cluster, train, ev, 180)
    tr, er = ledger.get(train), ledger.get(ev)
    assert (tr.state, er.state) == ("done", "done"), (tr.state, er.state, er.reason)
    # while train ran, eval waited in Slurm: pending, on train's Slurm job
    assert len(seen) == 1, seen
    sid, _name, state, dep = seen[0]
    assert state == "PENDING" and dep.startswith(f"afterok:{tr.backend_ref}"), seen
    # the core started it: that same Slurm job ran, under the attempt's name
    assert er.backend_ref == sid, (er.backend_ref, sid)
    out = cluster.run("sacct", "-X", "-n", "-P", "--format=JobID,JobName,State,ElapsedRaw,"
                      "AllocTRES", f"--name=gpubudget.{ev}.1", "--starttime=now-1hour",
                      "--endtime=now")
    (rec,) = [r for r in (line.split("|") for line in out.splitlines()) if r[0]]
    jid, name, st, elapsed, tres = rec
    assert (jid, name, st) == (sid, f"gpubudget.{ev}.1", "COMPLETED"), rec
    gpus = int(dict(x.split("=", 1) for x in tres.split(","))["gres/gpu"])
    (charge,) = [c for c in ledger.charges() if c.workload == ev]
    charged = (charge.end - charge.start) * charge.milli / 1000
    assert abs(charged - int(elapsed) * gpus) <= 1.0, (charged, elapsed, gpus)
    assert not _slurm_jobs_of(cluster, ev)


def test_a_job_whose_predecessor_failed_is_cancelled_in_slurm_too(service):  # noqa: F811
    ledger, loop, cluster = service
    train = ledger.submit(project="astro", user="gpb-ben", kind="batch",
                          request={"kind": "gpu", "gpus": 1}, now=time.time(),
                          command=["/bin/sh", "-c", "sleep 12; exit 3"], time_limit=600,
                          backend="slurm", workload_id="bad" + uuid.uuid4().hex[:8]).id
    ev = job(ledger, 2, workload_id="eval" + uuid.uuid4().hex[:8], after=([train], "afterok"))
    seen = _run_until(ledger, loop, cluster, train, ev, 180)
    assert len(seen) == 1 and seen[0][2] == "PENDING", seen
    er = ledger.get(ev)
    assert ledger.get(train).state == "failed"
    assert er.state == "cancelled" and train in (er.reason or ""), (er.state, er.reason)

    def gone() -> bool:
        loop.cycle()
        return not _slurm_jobs_of(cluster, ev)

    cluster.wait("the held job gone from Slurm", gone, 60, interval=1.0)
