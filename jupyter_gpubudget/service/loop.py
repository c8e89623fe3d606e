"""The scheduling loop: rebuild state from the ledger, call ``core.schedule``, apply.

It holds no policy: every choice comes from the core's decisions. What it does itself is
bookkeeping: reap ended jobs, checkpoint open intervals, settle what a crash left behind, and
carry out decisions in order (Preempts before the Starts that follow them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from jupyter_gpubudget.backends.base import Backend, BackendStatus, Launch
from jupyter_gpubudget.core.model import Drain, Preempt, Reserve, Start
from jupyter_gpubudget.core.scheduler import predicted_starts, queue_order, schedule, standings
from jupyter_gpubudget.ledger import Ledger, LedgerError
from jupyter_gpubudget.ledger.models import WorkloadRow

from .state import build_state, placement_to_list


@dataclass
class View:
    """What the last cycle computed, served by the REST API and /metrics without recomputing."""

    at: float = 0.0
    cycle: int = 0
    queue: list[str] = field(default_factory=list)  # pending ids in rank order
    reservations: dict[str, float] = field(default_factory=dict)
    standings: dict[str, dict[str, float]] = field(default_factory=dict)
    running: dict[tuple[str, str], int] = field(default_factory=dict)  # (project, kind) -> n
    pending: dict[tuple[str, str], int] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)  # project -> total
    cycle_seconds: float = 0.0

    def position(self, wid: str) -> int | None:
        try:
            return self.queue.index(wid) + 1
        except ValueError:
            return None


class SchedulingLoop:
    def __init__(self, ledger: Ledger, tree_fn: Callable, inventory, policy,  # noqa: ANN001
                 backend: Backend, log: logging.Logger | None = None,
                 clock: Callable[[], float] = time.time,
                 on_cycle: Callable[[float], None] | None = None) -> None:
        self.ledger = ledger
        self.tree_fn = tree_fn  # -> AccountTree of the budgets file (reloadable)
        self.inventory = inventory
        self.policy = policy
        self.backend = backend
        self.log = log or logging.getLogger("gpubudget.loop")
        self.clock = clock
        self.on_cycle = on_cycle
        self.view = View()
        self.lock = threading.Lock()  # one cycle or state change of a running workload at a time
        self._reserved: dict[str, float] = {}
        #: seconds past a job's time_limit after which the loop stops it itself: a backend's
        #: own enforcement (the local launcher's: SIGTERM, grace, SIGKILL) comes first
        self.time_limit_slack = float(getattr(backend, "stop_grace", 10.0)) + 30.0
        self._drained: set[str] = set()

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
            running = {(w, c.seq) for w, c in self.ledger.open_intervals().items()}
            for wid, attempt in self.backend.orphans(running):
                self.log.warning("stopping orphan %s attempt %d", wid, attempt)
                self.backend.stop(wid, attempt)

    def _intent(self, row: WorkloadRow) -> str | None:
        """'preempting' or 'cancelling' when a stop was under way when the service died."""
        last = self.ledger.decisions(workloads=[row.id], limit=1)
        if last and last[0].kind in ("preempting", "cancelling") \
                and last[0].at >= (row.started_at or 0):
            return last[0].kind
        return None

    def _settle(self, row: WorkloadRow, st: BackendStatus) -> None:
        """A local workload that is no longer alive: close its interval and decide its state."""
        intent = self._intent(row)
        if intent == "preempting":
            state, reason, by = ("pending" if row.resumable else "preempted"), "preempted", "preempt"
        elif intent == "cancelling":
            state, reason, by = "cancelled", "cancelled", "cancel"
        elif st.timed_out:
            state, by = "timeout", "timeout"
            reason = f"time limit ({row.time_limit or 0:g} s) reached; stopped"
        elif st.exit_code is not None:
            state = "done" if st.exit_code == 0 else "failed"
            reason, by = f"exit code {st.exit_code}", "exit"
        elif row.resumable:
            state, reason, by = "pending", "lost (service restart); requeued", "reconcile"
        else:
            state, reason, by = "failed", "lost: the process ended without an exit record", \
                "reconcile"
        end = st.ended_at  # None: settle at the interval's last checkpoint
        try:
            with self.ledger.tx() as s:
                self.ledger.stop(row.id, now=end, state=state, closed_by=by, reason=reason,
                                 exit_code=st.exit_code, s=s,
                                 actor="reconcile" if by == "reconcile" else "scheduler")
                if intent == "preempting":  # the notice the interrupted preemption owed
                    self.ledger.record_decision(now=self.clock(), kind="preempt",
                                                workload=row.id, reason="preempted",
                                                detail={"requeued": row.resumable}, s=s)
        except LedgerError as e:
            self.log.info("settle %s: %s", row.id, e.message)

    def _reap(self, now: float) -> list[str]:
        """Settle ended local workloads; return the ids still alive."""
        alive: list[str] = []
        open_iv = self.ledger.open_intervals()
        for row in self.ledger.workloads(states=("running",), backend=self.backend.name):
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
            if st.alive:
                alive.append(row.id)
            else:
                self._settle(row, st)
        return alive

    # ------------------------------------------------------------------ cycle
    def cycle(self) -> list:
        with self.lock:
            t0 = time.perf_counter()
            now = self.clock()
            alive = self._reap(now)
            if alive:
                self.ledger.checkpoint(now, alive)
            tree = self.tree_fn()
            state, rows = build_state(self.ledger, tree, self.inventory, self.policy, now)
            decisions = schedule(state, now)
            by_id = {r.id: r for r in rows}
            for d in decisions:
                try:
                    self._apply(d, by_id, now)
                except Exception:  # one failed decision must not stop the others
                    self.log.exception("applying %r failed", d)
            changed = any(isinstance(d, Start | Preempt) for d in decisions)
            self._refresh_view(tree, now, changed=changed, state=state)
            self.view.cycle_seconds = time.perf_counter() - t0
            if self.on_cycle:
                self.on_cycle(self.view.cycle_seconds)
            return decisions

    def _apply(self, d, by_id: dict[str, WorkloadRow], now: float) -> None:  # noqa: ANN001
        cycle = self.view.cycle + 1
        if isinstance(d, Preempt):
            row = by_id[d.workload]
            if row.backend != self.backend.name:
                self.ledger.record_decision(now=now, kind="preempt-requested", workload=row.id,
                                            reason=d.reason, cycle=cycle,
                                            detail={"for": d.for_workload})
                return
            iv = self.ledger.open_interval(row.id)
            self.ledger.record_decision(now=now, kind="preempting", workload=row.id,
                                        reason=d.reason, cycle=cycle,
                                        detail={"for": d.for_workload})
            self.backend.stop(row.id, iv.seq if iv else 0)
            with self.ledger.tx() as s:
                self.ledger.stop(row.id, now=self.clock(), closed_by="preempt", reason=d.reason,
                                 state="pending" if row.resumable else "preempted", s=s)
                self.ledger.record_decision(now=now, kind="preempt", workload=row.id,
                                            reason=d.reason, cycle=cycle,
                                            detail={"for": d.for_workload,
                                                    "requeued": row.resumable}, s=s)
        elif isinstance(d, Start):
            row = by_id[d.workload]
            placement = placement_to_list(d.placement)
            charge = self.ledger.start(row.id, placement=placement, milli=d.placement.milli,
                                       backed=d.backed, protected_until=d.protected_until,
                                       now=now)
            if row.backend != self.backend.name:
                # another part launches it (the hub spawner, for sessions): the ledger has
                # recorded the start and opened the charge; there is nothing to run here
                self.ledger.set_backend_ref(row.id, row.backend)
                self._reserved.pop(row.id, None)
                return
            try:
                ref = self.backend.launch(Launch(
                    workload=row.id, attempt=charge.seq, user=row.user, project=row.project,
                    command=list(row.command or []), placement=placement,
                    env=dict(row.env or {}), time_limit=row.time_limit))
            except Exception as e:  # noqa: BLE001
                self.ledger.stop(row.id, now=self.clock(), state="failed", closed_by="exit",
                                 reason=f"launch failed: {e}")
                raise
            self.ledger.set_backend_ref(row.id, ref)
            self._reserved.pop(row.id, None)
        elif isinstance(d, Reserve):
            if self._reserved.get(d.workload) != d.at:
                self._reserved[d.workload] = d.at
                self.ledger.record_decision(now=now, kind="reserve", workload=d.workload,
                                            cycle=cycle, detail={"at": d.at})
        elif isinstance(d, Drain):
            if d.node not in self._drained:
                self._drained.add(d.node)
                self.ledger.record_decision(now=now, kind="drain", cycle=cycle,
                                            detail={"node": d.node})

    def _refresh_view(self, tree, now: float, changed: bool, state) -> None:  # noqa: ANN001
        if changed:
            state, _ = build_state(self.ledger, tree, self.inventory, self.policy, now)
        v = View(at=now, cycle=self.view.cycle + 1, cycle_seconds=self.view.cycle_seconds)
        v.queue = queue_order(state, now)
        v.standings = standings(state, now)
        pend = set(v.queue)
        # predicted start: the core's replay of the queue, or the reservation when there is one
        v.reservations = {w: t for w, t in predicted_starts(state, now).items() if w in pend}
        v.reservations.update({w: t for w, t in self._reserved.items() if w in pend})
        for w in state.running:
            k = (w.project, w.kind)
            v.running[k] = v.running.get(k, 0) + 1
        for w in state.pending:
            k = (w.project, w.kind)
            v.pending[k] = v.pending.get(k, 0) + 1
        v.preemptions = self.ledger.preemptions_by_project()
        self.view = v

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
                self.backend.stop(wid, iv.seq if iv else 0)
            elif row.state not in ("pending", "running"):
                raise LedgerError(409, f"workload {wid} is already {row.state}")
            with self.ledger.tx() as s:
                row = self.ledger.stop(wid, now=self.clock(), state="cancelled",
                                       closed_by="cancel", reason=f"cancelled by {by}", s=s)
                self.ledger.record_decision(now=self.clock(), kind="cancel", workload=wid,
                                            actor=by, s=s)
            return row
