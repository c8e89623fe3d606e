"""The scheduling loop: rebuild state from the ledger, call ``core.schedule``, apply.

It holds no policy: every choice comes from the core's decisions. What it does itself is
bookkeeping: reap ended jobs, checkpoint open intervals, settle what a crash left behind, and
carry out decisions in order (Preempts before the Starts that follow them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from jupyter_gpubudget.backends.base import Backend, BackendStatus, Launch
from jupyter_gpubudget.core.accounts import AccountTree
from jupyter_gpubudget.core.forecast import LazyForecast, PredictedStarts
from jupyter_gpubudget.core.kept import KeptCycle
from jupyter_gpubudget.core.model import Drain, Policy, Preempt, Reserve, Start
from jupyter_gpubudget.core.offer import (
    Quoter,
    request_for,
    slice_choices,
    standings_of,
)
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler
from jupyter_gpubudget.ledger import Ledger, LedgerError
from jupyter_gpubudget.ledger import nodes as ledger_nodes
from jupyter_gpubudget.ledger.models import (
    ChargeRow,
    DeviceClaimRow,
    NodeHealthRow,
    WorkloadRow,
)

from .dependencies import off_peak_wait, settle
from .leader import NotLeader
from .preempt_warning import Foreseen, Outlooks, PreemptionWarner
from .state import LiveWorkloads, build_state, placement_to_list

#: ended workloads settled per ledger transaction (each in a savepoint of its own)
SETTLE_BATCH = 32


@dataclass
class View:
    """What the last cycle computed, served by the REST API and /metrics without recomputing."""

    at: float = 0.0
    cycle: int = 0
    queue: list[str] = field(default_factory=list)  # pending ids in rank order
    reservations: Mapping[str, float] = field(default_factory=dict)
    standings: dict[str, dict[str, float]] = field(default_factory=dict)
    running: dict[tuple[str, str], int] = field(default_factory=dict)  # (project, kind) -> n
    pending: dict[tuple[str, str], int] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)  # project -> total
    cycle_seconds: float = 0.0
    #: running records the core left out this cycle (impossible placement): id -> why
    inconsistent: dict[str, str] = field(default_factory=dict)
    #: pending jobs that wait for others to end (not for GPUs): id -> "waiting for ..."
    held: dict[str, str] = field(default_factory=dict)
    #: quotes against this cycle's scheduler (None before the first cycle)
    quoter: Quoter | None = None
    #: node -> {"state": in_service | draining | ready_for_repair, "running": n,
    #: "protected_until": latest protected end of work still there}
    nodes: dict[str, dict] = field(default_factory=dict)
    #: GPU-equivalents: allocated (held by running work), drained (free on unhealthy
    #: nodes), idle (free and in service)
    gpus: dict[str, float] = field(default_factory=dict)
    drains_total: int = 0
    #: GPU-hours since the service started: capacity in service nobody held ("unallocated"),
    #: and GPUs held by sessions reported idle ("idle_session")
    idle_gpu_hours: dict[str, float] = field(default_factory=dict)
    idle_held: float = 0.0  # GPU-equivalents held by sessions reported idle
    #: GPU-hours the preemptions of the last day threw away, and the most drains may bring
    #: it to (``Policy.finish_drain_budget``; 0: no budget)
    lost_day_gpu_hours: float = 0.0
    loss_budget_gpu_hours: float = 0.0
    #: running id -> its likely preemption (service/preempt_warning.py)
    preemption_forecast: dict[str, Foreseen] = field(default_factory=dict)

    def position(self, wid: str) -> int | None:
        try:
            return self.queue.index(wid) + 1
        except ValueError:
            return None


def warm(fc: LazyForecast, keys: list[str], pending: list[str],
         current: Callable[[], bool] = lambda: True) -> None:
    """Replay forecast ``fc`` to its end as requests would ask it: the quotes' slice shapes
    (``keys``) first, as a spawn form waits on one, then each queued workload's start in queue
    order (``pending``), each asked on its own, so that between two answers the forecast's
    lock is free for a request. Stops early once ``current()`` is false (a newer forecast)."""
    for key in keys:
        if not current():
            return
        fc.probe_start(key)
        time.sleep(0)  # (a request waiting on the lock takes it now, not after the warming)
    for wid in pending:
        if not current():
            return
        fc.start_of(wid)
        time.sleep(0)
    if current():
        fc.result()  # (what is left of the replay, if anything)


class SchedulingLoop:
    def __init__(self, ledger: Ledger, tree_fn: Callable, inventory,  # noqa: ANN001
                 policy_fn: Callable[[], Policy], backend: Backend,
                 log: logging.Logger | None = None, clock: Callable[[], float] = time.time,
                 on_cycle: Callable[[float], None] | None = None,
                 on_start: Callable[[WorkloadRow, float], None] | None = None) -> None:
        self.ledger = ledger
        self.tree_fn = tree_fn  # -> AccountTree of the budgets file (reloadable)
        self.inventory = inventory
        self.policy_fn = policy_fn  # -> the budgets file's policy (reloaded with it)
        self.backend = backend
        self.sync_backends = frozenset({backend.name} if backend.synchronous_stop else ())
        #: health: the last failure of a cycle (None once one succeeds again) and when the
        #: last cycle succeeded
        self.last_error: str | None = None
        self.failed_cycles = 0
        self.last_ok_at: float | None = None
        self.forecast_interval = 60.0
        self.forecast_min_interval = 2.0
        self._forecast: LazyForecast | None = None
        self._forecast_keys: dict[str, object] = {}  # each probe's slice shape
        self._forecast_at = 0.0
        self._forecast_key: tuple = ()
        #: warm each new forecast in the background (``_warm``): the first quote or queue
        #: view after it finds it replayed. One warming thread at most, given the newest
        #: forecast; it ends when it has nothing left to warm.
        self.warm_forecast = True
        self._warm_cond = threading.Condition()
        self._warm_next: tuple[LazyForecast, list[str], list[str]] | None = None
        self._warming: threading.Thread | None = None
        self._warm_failed = False  # (a failure is logged once, until a warming succeeds)
        #: the preemption outlook, and who warns of it (the app sets both up)
        self.outlooks = Outlooks()
        self.warner: PreemptionWarner | None = None
        self.log = log or logging.getLogger("gpubudget.loop")
        self.clock = clock
        self.on_cycle = on_cycle
        self.on_start = on_start  # a workload started: (its row, when) — the wait metric
        self.view = View()
        self.lock = threading.Lock()  # one cycle or state change of a running workload at a time
        self._reserved: dict[str, float] = {}
        #: seconds past a job's time_limit after which the loop stops it itself: a backend's
        #: own enforcement (the local launcher's: SIGTERM, grace, SIGKILL) comes first
        self.time_limit_slack = float(getattr(backend, "stop_grace", 10.0)) + 30.0
        self._drained: set[str] = set()
        self._unhealthy: dict[str, str] = {}  # node -> reason, as the engine reports it
        self._live = LiveWorkloads()  # rows -> core workloads, reused while unchanged
        self._last_read: tuple | None = None  # (version key, state, rows) of the last read
        # the capacity models kept from cycle to cycle (core/kept.py), and the lock of the
        # one the last cycle's scheduler (the view's quotes) reads
        self._kept = KeptCycle()
        self._model_lock: threading.Lock | None = None
        self._preemptions: tuple[int, dict[str, int]] = (-1, {})
        #: seconds between checkpoints of running work's open intervals (each a write of
        #: every running row): what a crash of the service can lose at most
        self.checkpoint_interval = 0.0
        self._checkpointed_at = float("-inf")
        self._engine_seen: dict[str, str] = {}  # the engine's previous report (edges)
        #: node -> reason: out of service in the ledger (a health source, an admin, the
        #: engine) or as the engine reports it now
        self._out: dict[str, str] = {}
        self._health: dict[str, NodeHealthRow] = {}
        self._health_read: tuple[int, dict[str, NodeHealthRow]] = (-1, {})
        self._drains_total: int | None = None  # "repair" decisions: read once, then counted
        self._usage_checked_at = 0.0
        self._lost_told: set[tuple[str, int]] = set()  # attempts whose lost monitor was told
        #: False on a standby replica (:meth:`follow`): the view is computed, nothing written
        self.applying = True
        self._orphans_told: set[tuple[str, int]] = set()  # orphans recorded (once each)
        #: running attempts whose launch is on record (launched here, or checked once)
        self._launch_known: set[tuple[str, int]] = set()

    def cluster_of(self, nodes: tuple[str, ...]) -> str | None:
        """The named cluster of a placement's nodes (one: a gang never spans clusters)."""
        by_node = getattr(self, "_node_cluster", None)
        if by_node is None:
            by_node = self._node_cluster = {n.name: n.cluster for n in self.inventory.nodes}
        return by_node.get(nodes[0]) if nodes else None

    # ------------------------------------------------------------------ reconcile
    def reconcile(self) -> None:
        """On start: settle workloads a crash left running, stop orphans. Idempotent."""
        with self.lock:
            alive = set(self._reap(self.clock()))
            open_iv = self.ledger.open_intervals()
            for row in self.ledger.workloads(states=("running",), backend=self.backend.name):
                if row.id in alive and self._intent(row) and row.id in open_iv:
                    # a preemption or cancel was under way when the service died: finish it
                    st = self.backend.stop(row.id, open_iv[row.id].seq)
                    self._settle(row, BackendStatus(False, st.exit_code, self.clock()))
            self._sweep_orphans(self.clock(), fresh=True)

    def _sweep_orphans(self, now: float, fresh: bool = False) -> list[tuple[str, int]]:
        """Stop every attempt the engine runs that has no open charge interval (an orphan:
        launched by a replica that had lost the lease, or left by a crash) and record each
        as an ``orphan`` decision. Run at takeover and in every cycle: an orphan holds GPUs
        nobody is charged for, so it is stopped within one cycle of appearing.

        The ledger is read before the engine is listed; an attempt cannot be opened in
        between (this replica opens them under the same lock, and a replica that lost the
        lease cannot write), so one launched since is already in the read."""
        if fresh:
            running = {(w, c.seq) for w, c in self.ledger.open_intervals().items()}
        else:
            with self._live.lock:
                running = {(c.workload, c.seq)
                           for c in self._live.open_charges(self.ledger)[0]}
        try:
            engine = self.backend.orphans(running)
        except Exception:  # noqa: BLE001 - the engine may be away: next cycle
            self.log.exception("listing the %s engine's jobs failed", self.backend.name)
            return []
        stopped = []
        for wid, attempt in engine:
            if (wid, attempt) in running:
                continue
            try:
                self.backend.stop_orphan(wid, attempt)
            except Exception:  # noqa: BLE001 - tried again next cycle
                self.log.exception("stopping orphan %s attempt %d failed", wid, attempt)
                continue
            stopped.append((wid, attempt))
            if (wid, attempt) in self._orphans_told:
                continue  # (still ending: asked again, recorded once)
            self._orphans_told.add((wid, attempt))
            self.log.warning("stopping orphan %s attempt %d: the %s engine runs it and no "
                             "charge interval is open for it", wid, attempt, self.backend.name)
            self.ledger.record_decision(
                now=now, kind="orphan", workload=wid[:64], actor="reconcile",
                reason=f"the {self.backend.name} engine ran attempt {attempt} with no open "
                       "charge interval (launched by a replica that no longer led, or left "
                       "by a crash): stopped",
                detail={"attempt": attempt, "backend": self.backend.name})
        return stopped

    def _intent(self, row: WorkloadRow) -> str | None:
        """'preempting', 'cancelling' or 'requeueing' when a stop was under way when the
        service died."""
        last = [d for d in self.ledger.decisions(workloads=[row.id], limit=5)
                if d.kind != "lost"]  # (an audit note about its monitor, not an intent)
        if last and last[0].kind in ("preempting", "cancelling", "requeueing") \
                and last[0].at >= (row.started_at or 0):
            return last[0].kind
        return None

    def _settle(self, row: WorkloadRow, st: BackendStatus) -> None:
        """A local workload that is no longer alive: close its interval and decide its state."""
        self._settle_many([(row, st)])

    def _settle_many(self, ended: list[tuple[WorkloadRow, BackendStatus]]) -> None:
        """Settle several ended workloads, :data:`SETTLE_BATCH` to a transaction, each in a
        savepoint of its own (one the ledger refuses is logged and left out alone, as with
        the batched Starts). What each is settled as is read before its transaction; its
        charge ends at the backend's own end time, whatever transaction records it, and a
        crash before a commit leaves those workloads running on the ledger, settled again
        by the next cycle (or the next replica) exactly as they would have been."""
        plans = [self._settle_plan(row, st) for row, st in ended]
        for i in range(0, len(plans), SETTLE_BATCH):
            with self.ledger.tx() as s:
                for plan in plans[i:i + SETTLE_BATCH]:
                    try:
                        with s.begin_nested():
                            self._settle_in(s, *plan)
                    except LedgerError as e:
                        self.log.info("settle %s: %s", plan[0].id, e.message)

    def _settle_plan(self, row: WorkloadRow, st: BackendStatus) -> tuple:
        """What an ended workload is settled as (read outside the settling transaction)."""
        intent = self._intent(row)
        if intent == "preempting":
            state, reason, by = ("pending" if row.resumable else "preempted"), "preempted", "preempt"
        elif intent == "cancelling":
            state, reason, by = "cancelled", "cancelled", "cancel"
        elif intent == "requeueing":
            state, reason, by = "pending", "requeued by an admin", "requeue"
        elif st.timed_out:
            state, by = "timeout", "timeout"
            reason = f"time limit ({row.time_limit or 0:g} s) reached; stopped"
        elif st.exit_code is not None:
            state = "done" if st.exit_code == 0 else "failed"
            reason, by = f"exit code {st.exit_code}", "exit"
        elif not st.launched and (opened := self._never_launched(row)) is not None:
            # the decision was committed and the launch never happened (the service died or
            # lost the lease in between): it never ran, so nothing is charged and it waits
            # for its next start, resumable or not
            state, by = "pending", "reconcile"
            reason = ("never launched: the service stopped between deciding and launching "
                      "it; requeued")
            st = replace(st, ended_at=opened)
        elif st.unsupervised:  # its monitor was killed: the cgroup said when it ended
            state = "pending" if row.resumable else "failed"
            reason, by = ("exit code unknown: its launcher's monitor was killed; it ended when "
                          "its cgroup was found empty"
                          + ("; requeued" if row.resumable else "")), "reconcile"
        elif row.resumable:
            state, reason, by = "pending", "lost (service restart); requeued", "reconcile"
        else:
            state, reason, by = "failed", "lost: the process ended without an exit record", \
                "reconcile"
        end = st.ended_at  # None: settle at the interval's last checkpoint
        # the notice its user gets (once: where the backend did not enforce the limit, the
        # reaper recorded it when it stopped the workload)
        tell_timeout = by == "timeout" and not any(
            d.kind == "timeout" and d.at >= (row.started_at or 0)
            for d in self.ledger.decisions(workloads=[row.id], limit=5))
        return (row, st, state, reason, by, end, tell_timeout, intent)

    def _settle_in(self, s: Session, row: WorkloadRow, st: BackendStatus, state: str,
                   reason: str, by: str, end: float | None, tell_timeout: bool,
                   intent: str | None) -> None:
        """Record one settlement (see :meth:`_settle_plan`) in the transaction ``s``."""
        self.ledger.stop(row.id, now=end, state=state, closed_by=by, reason=reason,
                         exit_code=st.exit_code, s=s,
                         actor="reconcile" if by == "reconcile" else "scheduler")
        if by == "reconcile":  # no exit record: say how it was settled, for admins
            self.ledger.record_decision(
                now=self.clock(), kind="lost", workload=row.id, actor="reconcile",
                reason=reason, s=s,
                detail={"exit_code": None, "exit_code_known": False, "ended_at": end,
                        "monitor_lost": st.unsupervised, "state": state})
        if tell_timeout:
            self.ledger.record_decision(now=self.clock(), kind="timeout",
                                        workload=row.id, reason=reason, s=s)
        if intent == "preempting":  # the notice the interrupted preemption owed
            self.ledger.record_decision(now=self.clock(), kind="preempt",
                                        workload=row.id, reason="preempted",
                                        detail={"requeued": row.resumable}, s=s)

    def _never_launched(self, row: WorkloadRow) -> float | None:
        """When its open attempt was opened, if no launch of it ever returned (its backend
        reference was never set); else None."""
        full = self.ledger.get(row.id)
        if full is None or full.backend_ref:
            return None
        iv = self.ledger.open_interval(row.id)
        return iv.start if iv is not None else None

    def _reap(self, now: float) -> list[str]:
        """Settle ended local workloads; return the ids still alive."""
        alive: list[str] = []
        ended: list[tuple[WorkloadRow, BackendStatus]] = []
        # (the cycle's own reads, shared with build_state: reread only what changed)
        with self._live.lock:  # (request threads read through it too)
            open_iv = {c.workload: c for c in self._live.open_charges(self.ledger)[0]}
            live_rows = self._live.rows(self.ledger)
        mine = self.backend.name
        for row in [r for r in live_rows if r.state == "running" and r.backend == mine]:
            iv = open_iv.get(row.id)
            if iv is None:  # cannot happen (start opens one in the same transaction)
                continue
            st = self.backend.status(row.id, iv.seq)
            if st.alive and row.time_limit is not None \
                    and now > iv.start + row.time_limit + self.time_limit_slack:
                # the backend did not enforce the limit itself (the local launcher does)
                self.ledger.record_decision(now=now, kind="timeout", workload=row.id,
                                            reason=f"time limit {row.time_limit:g} s")
                st = self.backend.stop(row.id, iv.seq)
                st = BackendStatus(False, st.exit_code, st.ended_at or now, timed_out=True)
            if not st.alive and not st.launched and now - iv.start < self.start_grace:
                # opened moments ago, perhaps by a replica that led before this one and was
                # paused in its launch: the engine may list it any moment (it is looked up
                # there by name, not in this process's memory) — starting, not lost
                alive.append(row.id)
                continue
            if st.alive:
                alive.append(row.id)
                if (row.id, iv.seq) not in self._launch_known:
                    self._adopt_start(row, iv)
                if st.unsupervised:
                    self._monitor_lost(row.id, iv.seq, now)
            else:
                if st.launched and (row.id, iv.seq) not in self._launch_known:
                    self._adopt_start(row, iv)  # (a short job may end before it is seen)
                ended.append((row, st))
        self._settle_many(ended)  # (a few transactions for the lot, not one each)
        return alive

    def _adopt_start(self, row: WorkloadRow, iv) -> None:  # noqa: ANN001
        """A running attempt whose launch this replica did not record: launched by the
        replica that led before (at a takeover), possibly late — it was paused between
        committing the start and calling the engine, and the engine started the job after
        this replica took over, within the start grace (or its launch was not recorded: the
        database ended the transaction, the lease ran out). With no launch on record its charge
        still starts at the commit; it is moved to the engine's own start (the launcher's
        ``pid`` record, Slurm's job start), as :meth:`_launched` does for a launch of ours,
        and protection counts from then. Checked once per attempt (again while the engine
        does not say yet)."""
        key = (row.id, iv.seq)
        full = self.ledger.get(row.id)
        if full is None or full.state != "running" or full.backend_ref:
            self._launch_known.add(key)  # its launch was recorded by whoever launched it
            return
        try:
            found = self.backend.started(row.id, iv.seq)
        except Exception:  # noqa: BLE001 - the engine may be away: next cycle
            self.log.exception("reading when %s attempt %d started failed", row.id, iv.seq)
            return
        charge = self.ledger.open_interval(row.id)
        if found is None or charge is None or charge.seq != iv.seq:
            return
        ref, at = found
        shift = at - charge.start
        protected = None if full.protected_until is None or shift <= 0 \
            else full.protected_until + shift
        self._launched([(row.id, charge.id, ref, at, protected)])
        self._launch_known.add(key)
        if shift > 0:
            self.log.info("%s attempt %d: launched late by the replica that led before; "
                          "charged from the engine's start, %.3f s after its start was "
                          "committed", row.id, iv.seq, shift)

    @property
    def start_grace(self) -> float:
        """Seconds after its interval opened during which an attempt the engine does not
        list yet counts as starting (the backend's ``start_grace``; 30 s by default)."""
        return float(getattr(self.backend, "start_grace", 30.0))

    def _monitor_lost(self, wid: str, attempt: int, now: float) -> None:
        """Record, once per attempt, that a running job's monitor is gone: it is still charged
        (its cgroup holds processes) but its exit code will not be known."""
        key = (wid, attempt)
        if key in self._lost_told:
            return
        self._lost_told.add(key)
        if any(d.kind == "lost" and (d.detail or {}).get("attempt") == attempt
               for d in self.ledger.decisions(workloads=[wid], kind="lost", limit=20)):
            return  # told before a restart of the service
        self.log.warning("job %s attempt %d: its launcher's monitor is gone; it still runs "
                         "(its cgroup holds processes) and is charged until it is empty",
                         wid, attempt)
        self.ledger.record_decision(
            now=now, kind="lost", workload=wid, actor="reconcile",
            reason="its launcher's monitor was killed; it still runs (its cgroup holds "
                   "processes) and is charged until its cgroup is empty; its exit code "
                   "will be unknown", detail={"attempt": attempt, "monitor_lost": True,
                                              "still_running": True})

    @property
    def policy(self) -> Policy:
        return self.policy_fn()

    def build_state(self, now: float, tree: AccountTree | None = None
                    ) -> tuple[ClusterState, list]:
        """The ledger as the core sees it, with the budgets file's current tree and policy.

        This process is the ledger's only writer: while nothing that the scheduler reads was
        written since the last read (``Ledger.state_version``; checkpoints do not count) and
        the budgets are the same, that read still holds and is reused — a cycle in which
        nothing changed does not grow with the queue's length."""
        tree = tree if tree is not None else self.tree_fn()
        policy = self.policy
        key = (self.ledger.state_version, id(tree), id(policy))
        if self._last_read is not None and self._last_read[0] == key:
            state, rows = self._last_read[1], self._last_read[2]
        else:
            state, rows = build_state(self.ledger, tree, self.inventory, policy, now,
                                      sync_backends=self.sync_backends, live=self._live)
            self._last_read = (key, state, rows)
        # out of service: as the engine reports it now, and as the ledger records it (health
        # sources, admins, the engine's earlier reports; state.build_state reads those)
        return replace(state, unhealthy=frozenset(self._unhealthy) | state.unhealthy), rows

    # ------------------------------------------------------------------ cycle
    def cycle(self) -> list:
        try:
            decisions = self._cycle()
        except Exception as e:
            self.failed_cycles += 1
            self.last_error = f"{type(e).__name__}: {e}"
            raise
        self.last_error = None
        self.last_ok_at = self.clock()
        return decisions

    def _cycle(self) -> list:
        with self.lock:
            t0 = time.perf_counter()
            now = self.clock()
            alive = self._reap(now)
            if alive and now - self._checkpointed_at >= self.checkpoint_interval:
                # a crash loses at most the time since the last checkpoint of what ran on
                self.ledger.checkpoint(now, alive)
                self._checkpointed_at = now
            tree = self.tree_fn()
            self._unhealthy = self._node_health()
            self._record_engine_health(now)
            self._health = self._read_health()
            self._out = {n: r.reason for n, r in self._health.items() if not r.healthy}
            self._out.update(self._unhealthy)
            self._drained &= set(self._out)  # back in service: may be drained again
            state, rows = self.build_state(now, tree)
            # jobs that asked to start off-peak wait for their window, held out of the cycle
            state, off_peak_waits = off_peak_wait(state, now)
            # jobs that run after others: cancel those that never can, show the rest waiting
            self.view.held = settle(self.ledger, state, now) if state.finished or any(
                w.after for w in state.pending) else {}
            if off_peak_waits:
                self.view.held = {**self.view.held, **off_peak_waits}
            sched, decisions, self._model_lock = self._kept.cycle(state, now)
            inconsistent = dict(sched.inconsistent)
            for wid, why in inconsistent.items():
                if wid not in self.view.inconsistent:  # log once, not every cycle
                    self.log.error("workload %s left out of scheduling: %s", wid, why)
            by_id = {r.id: r for r in rows}
            # an engine that launches concurrently (Backend.concurrent_launch = n):
            # consecutive Starts are taken n at a time (and before the decision that follows
            # them), recorded in one transaction and launched together; otherwise each is
            # recorded and launched on its own
            together = self.backend.concurrent_launch
            starts: list[Start] = []
            for d in [*decisions, None]:
                if together and isinstance(d, Start):
                    starts.append(d)
                    if len(starts) < together:
                        continue
                    d = None
                if starts:
                    batch, starts = starts, []
                    self._applying(batch, by_id, now)
                if d is not None:
                    self._applying(d, by_id, now)
            self._sweep_orphans(now)
            self._check_usage(now)
            self._refresh_view(now, state, sched)
            self.view.inconsistent = inconsistent
            self.view.cycle_seconds = time.perf_counter() - t0
            if self.on_cycle:
                self.on_cycle(self.view.cycle_seconds)
            return decisions

    def _applying(self, what: object, by_id: dict, now: float) -> None:
        """Apply one decision, or a batch of Starts (recorded together, then launched)."""
        try:
            if isinstance(what, list):
                self._launch_started(self._start_many(what, by_id, now))
            else:
                self._apply(what, by_id, now)
        except NotLeader:  # the replica that leads now decides: apply nothing more
            raise
        except Exception:  # one failed decision must not stop the others
            self.log.exception("applying %r failed", what)

    def follow(self) -> None:
        """A standby replica's cycle: read the ledger as the leader left it and compute what
        the read endpoints serve (queue, standings, forecasts, nodes) — deciding nothing,
        applying nothing, writing nothing."""
        with self.lock:
            self.applying = False
            self.ledger.others_wrote()  # the leader wrote it: nothing cached holds
            now = self.clock()
            self._health = self._read_health()
            self._out = {n: r.reason for n, r in self._health.items() if not r.healthy}
            state, _rows = self.build_state(now)
            sched, _, self._model_lock = self._kept.cycle(state, now)
            self._refresh_view(now, state, sched)
            self.view.inconsistent = dict(sched.inconsistent)

    def _apply(self, d, by_id: dict, now: float) -> None:  # noqa: ANN001
        cycle = self.view.cycle + 1
        if isinstance(d, Preempt):
            row = by_id[d.workload]
            if row.backend != self.backend.name:
                self.ledger.record_decision(now=now, kind="preempt-requested", workload=row.id,
                                            reason=d.reason, cycle=cycle,
                                            detail={"for": d.for_workload,
                                                    "lost_gpu_hours": d.lost})
                return
            iv = self.ledger.open_interval(row.id)
            self.ledger.record_decision(now=now, kind="preempting", workload=row.id,
                                        reason=d.reason, cycle=cycle,
                                        detail={"for": d.for_workload,
                                                "lost_gpu_hours": d.lost})
            asked = self.clock()
            st = self.backend.stop(row.id, iv.seq if iv else 0)
            detail = {"for": d.for_workload, "requeued": row.resumable}
            fell_back = getattr(self.backend, "checkpoint_fallback", None)
            why = fell_back(row.id, iv.seq if iv else 0) if fell_back else None
            if why:  # checkpoint: auto, but signalled instead: the record says why
                detail["checkpoint_fallback"] = why
            took = getattr(self.backend, "checkpoint_taken", None)
            if took and (sid := took(row.id, iv.seq if iv else 0)):
                detail["checkpoint"] = sid  # checkpointed: it resumes where it stopped
            with self.ledger.tx() as s:
                self.ledger.stop(row.id, now=self._stopped_at(asked, st), closed_by="preempt",
                                 reason=d.reason,
                                 state="pending" if row.resumable else "preempted", s=s)
                self.ledger.record_decision(now=now, kind="preempt", workload=row.id,
                                            reason=d.reason, cycle=cycle, detail=detail, s=s)
        elif isinstance(d, Start):
            if (opened := self._start(d, by_id, now)) is not None:
                self._launch_started([opened])
        elif isinstance(d, Reserve):
            if self._reserved.get(d.workload) != d.at:
                self._reserved[d.workload] = d.at
                self.ledger.record_decision(now=now, kind="reserve", workload=d.workload,
                                            cycle=cycle, detail={"at": d.at})
        elif isinstance(d, Drain):
            if d.node not in self._drained:
                self._drained.add(d.node)
                why = self._out.get(d.node, "unhealthy")
                self.ledger.record_decision(now=now, kind="drain", cycle=cycle, reason=why,
                                            detail={"node": d.node})
                self.log.warning("node %s drained (%s): nothing protected left on it", d.node,
                                 why)
                self.backend.drain_node(d.node, why)  # the engine keeps it out too

    def _start(self, d: Start, by_id: dict, now: float, s: Session | None = None,
               told: list | None = None) -> tuple | None:
        """Record a Start: the workload runs and its charge opens (in ``s``, the caller's
        transaction, if given). What is left to launch (for :meth:`_launch_started`), or
        None where another part launches it (``on_start`` is then told at once, or after
        the caller's commit: appended to ``told``)."""
        row = by_id[d.workload]
        placement = placement_to_list(d.placement)
        # the charge opens when the intervals on its GPUs closed (its victims', stopped
        # after this cycle began), never before: one GPU is never charged twice
        charge = self.ledger.start(row.id, placement=placement, milli=d.placement.milli,
                                   backed=d.backed, protected_until=d.protected_until,
                                   now=now, backfill_until=d.backfill_until,
                                   cluster=self.cluster_of(d.placement.nodes),
                                   after_release=True, s=s)
        if charge.start > now:
            d = replace(d, protected_until=None if d.protected_until is None
                        else d.protected_until + charge.start - now)
        if row.backend != self.backend.name:
            # another part launches it (the hub spawner, for sessions): the ledger has
            # recorded the start and opened the charge; there is nothing to run here
            self.ledger.set_backend_ref(row.id, row.backend, s=s)
            if told is not None:
                told.append(row)
            else:
                self._reserved.pop(row.id, None)
                if self.on_start:
                    self.on_start(row, now)
            return None
        full = self.ledger.get(row.id, s=s)  # command and env: read only for what launches
        return (d, row, charge, placement, full, now)

    def _start_many(self, ds: list[Start], by_id: dict, now: float) -> list[tuple]:
        """Record several Starts in one transaction (each in a savepoint of its own: one the
        ledger refuses is logged and left out alone); what is left to launch. The
        transaction commits before anything is launched — a crash in between leaves the
        same open, unlaunched attempts as one Start's (reconciled or adopted as they are)."""
        opened: list[tuple] = []
        told: list[WorkloadRow] = []
        with self.ledger.tx() as s:
            for d in ds:
                try:
                    with s.begin_nested():
                        if (got := self._start(d, by_id, now, s, told)) is not None:
                            opened.append(got)
                except NotLeader:
                    raise
                except Exception:  # noqa: BLE001 - one failed decision must not stop the others
                    self.log.exception("applying %r failed", d)
        for row in told:
            self._reserved.pop(row.id, None)
            if self.on_start:
                self.on_start(row, now)
        return opened

    def _launch_started(self, started: list[tuple]) -> None:
        """Launch the attempts :meth:`_start` opened, together (``Backend.launch_many``: the
        Kubernetes backend sends them to the API server at once); each outcome is recorded
        for its own attempt, as one launch's would be."""
        if not started:
            return
        # fenced: the lease (and its token) is checked again right before the engine is
        # called — a replica paused since it committed the start launches nothing; the
        # attempt stays open and the replica that leads now looks it up in the engine
        self._still_leading()
        launches, moments = [], []
        for d, row, charge, placement, full, _now in started:
            launched_at = max(self.clock(), charge.start)
            shift = launched_at - charge.start
            protected = None if d.protected_until is None else d.protected_until + shift
            moments.append((launched_at, protected))
            launches.append(Launch(
                workload=row.id, attempt=charge.seq, user=row.user, project=row.project,
                command=list(full.command or []) if full else [], placement=placement,
                env=dict(full.env or {}) if full else {}, kind=row.kind,
                min_runtime=row.min_runtime,
                protected_until=protected, backed=d.backed,
                resumable=row.resumable, time_limit=row.time_limit,
                due_at=d.backfill_until))
        try:
            refs: list = self.backend.launch_many(launches)
        except Exception as e:  # noqa: BLE001 - none of them launched
            refs = [e] * len(launches)
        outcomes = []
        for (d, row, charge, _placement, _full, now), ref, (launched_at, protected) in zip(
                started, refs, moments, strict=True):
            if not isinstance(ref, BaseException):
                try:  # the engine's own start, when it says: a pause of this process between
                    found = self.backend.started(row.id, charge.seq)  # the clock and the call
                except Exception:  # noqa: BLE001 - (its start read later, at worst)
                    found = None
                if found is not None and found[1] > launched_at:
                    launched_at = found[1]
                    shift = launched_at - charge.start
                    protected = None if d.protected_until is None else \
                        d.protected_until + shift
            outcomes.append((d, row, charge, now, ref, launched_at, protected))
        # every outcome in one transaction (each in a savepoint of its own: one failed record
        # leaves the others); a crash before it commits leaves launched attempts with no
        # launch on record, adopted as any are (:meth:`_adopt_start`)
        recorded = []
        with self.ledger.tx() as s:
            for d, row, charge, now, ref, launched_at, protected in outcomes:
                try:
                    with s.begin_nested():
                        if isinstance(ref, BaseException):
                            self.ledger.stop(row.id, now=self.clock(), state="failed",
                                             closed_by="exit", reason=f"launch failed: {ref}",
                                             s=s)
                            self.log.error("applying %r failed", d, exc_info=ref)
                            continue
                        recorded.append((row, charge, now, ref, launched_at, protected))
                except NotLeader:
                    raise
                except Exception:  # noqa: BLE001 - one failed decision must not stop the others
                    self.log.exception("applying %r failed", d)
            self._launched([(row.id, charge.id, ref, at, protected if at > charge.start else None)
                            for row, charge, _now, ref, at, protected in recorded], s=s)
        for row, charge, now, *_ in recorded:
            self._launch_known.add((row.id, charge.seq))
            self._reserved.pop(row.id, None)
            if self.on_start:
                self.on_start(row, now)

    def _still_leading(self) -> None:
        """Raise :class:`NotLeader` unless this replica still leads: its lease is unexpired
        by its own clock and the ledger's lease row still carries its token (the same check
        as every write's, ``Lease.check``). Nothing to check with one service (SQLite)."""
        fence = self.ledger.fence
        if fence is None:
            return
        with self.ledger.ro() as s:
            fence(s)

    def _launched(self, launched: list[tuple[str, int, str, float, float | None]],
                  s: Session | None = None) -> None:
        """Record launches ``(workload, charge id, reference, at, protected_until)`` in one
        transaction (``s``, the caller's, if given): each one's backend reference and, when it
        came later than its start was committed (a slow engine, a paused service), the real
        start — the charge interval starts when the engine was called, and protection
        counts from then. One statement per table for all of them (executemany)."""
        if not launched:
            return
        c, dc, w = ChargeRow.__table__.c, DeviceClaimRow.__table__.c, WorkloadRow.__table__.c
        with self.ledger.tx(s) as s:
            opened = dict(s.execute(select(c.id, c.start).where(
                c.id.in_([x[1] for x in launched]), c.end.is_(None))).all())
            moved = [x for x in launched if x[1] in opened and opened[x[1]] < x[3]]
            if moved:  # (the GPUs it claims are held from then too)
                rows = [{"b_id": cid, "b_at": at} for _, cid, _, at, _ in moved]
                s.execute(update(ChargeRow.__table__).where(
                    c.id == bindparam("b_id"), c.end.is_(None), c.start < bindparam("b_at"))
                    .values(start=bindparam("b_at"), checkpoint=bindparam("b_at")), rows)
                s.execute(update(DeviceClaimRow.__table__).where(
                    dc.charge == bindparam("b_id"), dc.end.is_(None),
                    dc.start < bindparam("b_at")).values(start=bindparam("b_at")), rows)
            shapes: dict[tuple[str, ...], list[dict]] = {}
            moved_ids = {x[1] for x in moved}
            for wid, cid, ref, at, protected in launched:
                values: dict = {"backend_ref": ref}
                if cid in moved_ids:
                    values["started_at"] = at
                    if protected is not None:
                        values["protected_until"] = protected
                shapes.setdefault(tuple(values), []).append(
                    {"b_wid": wid, **{f"b_{k}": v for k, v in values.items()}})
            for keys, rows in shapes.items():
                s.execute(update(WorkloadRow.__table__)
                          .where(w.id == bindparam("b_wid"), w.state == "running")
                          .values({k: bindparam(f"b_{k}") for k in keys})
                          .execution_options(changed_workloads=[r["b_wid"] for r in rows]),
                          rows)

    def _record_engine_health(self, now: float) -> None:
        """The engine's view into the ledger (audited): a report that appears or changes marks
        the node unhealthy (source ``backend``); a node the engine marked and no longer
        reports returns to service. An admin's undrain stands against an unchanged report."""
        try:
            for node, why in sorted(self._unhealthy.items()):
                if self._engine_seen.get(node) != why and ledger_nodes.mark_unhealthy(
                        self.ledger, node, why, "backend", f"engine:{self.backend.name}", now):
                    self.log.warning("node %s unhealthy (the %s engine): %s — draining", node,
                                     self.backend.name, why)
            for node, row in self._read_health().items():
                if not row.healthy and row.source == "backend" and node not in self._unhealthy:
                    ledger_nodes.mark_healthy(
                        self.ledger, node, f"the {self.backend.name} engine no longer reports "
                        "a problem", "backend", f"engine:{self.backend.name}", now)
            self._engine_seen = dict(self._unhealthy)
        except LedgerError as e:  # audit only: scheduling goes on with the engine's view
            self.log.error("recording node health failed: %s", e.message)

    def _read_health(self) -> dict[str, NodeHealthRow]:
        """The ledger's node health, read again only after this process wrote to the ledger
        (like the state read: this process is the ledger's only writer)."""
        if self._health_read[0] != self.ledger.state_version:
            self._health_read = (self.ledger.state_version,
                                 ledger_nodes.node_health(self.ledger))
        return self._health_read[1]

    def _node_health(self) -> dict[str, str]:
        """Nodes the engine reports unhealthy; the previous answer if it cannot tell now."""
        try:
            return dict(self.backend.node_health())
        except Exception:  # noqa: BLE001 - an engine hiccup must not stop scheduling
            self.log.exception("node health from the %s backend failed", self.backend.name)
            return self._unhealthy

    def _check_usage(self, now: float) -> None:
        """Compare closed charge intervals with the engine's own accounting (Slurm: sacct),
        each once, one check interval after it closed. The ledger stays the truth; a mismatch
        is logged and recorded as a ``usage-mismatch`` decision for admins."""
        every = self.backend.usage_check_interval
        if not every or now - self._usage_checked_at < every:
            return
        self._usage_checked_at = now
        try:
            saved = self.ledger.get_state("usage_checked_until")
            mark = float(saved) if saved else now - 86400.0  # first check: the last day
            until = now - every
            if until <= mark:
                return
            closed = [c for c in self.ledger.charges(since=mark)
                      if c.end is not None and mark < c.end <= until]
            backends: dict[str, str] = {}
            for c in closed:
                if c.workload not in backends:
                    row = self.ledger.get(c.workload)
                    backends[c.workload] = row.backend if row is not None else ""
            ivs = [(c.workload, c.seq, c.start, c.end, backends[c.workload]) for c in closed]
            for m in self.backend.reconcile_usage(ivs):
                self.log.warning("usage mismatch: %s attempt %s: %s", m.get("workload"),
                                 m.get("attempt"), m.get("why"))
                self.ledger.record_decision(now=now, kind="usage-mismatch",
                                            workload=m.get("workload"), actor="reconcile",
                                            reason=str(m.get("why", "")), detail=m)
            self._engine_busy(ivs)
            self.ledger.set_state("usage_checked_until", repr(until))
        except Exception:  # noqa: BLE001 - accounting is advisory; scheduling goes on
            self.log.exception("usage reconciliation with the %s backend failed",
                               self.backend.name)

    def _engine_busy(self, ivs: list[tuple[str, int, float, float, str]]) -> None:
        """Busy time the engine's own GPU accounting recorded for finished work (Slurm:
        sacct's ``gres/gpuutil``), for the intervals nothing sampled while they ran (a
        sampled interval keeps its samples: never counted twice)."""
        from sqlalchemy import select

        from jupyter_gpubudget.ledger.models import BusyChargeRow

        if not ivs:
            return
        with self.ledger.ro() as s:
            measured = set(s.scalars(select(BusyChargeRow.workload).where(
                BusyChargeRow.workload.in_(sorted({w for w, *_ in ivs})))))
        todo = [iv for iv in ivs if iv[0] not in measured]
        try:
            samples = self.backend.gpu_busy(todo) if todo else []
        except Exception:  # noqa: BLE001 - accounting is advisory; scheduling goes on
            self.log.exception("GPU accounting from the %s backend failed", self.backend.name)
            return
        if samples:
            self.ledger.record_busy(samples)

    def _forecast_for(self, state: ClusterState, now: float) -> LazyForecast:
        """The forecast (core/offer.py), recomputed when the queue or the running set changed
        (at most every ``forecast_min_interval`` s) and at least every ``forecast_interval``
        s. It is replayed only as far as what is asked of it needs (``LazyForecast``: the
        queue page's and the sidebar's starts, a quote's slice shape), when it is asked, and
        keeps its answers until the next forecast."""
        key = (frozenset(w.id for w in state.pending), frozenset(w.id for w in state.running))
        age = now - self._forecast_at
        if self._forecast is None or age >= self.forecast_interval or (
                key != self._forecast_key and age >= self.forecast_min_interval):
            probes = {c["key"]: request_for(c["key"]) for c in slice_choices(self.inventory)}
            self._forecast = LazyForecast(state, now, probes=probes)
            self._forecast_keys = {k: req.shape for k, req in probes.items()}
            self._forecast_at, self._forecast_key = now, key
            if self.warm_forecast:
                self._warm(self._forecast, list(probes), [w.id for w in state.pending])
        return self._forecast

    def _warm(self, fc: LazyForecast, keys: list[str], pending: list[str]) -> None:
        """Replay forecast ``fc`` in the background, so that a quote or a queue page view
        seldom waits for it — never blocking the cycle. Forecasts are made at most every
        ``forecast_min_interval`` s (and at least every ``forecast_interval`` s), so the
        warming costs no more than computing each forecast whole did. The replay is the
        forecast's own: a request asking for an answer meanwhile waits on the forecast's lock
        at most for the answer being warmed (one slice shape's, or one queued workload's
        start), then takes what it needs from where the replay is (it continues; no step is
        taken twice). The leader and a standby both warm theirs (both serve the views)."""
        with self._warm_cond:
            self._warm_next = (fc, keys, pending)
            if self._warming is None:
                self._warming = threading.Thread(target=self._warm_worker, daemon=True,
                                                 name="gpubudget-forecast-warm")
                self._warming.start()

    def _warm_worker(self) -> None:
        while True:
            with self._warm_cond:
                job, self._warm_next = self._warm_next, None
                if job is None:
                    self._warming = None
                    self._warm_cond.notify_all()
                    return
            fc, keys, pending = job
            try:
                warm(fc, keys, pending, lambda fc=fc: self._forecast is fc)
                self._warm_failed = False
            except Exception:  # noqa: BLE001 - a request replays what it needs itself
                if not self._warm_failed:
                    self._warm_failed = True
                    self.log.exception("warming the forecast failed (requests replay it as "
                                       "far as they need)")

    def wait_warmed(self, timeout: float | None = None) -> bool:
        """Wait until no forecast is being warmed (tests and benchmarks); False on timeout."""
        with self._warm_cond:
            return self._warm_cond.wait_for(lambda: self._warming is None, timeout)

    def _refresh_view(self, now: float, state: ClusterState, sched: Scheduler) -> None:
        """The figures the API serves until the next cycle, from this cycle's scheduler (the
        state after its decisions) and one forecast — no second read of the ledger."""
        fc = self._forecast_for(state, now)
        v = View(at=now, cycle=self.view.cycle + 1, cycle_seconds=self.view.cycle_seconds)
        v.queue = sched.queue()
        v.standings = standings_of(sched, now)
        # predicted start: the reservation when there is one, else the forecast's start, else
        # (work that arrived since the forecast) when its slice shape frees up behind the
        # queue — each read from the forecast when a page asks for it
        pending = sched.pending
        v.reservations = PredictedStarts(
            fc, now, {w: pending[w].request.shape if w in pending else None for w in v.queue},
            self._forecast_keys, self._reserved)
        for w in sched.running.values():
            k = (w.project, w.kind)
            v.running[k] = v.running.get(k, 0) + 1
        for w in sched.pending.values():
            k = (w.project, w.kind)
            v.pending[k] = v.pending.get(k, 0) + 1
        if self._preemptions[0] != self.ledger.preemption_version:
            version = self.ledger.preemption_version  # (before the read)
            self._preemptions = (version, self.ledger.preemptions_by_project())
        v.preemptions = self._preemptions[1]
        v.quoter = Quoter(sched, fc, now, self._model_lock)
        v.lost_day_gpu_hours = sched.recent_loss(now)
        v.loss_budget_gpu_hours = sched.loss_budget()
        self._node_view(v, sched, now)
        v.preemption_forecast = self.outlooks.get(state, now)
        self.view = v
        if self.applying and self.warner is not None:  # (the leader only)
            try:
                self.warner(v.preemption_forecast, now)
            except NotLeader:
                raise
            except Exception:  # noqa: BLE001 - a warning never stops scheduling
                self.log.exception("warning of likely preemptions failed")

    def _node_view(self, v: View, sched: Scheduler, now: float) -> None:
        """Node states and GPU figures after this cycle's decisions; an unhealthy node found
        empty is recorded drained ("ready for repair") and the admin told (log, audit log,
        metrics, the pages' banner)."""
        on: dict[str, list] = {}
        allocated = idle_held = drained = 0.0
        for w in sched.running.values():
            frac = w.placement.fraction if w.placement else 0.0
            allocated += frac
            if w.idle:
                idle_held += frac
            for n in (w.placement.nodes if w.placement else ()):
                on.setdefault(n, []).append(w)
        for spec in self.inventory.nodes:
            ws = on.get(spec.name, [])
            ends = [w.protected_until for w in ws if w.is_protected(now) and not w.stopping]
            info = {"state": "in_service", "running": len(ws),
                    "protected_until": max(ends) if ends else None,
                    # GPU-equivalents held on it (the per-cluster metrics add them up)
                    "allocated": sum(sl.milli for w in ws if w.placement
                                     for sl in w.placement.slices
                                     if sl.node == spec.name and sl.gpu >= 0) / 1000}
            if spec.name in self._out:
                used = sum(s.milli for w in ws if w.placement for s in w.placement.slices
                           if s.node == spec.name and s.gpu >= 0) / 1000
                drained += max(0.0, len(spec.gpus) - used)
                info["state"] = "draining"
                row = self._health.get(spec.name)
                if not ws and row is not None and not row.healthy:
                    info["state"] = "ready_for_repair"
                    if self.applying and row.drained_at is None and ledger_nodes.mark_drained(
                            self.ledger, spec.name, now) is not None:
                        self.log.warning("node %s drained: ready for repair (%s)", spec.name,
                                         row.reason)
                        if self._drains_total is not None:
                            self._drains_total += 1
            v.nodes[spec.name] = info
        total = float(sum(len(n.gpus) for n in self.inventory.nodes))
        v.gpus = {"allocated": allocated, "drained": drained,
                  "idle": max(0.0, total - allocated - drained)}
        if self._drains_total is None:
            self._drains_total = ledger_nodes.drains_total(self.ledger)
        v.drains_total = self._drains_total
        prev = self.view
        dt = max(0.0, now - prev.at) if prev.at else 0.0
        v.idle_gpu_hours = {
            "unallocated": prev.idle_gpu_hours.get("unallocated", 0.0)
            + dt * prev.gpus.get("idle", 0.0) / 3600,
            "idle_session": prev.idle_gpu_hours.get("idle_session", 0.0)
            + dt * prev.idle_held / 3600}
        v.idle_held = idle_held

    def _stopped_at(self, asked: float, st: BackendStatus | None) -> float:
        """When a job asked to stop at ``asked`` ended, for its charge: the end its backend
        reports (Slurm: sacct, or when it left the queue) — a stop may take seconds to
        confirm, which are not charged — never before it was asked to stop nor after now."""
        now = self.clock()
        end = getattr(st, "ended_at", None)
        return now if end is None else min(max(end, asked), now)

    # ------------------------------------------------------------------ user actions
    def cancel(self, wid: str, by: str) -> WorkloadRow:
        """Cancel a pending or running job (serialised with the cycle)."""
        with self.lock:
            row = self.ledger.get(wid)
            if row is None:
                raise LedgerError(404, f"no workload {wid!r}")
            if row.state == "running" and row.backend == self.backend.name:
                iv = self.ledger.open_interval(wid)
                self.ledger.record_decision(now=self.clock(), kind="cancelling", workload=wid,
                                            actor=by)
                asked = self.clock()
                end = self._stopped_at(asked, self.backend.stop(wid, iv.seq if iv else 0))
            elif row.state not in ("pending", "running"):
                raise LedgerError(409, f"workload {wid} is already {row.state}")
            else:
                end = self.clock()
            with self.ledger.tx() as s:
                row = self.ledger.stop(wid, now=end, state="cancelled",
                                       closed_by="cancel", reason=f"cancelled by {by}", s=s)
                self.ledger.record_decision(now=self.clock(), kind="cancel", workload=wid,
                                            actor=by, s=s)
            return row

    def requeue(self, wid: str, by: str) -> WorkloadRow:
        """Stop a running batch job of this service's backend and put it back in the queue
        (an admin's action; serialised with the cycle). It keeps its place by submission."""
        with self.lock:
            row = self.ledger.get(wid)
            if row is None:
                raise LedgerError(404, f"no workload {wid!r}")
            if row.state != "running":
                raise LedgerError(409, f"workload {wid} is {row.state}, not running")
            if row.backend != self.backend.name:
                raise LedgerError(409, f"workload {wid} is run by {row.backend!r}, not by this "
                                       "service: stop it there (a session: end it)")
            iv = self.ledger.open_interval(wid)
            self.ledger.record_decision(now=self.clock(), kind="requeueing", workload=wid,
                                        actor=by)
            asked = self.clock()
            st = self.backend.stop(wid, iv.seq if iv else 0)
            with self.ledger.tx() as s:
                row = self.ledger.stop(wid, now=self._stopped_at(asked, st), state="pending",
                                       closed_by="requeue", reason=f"requeued by {by}", s=s)
                self.ledger.record_decision(now=self.clock(), kind="requeue", workload=wid,
                                            actor=by, reason=f"requeued by {by}", s=s)
            return row

    def set_node_health(self, node: str, healthy: bool, reason: str, by: str) -> bool:
        """An admin drains (``healthy=False``) or undrains a node. Returns whether anything
        changed. Undraining also returns it to service in the engine."""
        with self.lock:
            now = self.clock()
            if healthy:
                changed = ledger_nodes.mark_healthy(self.ledger, node, reason, "admin", by, now)
                if changed:
                    self._drained.discard(node)
                    self.backend.undrain_node(node)
                return changed
            return ledger_nodes.mark_unhealthy(self.ledger, node, reason, "admin", by, now)
