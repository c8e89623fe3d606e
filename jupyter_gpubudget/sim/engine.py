"""The discrete-event simulator: a simulated clock feeding the very same scheduling core.

Events, in time order (equal times in a fixed order: node recoveries, budget changes, node
failures, completions, arrivals, then one full cycle if one is due):

- **arrival**: ``Scheduler.submit`` — starts at once if it fits idle capacity;
- **completion**: ``Scheduler.finish`` — releases capacity and fills it from the queue;
- **node failure / recovery**: ``Scheduler.fail_node`` stops everything on the node (protection
  does not apply); work that can continue is requeued (see below); ``set_healthy`` later;
- **budget change**: ``Scheduler.set_accounts``;
- **cycle**: ``Scheduler.cycle`` every ``cycle_interval`` simulated seconds while anything is
  pending (re-rank by standing, preempt, reserve, backfill), plus when protection expires.

How decisions are carried out:

- ``Start``: the workload runs for its remaining work (+ its restart overhead if it resumes);
  its completion is scheduled. A gang on poorer links than the best for its size progresses
  more slowly (``sim/interconnect.py``): its run lasts its remaining work / its rate, and
  only the held GPU-hours times the rate are *useful*.
- ``Preempt`` (and node failure): what is thrown away is exactly what the core priced when it
  chose to preempt (``core.preemption.lost_seconds``):
  * an **interactive** session is snapshotted (``snapshot_cost`` seconds, after which it is
    requeued with its progress) and pays ``restore_cost`` when it starts again; on a failed node
    there is nothing to snapshot: the session restarts from its beginning;
  * a **resumable** job keeps its progress up to its last checkpoint (one every
    ``checkpoint_interval`` seconds of its run; the workload's own, else the config's, else the
    policy's 30 min) and is requeued at once; its restart spends ``restart_overhead`` seconds
    reloading before it makes progress;
  * a **non-resumable** job loses its progress: it is resubmitted from scratch
    (``nonresumable="restart"``, the default) or dropped (``"drop"``).
  Lost GPU-hours count the GPU time that delivered no kept progress: work since the last
  checkpoint, snapshots and reload time, whole runs of restarted jobs. Simplification: the
  snapshot's seconds are charged as lost time, but the core has already released the
  capacity at the preemption instant.

Results are deterministic: no wall clock, no unordered iteration, a seeded RNG for failures.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.accounts import AccountTree
from ..core.inventory import Inventory
from ..core.model import HOUR, MILLI, Drain, Policy, Preempt, Reserve, Start, Workload
from ..core.preemption import last_checkpoint, lost_seconds
from ..core.scheduler import Scheduler
from . import fastmeter
from .costs import RESTORE_COST_S, SNAPSHOT_COST_S  # measured: see costs.py
from .interconnect import COMM_FRACTION, progress_rate
from .traces import Trace, TraceJob

# event kinds, in the order they are handled at equal times
RECOVER, BUDGET, FAIL, FINISH, REQUEUE, ARRIVE = range(6)


@dataclass(frozen=True, slots=True)
class NodeFailure:
    at: float  # seconds from the trace start
    node: str
    down_for: float = 4 * HOUR


@dataclass(frozen=True, slots=True)
class BudgetChange:
    at: float
    accounts: AccountTree


@dataclass(slots=True)
class SimConfig:
    cycle_interval: float = 600.0  # full cycle every 10 simulated minutes (while work waits)
    idle_cycle_interval: float = 3600.0  # ... but only this often when nothing changed
    snapshot_cost: float = SNAPSHOT_COST_S  # seconds to snapshot an interactive session
    restore_cost: float = RESTORE_COST_S  # seconds to restore it (a session's restart overhead)
    nonresumable: str = "restart"  # or "drop"
    # resumable jobs that declare no checkpoint interval keep their progress up to their
    # last checkpoint, taken every this many seconds of their run (0: nothing is lost;
    # None: the policy's default, 30 min)
    checkpoint_interval: float | None = None
    restart_overhead: float | None = None  # a resumable job's reload on restart (None: policy)
    samples: int = 600  # utilisation / fragmentation samples over the run
    failures: Sequence[NodeFailure] = ()
    failure_rate: float = 0.0  # random node failures per node per day (seeded)
    failure_down: float = 4 * HOUR
    budget_changes: Sequence[BudgetChange] = ()
    horizon: float | None = None  # stop the clock here (default: when all work is done)
    seed: int = 0
    fast_meter: bool = True  # incremental usage meter (same figures; see fastmeter.py)
    # share of a gang's step spent in all-reduce on its best links (sim/interconnect.py;
    # 0: the interconnect costs nothing)
    comm_fraction: float = COMM_FRACTION
    #: advance reservations replayed through the core (sim/bookings.py: SimBooking, their
    #: windows from the trace's start)
    bookings: Sequence[Any] = ()


@dataclass(slots=True)
class JobRecord:
    """What happened to one workload."""

    job: TraceJob
    remaining: float  # seconds of work left
    milli: int = 0
    first_start: float | None = None
    end: float | None = None
    started_at: float | None = None
    run_for: float = 0.0  # length of the current run (work + restore)
    overhead: float = 0.0  # restore seconds at the start of the current run
    workload: Workload | None = None  # as last submitted to the core
    token: int = 0  # bumps on every start; stale completions are ignored
    preemptions: int = 0
    failures: int = 0
    lost_gpu_hours: float = 0.0
    gpu_hours: float = 0.0  # charged (delivered) GPU-hours
    useful_gpu_hours: float = 0.0  # ... times the progress rate of the run they were held in
    rate: float = 1.0  # work per second held in the current run (sim/interconnect.py)
    dropped: bool = False
    backed_starts: int = 0
    unbacked_starts: int = 0
    restarts_from_snapshot: int = 0
    cluster: str = "default"  # the named cluster of its current (or last) run

    @property
    def wait(self) -> float | None:
        return None if self.first_start is None else self.first_start - self.job.submit

    @property
    def jct(self) -> float | None:
        return None if self.end is None else self.end - self.job.submit


@dataclass(slots=True)
class Sample:
    t: float
    used_milli: int
    total_milli: int
    stranded_milli: int
    pending: int
    running: int
    unused: dict[str, int] = field(default_factory=dict)  # free milli by cause (UNUSED_CAUSES)


#: why free GPU capacity is not used, in the order the report lists them
UNUSED_CAUSES = ("mig_no_demand", "reserved", "fragmentation", "drained", "empty_queue",
                 "awaiting_cycle")


def unused_by_cause(sched: Scheduler, now: float) -> dict[str, int]:
    """Free GPU capacity (milli) at ``now``, by why it is not in use:

    - ``drained``: on unhealthy nodes;
    - ``empty_queue``: nothing is waiting;
    - ``mig_no_demand``: on MIG-partitioned GPUs while no MIG instance is asked for;
    - ``reserved``: whole GPUs held back for a blocked gang's reservation;
    - ``awaiting_cycle``: some waiting workload would fit there now (the next cycle or
      departure starts it);
    - ``fragmentation``: the rest — free capacity that no waiting request can use (leftovers
      of shared or partitioned GPUs, free GPUs too few or too scattered for the waiting gangs).
    """
    from ..core import mig as migtab
    from ..core.placement import place

    out = dict.fromkeys(UNUSED_CAUSES, 0)
    c = sched.cluster
    reqs = {w.request.shape: w for w in sched.pending.values()}
    fits: dict[str, bool] = {}

    def any_fits(kind: str) -> bool:
        if kind not in fits:
            fits[kind] = any(
                (kind == "any" or w.request.kind == kind)
                and place(c, w.request, now + sched.predict(w)) is not None
                for w in reqs.values())
        return fits[kind]

    mig_wanted = any(w.request.kind == "mig" for w in reqs.values())
    for n in c.nodes:
        for g in n.gpus:
            if g.mig:
                free = round((migtab.COMPUTE - g.compute_used) * MILLI / migtab.COMPUTE)
            else:
                free = MILLI - g.used_milli if not g.whole else 0
            if free <= 0:
                continue
            if not n.healthy:
                cause = "drained"
            elif not reqs:
                cause = "empty_queue"
            elif g.mig:
                cause = ("mig_no_demand" if not mig_wanted else
                         "awaiting_cycle" if any_fits("mig") else "fragmentation")
            elif g.used_milli == 0 and g.reserved_at != float("inf"):
                cause = "reserved"
            elif g.used_milli > 0:
                cause = "awaiting_cycle" if any(
                    w.request.kind == "mps" and w.request.milli <= free for w in reqs.values()
                ) and any_fits("mps") else "fragmentation"
            else:
                cause = "awaiting_cycle" if any_fits("any") else "fragmentation"
            out[cause] += free
    return out


@dataclass(slots=True)
class SimResult:
    records: dict[str, JobRecord]
    samples: list[Sample]
    start: float
    end: float
    total_milli: int
    accounts: AccountTree
    policy: Policy
    events: int
    cycles: int
    decisions: dict[str, int] = field(default_factory=dict)
    project_hours: dict[str, float] = field(default_factory=dict)  # delivered, per project
    trace_source: str = ""
    contended_hours: dict[str, float] = field(default_factory=dict)  # ... while work waited
    #: cluster -> project -> delivered GPU-hours (several named clusters, one budget tree)
    cluster_hours: dict[str, dict[str, float]] = field(default_factory=dict)
    #: cluster -> its GPUs
    cluster_gpus: dict[str, int] = field(default_factory=dict)
    #: the bookings' use (sim/bookings.py: BookedUse), when the run had bookings
    booked: Any = None


class Simulator:
    def __init__(self, trace: Trace, accounts: AccountTree, inventory: Inventory,
                 policy: Policy | None = None, config: SimConfig | None = None,
                 progress: Callable[[float, float], None] | None = None) -> None:
        self.trace = trace
        self.accounts = accounts
        self.inventory = inventory
        self.policy = policy or Policy()
        self.cfg = config or SimConfig()
        self.progress = progress
        # the scheduler attaches its own FGD index when the policy says "placement: fgd"
        self.sched = Scheduler(accounts, inventory, self.policy)
        if self.cfg.fast_meter:
            fastmeter.install(self.sched)
        self.records: dict[str, JobRecord] = {}
        self.cluster_hours: dict[str, dict[str, float]] = {}
        self.heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self.events = 0
        self.cycles = 0
        # starts (backfill: onto GPUs reserved for a gang), preemptions (backfill_preempt:
        # backfilled work still running at the reservation's time), reservations, drains
        self.decisions = {"start": 0, "backfill": 0, "preempt": 0, "backfill_preempt": 0,
                          "reserve": 0, "drain": 0}
        self.samples: list[Sample] = []
        self.project_hours: dict[str, float] = {}
        # GPU-hours delivered per project while work was waiting (the cluster contended)
        self.contended_hours: dict[str, float] = {}
        self._running_milli: dict[str, int] = {}
        self._t_contended = float("-inf")
        self._dirty = True  # something happened since the last full cycle
        self._expiries: list[float] = []  # protection ends (a cycle may then preempt)
        self.booked: Any = None  # bookings' use (sim/bookings.py), with cfg.bookings
        self._slices: dict[str, tuple] = {}  # (with bookings) each run's slices
        nodes = {n.name for n in inventory.nodes}
        for f in self.cfg.failures:
            if f.node not in nodes:
                raise ValueError(f"failure of unknown node {f.node!r}")

    # ------------------------------------------------------------------ events
    def _push(self, t: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, kind, self._seq, payload))

    def _workload(self, r: JobRecord, now: float) -> Workload:
        """The workload as the core sees it, with the preemption costs the simulator will
        charge: a session's snapshot and restore, a job's checkpoint interval and reload."""
        j = r.job
        cfg = self.cfg
        if j.kind == "interactive":
            snap, ci, overhead = cfg.snapshot_cost, j.checkpoint_interval, cfg.restore_cost
        else:
            snap, overhead = 0.0, cfg.restart_overhead
            ci = j.checkpoint_interval if j.checkpoint_interval is not None \
                else cfg.checkpoint_interval
        w = Workload(j.id, j.project, j.user, j.request, now, j.kind, j.min_runtime,
                     j.resumable, j.time_limit, snap, checkpoint_interval=ci,
                     restart_overhead=overhead, command=j.command)
        r.workload = w
        return w

    # ------------------------------------------------------------------ decisions
    def _apply(self, decisions: Sequence[object], now: float) -> None:
        for d in decisions:
            if isinstance(d, Start):
                self._on_start(d, now)
            elif isinstance(d, Preempt):
                self.decisions["preempt"] += 1
                if d.reason.startswith("backfilled"):
                    self.decisions["backfill_preempt"] += 1
                self._on_stop(d.workload, now, failure=False)
            elif isinstance(d, Reserve):
                self.decisions["reserve"] += 1
            elif isinstance(d, Drain):
                self.decisions["drain"] += 1

    def _on_start(self, d: Start, now: float) -> None:
        self.decisions["start"] += 1
        if d.backfill_until is not None:
            self.decisions["backfill"] += 1
        r = self.records[d.workload]
        r.token += 1
        r.started_at = now
        r.milli = d.placement.milli
        if d.placement.slices:
            r.cluster = self.sched.cluster.by_name[d.placement.slices[0].node].cluster
        p = r.job.project
        self._running_milli[p] = self._running_milli.get(p, 0) + r.milli
        if r.first_start is None:
            r.first_start = now
        if d.backed:
            r.backed_starts += 1
        else:
            r.unbacked_starts += 1
        r.rate = progress_rate(self.sched.cluster, d.placement, self.cfg.comm_fraction)
        # the reload was counted as lost at the stop
        r.run_for = r.remaining / r.rate + r.overhead
        if r.workload is not None:  # as the core runs it (a backfill knows its deadline)
            r.workload = replace(r.workload, started_at=now, backfill_until=d.backfill_until)
        if d.protected_until is not None and d.protected_until > now:
            heapq.heappush(self._expiries, d.protected_until)
        if self.booked is not None:
            self._slices[d.workload] = d.placement.slices
        self._push(now + r.run_for, FINISH, (d.workload, r.token))

    def _advance(self, to: float) -> None:
        """Move the contention clock to ``to``: while anything waits, what each project has
        running is delivered under contention."""
        dt = to - self._t_contended
        if dt > 0 and self.sched.pending:
            for p, milli in self._running_milli.items():
                if milli:
                    self.contended_hours[p] = (self.contended_hours.get(p, 0.0)
                                               + milli / MILLI * dt / HOUR)
        self._t_contended = max(self._t_contended, to)

    def _charge(self, r: JobRecord, now: float) -> float:
        """Close the current run's charge; returns its elapsed seconds."""
        assert r.started_at is not None
        p = r.job.project
        self._running_milli[p] = self._running_milli.get(p, 0) - r.milli
        elapsed = max(0.0, now - r.started_at)
        if self.booked is not None:
            self.booked.ran(p, self._slices.pop(r.job.id, ()), r.started_at, now)
        hours = r.milli / MILLI * elapsed / HOUR
        r.gpu_hours += hours
        r.useful_gpu_hours += hours * r.rate
        p = r.job.project
        self.project_hours[p] = self.project_hours.get(p, 0.0) + hours
        by = self.cluster_hours.setdefault(r.cluster, {})
        by[p] = by.get(p, 0.0) + hours
        r.started_at = None
        return elapsed

    def _on_stop(self, wid: str, now: float, failure: bool) -> None:
        r = self.records[wid]
        r.token += 1  # its scheduled completion is now stale
        elapsed = self._charge(r, now)
        frac = r.milli / MILLI
        if failure:
            r.failures += 1
        else:
            r.preemptions += 1
        j = r.job
        w = r.workload
        assert w is not None
        policy = self.policy
        if failure and (j.kind == "interactive" or not j.resumable):
            # nothing to snapshot on a dead node: all progress so far, kept or not, is lost
            r.lost_gpu_hours += frac * (elapsed + (j.duration - r.remaining)) / HOUR
            self._restart_or_drop(r, wid, now, interactive=j.kind == "interactive")
            return
        if not j.resumable and j.kind != "interactive":
            r.lost_gpu_hours += frac * lost_seconds(w, elapsed, policy) / HOUR
            self._restart_or_drop(r, wid, now, interactive=False)
            return
        # kept progress: all of it for a snapshotted session (checkpoint interval 0), else up
        # to the run's last checkpoint; this run's reload was counted when it was preempted
        kept_wall = last_checkpoint(w, elapsed, policy)
        r.remaining = max(0.0, r.remaining - max(0.0, kept_wall - r.overhead) * r.rate)
        r.lost_gpu_hours += frac * lost_seconds(w, elapsed, policy) / HOUR
        r.overhead = policy.restart_overhead_of(w)
        if j.kind == "interactive":
            r.restarts_from_snapshot += 1
            self._push(now + w.snapshot_cost, REQUEUE, wid)
        else:
            self._push(now, REQUEUE, wid)
        if r.remaining <= 0.0:  # nothing left to do: it finished as it was stopped
            r.end = now

    def _restart_or_drop(self, r: JobRecord, wid: str, now: float, interactive: bool) -> None:
        if self.cfg.nonresumable == "drop" and not interactive:
            r.dropped = True
            r.end = None
            return
        r.remaining = r.job.duration
        r.overhead = 0.0
        self._push(now, REQUEUE, wid)

    # ------------------------------------------------------------------ run
    def run(self) -> SimResult:
        jobs = self.trace.jobs
        if not jobs:
            raise ValueError("the trace has no workloads")
        for j in jobs:
            if j.id in self.records:
                raise ValueError(f"duplicate workload id {j.id!r} in the trace")
            self.records[j.id] = JobRecord(j, j.duration)
            self._push(j.submit, ARRIVE, j.id)
        t0 = min(j.submit for j in jobs)
        span_guess = max(j.submit + j.duration for j in jobs) - t0
        for f in self.cfg.failures:
            self._push(t0 + f.at, FAIL, (f.node, f.down_for))
        if self.cfg.failure_rate > 0:
            rng = random.Random(self.cfg.seed)
            rate = self.cfg.failure_rate / 86400.0
            for n in self.inventory.nodes:
                t = t0 + rng.expovariate(rate)
                while t < t0 + span_guess:
                    self._push(t, FAIL, (n.name, self.cfg.failure_down))
                    t += self.cfg.failure_down + rng.expovariate(rate)
        for b in self.cfg.budget_changes:
            self._push(t0 + b.at, BUDGET, b.accounts)
        if self.cfg.bookings:  # the service's bookings, through the same core
            from ..core.reservations import Bookings
            from .bookings import BookedUse, place

            placed = place(self.cfg.bookings, self.inventory, self.sched.accounts, t0)
            self.sched.bookings = Bookings(placed)
            self.booked = BookedUse(placed)
            for bk in placed:  # a cycle at each window's edges
                heapq.heappush(self._expiries, bk.start)
                heapq.heappush(self._expiries, bk.end)
            self._cycle(t0)  # (booked GPUs are held back from the first arrival on)

        sched = self.sched
        total = sched.cluster.total_milli
        interval = self.cfg.cycle_interval
        sample_every = max(interval, span_guess / max(1, self.cfg.samples))
        next_sample = t0
        next_cycle = t0
        horizon = t0 + self.cfg.horizon if self.cfg.horizon is not None else None
        now = t0
        last_report = 0.0
        heap = self.heap
        while True:
            if not heap:
                if not sched.pending:
                    break
                # nothing else will happen: one last cycle may still start (or preempt) work
                now = max(now, next_cycle)
                self._advance(now)
                if horizon is not None and now > horizon:
                    break
                self._cycle(now)
                next_cycle = now + interval
                if not heap:
                    break
                continue
            t = heap[0][0]
            # a full cycle is due before the next event (only while work waits, and only when
            # something changed: an event, a protection ending, or an hour of window sliding)
            if sched.pending and next_cycle <= t:
                cand = max(now, next_cycle)
                if horizon is not None and cand > horizon:
                    break
                exp = self._expiries
                while exp and exp[0] <= self._last_cycle:
                    heapq.heappop(exp)
                if (self._dirty or (exp and exp[0] <= cand)
                        or cand >= self._last_cycle + self.cfg.idle_cycle_interval):
                    now = cand
                    self._advance(now)
                    self._cycle(now)
                next_cycle = cand + interval
                continue
            if horizon is not None and t > horizon:
                break
            now = t
            self._advance(now)
            while next_sample <= now:
                self._sample(next_sample, total)
                next_sample += sample_every
            # all events at this instant, in kind order
            while heap and heap[0][0] == t:
                _, kind, _, payload = heapq.heappop(heap)
                self.events += 1
                self._dirty = True
                self._handle(kind, payload, now)
            if not sched.pending:
                next_cycle = max(next_cycle, now)
            if self.progress and now - last_report > span_guess / 200:
                last_report = now
                self.progress(now - t0, span_guess)
        end = now
        if horizon is not None and (heap or sched.pending or sched.running):
            end = max(now, horizon)  # stopped by the horizon: the figures run up to it
        self._advance(end)
        for r in self.records.values():  # still running at the horizon: charge up to it
            if r.started_at is not None:
                self._charge(r, end)
        self._sample(end, total)
        if self.progress:
            self.progress(span_guess, span_guess)
        return SimResult(self.records, self.samples, t0, end, total, sched.accounts,
                         self.policy, self.events, self.cycles, dict(self.decisions),
                         dict(self.project_hours), self.trace.source,
                         dict(self.contended_hours),
                         {c: dict(h) for c, h in self.cluster_hours.items()},
                         {c: sum(len(n.gpus) for n in self.inventory.nodes if n.cluster == c)
                          for c in self.inventory.clusters}, self.booked)

    _last_cycle = float("-inf")

    def _cycle(self, now: float) -> None:
        self.cycles += 1
        self._dirty = False
        self._last_cycle = now
        self._apply(self.sched.cycle(now), now)

    def _sample(self, t: float, total: int) -> None:
        c = self.sched.cluster
        self.samples.append(Sample(t, c.used_milli, total, c.stranded_milli(),
                                   len(self.sched.pending), len(self.sched.running),
                                   unused_by_cause(self.sched, t)))

    def _handle(self, kind: int, payload: object, now: float) -> None:
        sched = self.sched
        if kind == ARRIVE or kind == REQUEUE:
            wid = payload
            assert isinstance(wid, str)
            r = self.records[wid]
            if r.end is not None or r.dropped:
                return
            self._apply(sched.submit(self._workload(r, now), now), now)
        elif kind == FINISH:
            wid, token = payload  # type: ignore[misc]
            r = self.records[wid]
            if token != r.token or r.started_at is None:
                return  # preempted since; this completion never happens
            self._charge(r, now)
            r.remaining = 0.0
            r.end = now
            self._apply(sched.finish(wid, now), now)
        elif kind == FAIL:
            node, down = payload  # type: ignore[misc]
            if node in sched.unhealthy:
                return
            for wid in sched.fail_node(node, now):
                self._on_stop(wid, now, failure=True)
            self._push(now + down, RECOVER, node)
        elif kind == RECOVER:
            sched.set_healthy(str(payload), True)
            self._cycle(now)
        elif kind == BUDGET:
            assert isinstance(payload, AccountTree)
            sched.set_accounts(payload)
            self.accounts = payload
            self._cycle(now)


def simulate(trace: Trace, accounts: AccountTree, inventory: Inventory,
             policy: Policy | None = None, config: SimConfig | None = None,
             progress: Callable[[float, float], None] | None = None) -> SimResult:
    return Simulator(trace, accounts, inventory, policy, config, progress).run()


def fits_somewhere(inventory: Inventory, job: TraceJob) -> bool:
    """Could the request ever be placed on an empty cluster? (Used to warn about traces that
    ask for more than the inventory has.)"""
    from ..core.capacity import Cluster
    from ..core.placement import place

    return place(Cluster(inventory), job.request, float("inf")) is not None


__all__ = ["Simulator", "SimConfig", "SimResult", "JobRecord", "Sample", "NodeFailure",
           "UNUSED_CAUSES", "unused_by_cause",
           "BudgetChange", "simulate", "fits_somewhere"]
