"""Job arrays and dependencies are Slurm's own on the real test cluster: the service (its
ledger on SQLite, scheduling loop and Slurm backend, without HTTP) runs a job and then an
array of three tasks (``max_running: 2``) that runs after it. The array is one Slurm job
array: its tasks are ``<id>_<index>`` in squeue and sacct, each released where the core
placed it; its held tasks carry the dependency on the first job's Slurm id; each task's
ledger charge equals sacct's Elapsed × GPUs. Everything is real: slurmctld, slurmdbd,
sbatch, scontrol, squeue, sacct."""

from __future__ import annotations

import pwd
import time
import uuid
from pathlib import Path

import pytest

from jupyter_gpubudget.backends.slurm_map import array_indices
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.service.loop import SchedulingLoop
from tests.slurm.conftest import BUDGETS
from tests.slurm.test_backend import make_backend


@pytest.fixture
def service(slurm_accounts, tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    engine = connect(url)
    ledger = Ledger(engine)
    budgets = load_budgets(BUDGETS, "budgets.yaml")
    ledger.sync_budgets(budgets, time.time())
    backend = make_backend(start_grace=10)
    backend.use_ledger(ledger)
    inv = backend.discover_inventory()
    backend.use_inventory(inv)
    loop = SchedulingLoop(ledger, lambda: budgets.accounts, inv, lambda: budgets.policy,
                          backend)
    yield ledger, loop, slurm_accounts
    engine.dispose()


ECHO = 'echo "$GPUBUDGET_WORKLOAD $GPUBUDGET_ARRAY_INDEX $SLURM_ARRAY_TASK_ID"; '


def job(ledger: Ledger, secs: int, **kw) -> str:  # noqa: ANN003
    return ledger.submit(project="astro", user="gpb-ben", kind="batch",
                         request={"kind": "gpu", "gpus": 1}, now=time.time(),
                         command=["/bin/sh", "-c", f"{ECHO}sleep {secs}"],
                         env=kw.pop("env", {}), time_limit=600, backend="slurm", **kw).id


def squeue(cluster, *fmt: str) -> list[list[str]]:  # noqa: ANN001
    out = cluster.run("squeue", "-h", "-t", "all", "-o", "|".join(fmt))
    return [line.split("|") for line in out.splitlines() if line.strip()]


def test_an_array_after_a_job_is_slurms_own_and_charged_as_sacct(service):
    ledger, loop, cluster = service
    first = job(ledger, 1, workload_id="pre" + uuid.uuid4().hex[:8])
    aid = uuid.uuid4().hex[:10]
    tasks = [job(ledger, 3, workload_id=f"{aid}_{i}", array=(aid, i, 2),
                 env={"GPUBUDGET_ARRAY_INDEX": str(i), "GPUBUDGET_ARRAY_ID": aid},
                 after=([first], "afterok")) for i in range(3)]
    seen_held: list[list[str]] = []
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        loop.cycle()
        rows = {t: ledger.get(t) for t in tasks}
        if sum(r.state == "running" for r in rows.values()) == 2 and not seen_held:
            # two tasks run (max_running), the third waits held in the Slurm array
            seen_held = [r for r in squeue(cluster, "%i", "%j", "%T", "%E")
                         if r[1] == f"gpubudget.{aid}.array"]
        if all(r.state in ("done", "failed", "cancelled", "lost") for r in rows.values()):
            break
        time.sleep(0.5)
    rows = {t: ledger.get(t) for t in tasks}
    assert [r.state for r in rows.values()] == ["done"] * 3, \
        [(r.id, r.state, r.reason) for r in rows.values()]
    first_ref = ledger.get(first).backend_ref
    assert first_ref and first_ref.isdigit()
    # the array is one Slurm job array: <id>_<index>, each task under its own name
    refs = [rows[t].backend_ref for t in tasks]
    sid = refs[0].split("_")[0]
    assert refs == [f"{sid}_{i}" for i in range(3)], refs
    # its held task carried the dependency on the first job's Slurm id
    assert len(seen_held) == 1 and seen_held[0][0] == f"{sid}_2", seen_held
    assert seen_held[0][3].startswith(f"afterok:{first_ref}"), seen_held
    out = cluster.run("sacct", "-X", "-n", "-P", "--format=JobID,JobName,State,ElapsedRaw,"
                      "AllocTRES", f"--name={','.join(f'gpubudget.{t}.1' for t in tasks)}",
                      "--starttime=now-1hour", "--endtime=now")
    acct = {r[0]: r for r in (line.split("|") for line in out.splitlines()) if r[0]}
    assert sorted(acct) == sorted(refs), out
    for t in tasks:
        jid, name, state, elapsed, tres = acct[rows[t].backend_ref]
        assert (name, state) == (f"gpubudget.{t}.1", "COMPLETED")
        gpus = int(dict(x.split("=", 1) for x in tres.split(","))["gres/gpu"])
        (charge,) = [c for c in ledger.charges() if c.workload == t]
        charged = (charge.end - charge.start) * charge.milli / 1000
        # sacct keeps whole seconds: the ledger's interval is Slurm's own to the second
        assert abs(charged - int(elapsed) * gpus) <= 1.0, (t, charged, elapsed, gpus)
        # Slurm's index is the task's: the script derives the task's own variables from it
        (out,) = Path(pwd.getpwnam("gpb-ben").pw_dir).glob(f"gpubudget-gpubudget.{t}.1-*.out")
        i = t.rsplit("_", 1)[1]
        assert out.read_text().split() == [t, i, i]
    # no task of the Slurm array is left waiting
    assert not [r for r in squeue(cluster, "%i", "%T") if r[0].startswith(f"{sid}_")
                and r[1] == "PENDING"]


def test_cancelling_a_task_and_then_the_array_cancels_them_in_slurm(service):
    """An array of three (``max_running: 1``): task 0 runs as ``<id>_0``, 1 and 2 wait held
    in the Slurm array. Cancelling task 1 (still waiting) cancels ``<id>_1`` in Slurm by the
    next cycle; cancelling the array then stops ``<id>_0`` (scancel) and ``<id>_2``; nothing
    of the array is left in slurmctld's queue."""
    ledger, loop, cluster = service
    aid = uuid.uuid4().hex[:10]
    tasks = [job(ledger, 300, workload_id=f"{aid}_{i}", array=(aid, i, 1),
                 env={"GPUBUDGET_ARRAY_INDEX": str(i), "GPUBUDGET_ARRAY_ID": aid})
             for i in range(3)]

    def alive(sid: str) -> dict[str, str]:
        return {r[0]: r[1] for r in squeue(cluster, "%i", "%T")
                if r[0].startswith(f"{sid}_") and r[1] in ("PENDING", "RUNNING", "COMPLETING")}

    def held(sid: str) -> set[int]:  # the indices waiting in the Slurm array
        return {i for jid, st in alive(sid).items() if st == "PENDING"
                for i in (array_indices(jid) or ("", set()))[1]}

    loop.cycle()
    ref = ledger.get(tasks[0]).backend_ref
    assert ledger.get(tasks[0]).state == "running" and ref and ref.endswith("_0"), ref
    sid = ref.split("_")[0]
    assert ledger.get(tasks[1]).state == "pending"
    cluster.wait("task 0 running", lambda: alive(sid).get(f"{sid}_0") == "RUNNING", 60)
    assert alive(sid)[f"{sid}_0"] == "RUNNING" and held(sid) == {1, 2}, alive(sid)
    loop.cancel(tasks[1], "gpb-ben")
    loop.cycle()
    cluster.wait("task 1 cancelled in Slurm", lambda: held(sid) == {2}, 60)
    assert alive(sid)[f"{sid}_0"] == "RUNNING"
    for t in (tasks[0], tasks[2]):
        loop.cancel(t, "gpb-ben")

    def gone() -> bool:
        loop.cycle()
        return not alive(sid)

    cluster.wait("the array gone from Slurm", gone, 90, interval=1.0)
    assert [ledger.get(t).state for t in tasks] == ["cancelled"] * 3
