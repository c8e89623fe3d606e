"""A launch is fenced on the real Slurm test cluster: two service replicas (two scheduling
loops, each with its own lease and SlurmBackend) on one real PostgreSQL ledger.

A leader that pauses between committing a start and calling sbatch, past its lease, while
the other replica takes over, must not leave two Slurm jobs for one workload: it launches
nothing once it wakes (the lease is checked again right before sbatch), and the new leader
looks the attempt up in Slurm by its job name (not in memory), waits the start grace for it,
then requeues it (it never ran) and launches the next attempt. A job that does reach Slurm
without an open charge interval (an orphan) is cancelled within one cycle and recorded.

The pause is the one fake: a real process cannot be stopped at that exact moment, so the
old leader's ``ledger.start`` (the commit) or ``backend.launch`` (the sbatch) is wrapped to
block until the test lets it go. Everything else is real: slurmctld, slurmdbd, sbatch,
squeue, sacct, scancel, PostgreSQL and its lease row.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid

import pytest
from sqlalchemy import text

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.service.leader import Lease, NotLeader
from jupyter_gpubudget.service.loop import SchedulingLoop
from tests.fixtures.postgres import postgres_server  # noqa: F401
from tests.slurm.conftest import BUDGETS
from tests.slurm.test_backend import make_backend

SUBMITTED: list[str] = []  # the workloads of this module (their jobs are cancelled after)
START_GRACE = 4.0  # seconds (SlurmBackend.start_grace; 30 s by default)


class Replica:
    """One service replica: its lease, ledger handle (fenced by the lease), Slurm backend
    and scheduling loop — what ``GpuBudgetService`` wires together, without HTTP."""

    def __init__(self, url: str, name: str) -> None:
        self.engine = connect(url)
        self.lease = Lease(self.engine, f"http://{name}/", ttl=8.0, renew_interval=2.0,
                           holder=name)
        self.ledger = Ledger(self.engine)
        self.ledger.fence = self.lease.check
        self.budgets = load_budgets(BUDGETS, "budgets.yaml")
        self.backend = make_backend(start_grace=START_GRACE, stop_grace=20)
        inv = self.backend.discover_inventory()
        self.backend.use_inventory(inv)
        self.loop = SchedulingLoop(self.ledger, lambda: self.budgets.accounts, inv,
                                   lambda: self.budgets.policy, self.backend)

    def cycle(self) -> None:
        """Renew the lease (its thread's work in the service), then one scheduling cycle."""
        assert self.lease.tick() is not None
        self.loop.cycle()

    def lead(self) -> None:
        assert self.lease.tick() is not None
        self.ledger.others_wrote()
        self.ledger.sync_budgets(self.budgets, time.time())
        self.loop.reconcile()


@pytest.fixture
def replicas(slurm_accounts, postgres_server):  # noqa: F811
    url = postgres_server.new_database()
    upgrade(url)
    a, b = Replica(url, "a"), Replica(url, "b")
    yield a, b
    for r in (a, b):
        r.engine.dispose()
    # what the tests left running in Slurm (this module's jobs only)
    out = slurm_accounts.run("squeue", "-h", "-o", "%i|%j")
    for job_id, _, name in (line.partition("|") for line in out.splitlines()):
        if any(f".{wid}." in name for wid in SUBMITTED):
            slurm_accounts.run("scancel", job_id, check=False)


def expire(r: Replica) -> None:
    """The lease runs out now, as it does once a paused holder stops renewing it."""
    with r.engine.begin() as c:
        c.execute(text("UPDATE service_leader SET expires_at = extract(epoch from now()) - 1"))


def slurm_jobs(cluster, wid: str) -> list[tuple[str, str, str]]:  # noqa: ANN001
    """(job id, name, state) of every job Slurm's accounting has for the workload."""
    out = cluster.run("sacct", "-X", "-n", "-P", "--format=JobID,JobName,State",
                      "--starttime=now-1hour", "--endtime=now")
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return [(r[0], r[1], r[2]) for r in rows if len(r) >= 3 and f".{wid}." in r[1]]


def alive_jobs(cluster, wid: str) -> list[str]:  # noqa: ANN001
    """Names of the workload's jobs slurmctld still runs or queues."""
    out = cluster.run("squeue", "-h", "-o", "%j|%T")
    return [n for n, _, st in (line.partition("|") for line in out.splitlines())
            if f".{wid}." in n and st not in ("COMPLETED", "CANCELLED", "FAILED")]


def cancelled(cluster, wid: str, attempt: int) -> None:  # noqa: ANN001
    """Wait until Slurm has ended the attempt's job as cancelled (scancel) and no longer
    lists it alive."""
    name = f"gpubudget.{wid}.{attempt}"
    cluster.wait(f"{name} cancelled", lambda: name not in alive_jobs(cluster, wid) and any(
        n == name and st.startswith("CANCELLED") for _, n, st in slurm_jobs(cluster, wid)))


def submit(ledger: Ledger, resumable: bool = False) -> str:
    row = ledger.submit(project="astro", user="gpb-ben", kind="batch",
                        request={"kind": "gpu", "gpus": 1},
                        command=["/bin/sh", "-c", "exec sleep 300"], env={}, now=time.time(),
                        resumable=resumable, time_limit=600, backend="slurm",
                        workload_id=uuid.uuid4().hex[:12])
    SUBMITTED.append(row.id)
    return row.id


def paused(obj, attr: str):  # noqa: ANN001, ANN201
    """Wrap ``obj.attr`` so that it blocks after (``start``: the commit) or before (``launch``:
    sbatch) doing its work, until released: the fault hook."""
    at, go = threading.Event(), threading.Event()
    real = getattr(obj, attr)

    def start(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        out = real(*a, **kw)
        at.set()
        go.wait(60)
        return out

    def launch(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        at.set()
        go.wait(60)
        return real(*a, **kw)

    setattr(obj, attr, start if attr == "start" else launch)
    return at, go


def run_cycle(r: Replica) -> tuple[threading.Thread, list]:
    errors: list = []

    def go() -> None:
        try:
            r.loop.cycle()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, errors


def cycles_until(r: Replica, pred, timeout: float = 60):  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r.cycle()
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError("timed out")


def test_a_leader_paused_between_commit_and_sbatch_leaves_one_slurm_job(replicas,
                                                                         slurm_accounts):
    a, b = replicas
    cluster = slurm_accounts
    a.lead()
    wid = submit(a.ledger)  # not resumable: it must be requeued all the same (it never ran)
    at, go = paused(a.ledger, "start")
    t, errors = run_cycle(a)
    assert at.wait(60), "the leader never started the job"
    assert a.ledger.get(wid).state == "running"  # committed: attempt 1 is open

    expire(a)  # a is paused past its lease ...
    b.lead()  # ... b takes over and adopts what is open
    b.cycle()
    # within the start grace attempt 1 is starting: looked up in Slurm, not closed as lost
    assert b.ledger.get(wid).state == "running"
    assert b.ledger.open_interval(wid).seq == 1

    go.set()  # a wakes up: it must not submit attempt 1
    t.join(60)
    assert any(isinstance(e, NotLeader) for e in errors), errors
    time.sleep(1.0)
    assert alive_jobs(cluster, wid) == [] and slurm_jobs(cluster, wid) == []

    # past the start grace: b requeues attempt 1 (never launched) and launches attempt 2
    running2 = cycles_until(b, lambda: (iv := b.ledger.open_interval(wid)) is not None
                            and iv.seq == 2 and alive_jobs(cluster, wid))
    assert running2 == [f"gpubudget.{wid}.2"]
    jobs = cluster.wait("its accounting record", lambda: slurm_jobs(cluster, wid))
    assert [n for _, n, _ in jobs] == [f"gpubudget.{wid}.2"], jobs  # exactly one, ever
    first = [c for c in b.ledger.charges(workload=wid) if c.seq == 1][0]
    assert first.end == first.start and first.closed_by == "reconcile"  # nothing charged
    lost = b.ledger.decisions(workloads=[wid], kind="lost")
    assert lost and "never launched" in lost[0].reason


def test_a_late_sbatch_of_a_deposed_leader_is_cancelled_as_an_orphan(replicas,
                                                                      slurm_accounts):
    """The pause falls after the lease check, inside the launch: sbatch reaches Slurm after
    the new leader requeued the attempt. The new leader's next cycle cancels it."""
    a, b = replicas
    cluster = slurm_accounts
    a.lead()
    wid = submit(a.ledger, resumable=True)
    at, go = paused(a.backend, "launch")
    t, errors = run_cycle(a)
    assert at.wait(60)
    expire(a)
    b.lead()
    cycles_until(b, lambda: (iv := b.ledger.open_interval(wid)) is not None and iv.seq == 2
                 and alive_jobs(cluster, wid))
    go.set()  # a's sbatch of attempt 1 goes through now
    t.join(60)
    cluster.wait("a's late job in Slurm", lambda: f"gpubudget.{wid}.1" in
                 {n for _, n, _ in slurm_jobs(cluster, wid)})
    b.cycle()  # one cycle, and no more: Slurm ends the orphan on its own after it
    cancelled(cluster, wid, 1)
    assert alive_jobs(cluster, wid) == [f"gpubudget.{wid}.2"]
    orphan = b.ledger.decisions(workloads=[wid], kind="orphan")
    assert len(orphan) == 1 and orphan[0].detail["attempt"] == 1
    assert b.ledger.open_interval(wid).seq == 2


def test_an_orphan_slurm_job_is_cancelled_within_one_cycle(replicas, slurm_accounts):
    """A job named as one of ours with no open charge interval (no workload at all here)
    is scancelled by the next scheduling cycle, not only at a takeover."""
    a, _b = replicas
    cluster = slurm_accounts
    a.lead()
    a.cycle()
    wid = uuid.uuid4().hex[:12]
    SUBMITTED.append(wid)
    p = subprocess.run(
        ["sudo", "-n", "-u", "gpb-ben", "--preserve-env=SLURM_CONF", "--", "sbatch",
         "--parsable", "-p", "gpubudget", "-A", "astro", f"--job-name=gpubudget.{wid}.3",
         "--output=/dev/null", "--wrap", "exec sleep 300"], env=cluster.env,
        capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    cluster.wait("the orphan in squeue", lambda: alive_jobs(cluster, wid))
    a.cycle()  # one cycle, and no more: Slurm ends the orphan on its own after it
    cancelled(cluster, wid, 3)
    assert alive_jobs(cluster, wid) == []
    orphan = a.ledger.decisions(workloads=[wid], kind="orphan")
    assert len(orphan) == 1 and orphan[0].detail == {"attempt": 3, "backend": "slurm"}
    a.cycle()
    assert len(a.ledger.decisions(workloads=[wid], kind="orphan")) == 1  # recorded once


def test_a_launch_later_than_its_commit_is_charged_from_the_launch(replicas, slurm_accounts):
    """A pause shorter than the lease between committing a start and calling sbatch is not
    charged: the interval starts when sbatch was called."""
    a, _b = replicas
    cluster = slurm_accounts
    a.lead()
    wid = submit(a.ledger)
    at, go = paused(a.ledger, "start")
    t, errors = run_cycle(a)
    assert at.wait(60)
    time.sleep(1.5)  # (under the 8 s lease: it still leads)
    assert a.lease.tick() is not None
    released = time.time()
    go.set()
    t.join(60)
    assert errors == []
    iv = a.ledger.open_interval(wid)
    assert iv is not None and iv.start >= released
    row = a.ledger.get(wid)
    assert row.started_at == iv.start and row.backend_ref
    cluster.wait("the job in squeue", lambda: alive_jobs(cluster, wid))


class Crash(BaseException):
    """The service process dies here (nothing after it runs)."""


def test_a_job_whose_service_died_between_decision_and_launch_is_requeued(replicas,
                                                                          slurm_accounts):
    """The service dies after committing a start and before sbatch; restarted (the same
    replica, after the start grace), it finds no trace of the attempt in Slurm: the job
    never ran, so — resumable or not — it is requeued, charged nothing, and started again as
    attempt 2 (not ended ``failed``)."""
    a, _b = replicas
    cluster = slurm_accounts
    a.lead()
    wid = submit(a.ledger)  # not resumable
    real = a.ledger.start

    def start_then_die(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        real(*args, **kw)
        raise Crash

    a.ledger.start = start_then_die
    with pytest.raises(Crash):
        a.loop.cycle()
    assert a.ledger.get(wid).state == "running" and alive_jobs(cluster, wid) == []
    time.sleep(START_GRACE)
    restarted = Replica(a.engine.url.render_as_string(hide_password=False), "a")
    try:
        restarted.lead()  # reconcile: the attempt is settled
        row = restarted.ledger.get(wid)
        assert row.state in ("pending", "running"), (row.state, row.reason)
        first = [c for c in restarted.ledger.charges(workload=wid) if c.seq == 1][0]
        assert first.end == first.start  # never ran: nothing charged
        cycles_until(restarted, lambda: alive_jobs(cluster, wid) == [f"gpubudget.{wid}.2"])
    finally:
        restarted.engine.dispose()
