"""The one entry point: ``schedule(state, now) -> list[Decision]``, and its incremental form.

:class:`Scheduler` holds the capacity model, the queue and the usage meter in memory. Its
``cycle(now)`` is a full scheduling cycle, whose numbered steps (``_cycle``) are: standings
of every account; drains of unhealthy nodes; rank pending work (ranking.py); backed work in
rank order, placed if it fits (placement.py), else preempted for (preemption_search.py,
lane.py) or, for a blocked gang, reserved for (backfill.py, drains.py); then unbacked work on
whatever is still idle. ``submit``, ``finish`` and ``cancel`` are the incremental path for
one arrival or departure: they place what fits into free capacity in rank order and leave
re-ranking, preemption and reservations to the next cycle. Decisions are applied to the
Scheduler's own model as they are made. ``schedule(state, now)`` builds a Scheduler from a
:class:`ClusterState` and runs one cycle — the live service and the simulator run exactly
this code.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace

from . import fragmentation
from .accounts import AccountTree
from .backfill import leasable, place_reserved, reserved_until
from .backing import Backing
from .capacity import Cluster
from .cycle import CycleState, idle_pass, memo_key, preempt_for, reclaim, reserve_gang
from .drains import LOSS_WINDOW as LOSS_WINDOW  # the service asks its ledger for this window
from .drains import LossBudget, drain_nodes
from .holds import runnable
from .inventory import Inventory
from .lane import ShortLane
from .model import (
    HOUR,
    Decision,
    Placement,
    Policy,
    Preempt,
    RuntimeHistory,
    SliceRequest,
    Start,
    Workload,
)
from .predict import Predictor, RunningEnds, next_free
from .preemption import preemption_cost
from .preemption_search import take, victim_pool
from .ranking import RankMemo, Standings, rank
from .reservations import Bookings
from .state import ClusterState as ClusterState
from .state import load_running, new_cluster, paused_gc
from .usage import UsageMeter
from .workqueue import WorkQueue, with_interconnect


class Scheduler:
    """The capacity model, the queue, the usage meter and the running work of one cluster,
    in memory, with the decisions of a full cycle (:meth:`cycle`) or of one arrival or
    departure (:meth:`submit`, :meth:`finish`, :meth:`cancel`) applied to them as they are
    made. Each duty is a collaborator of its own: the queue (``waiting``), predictions
    (``predictor``, ``ends``), standings and backing (``backing``), the short lane
    (``lane``) and the loss budget (``loss``)."""

    def __init__(self, accounts: AccountTree, inventory: Inventory, policy: Policy | None = None,
                 history: RuntimeHistory | None = None, unhealthy: Iterable[str] = (),
                 cluster: Cluster | None = None) -> None:
        self.inventory = inventory
        self.policy = policy or Policy()
        self.history = history if history is not None else RuntimeHistory()
        self.unhealthy: set[str] = set(unhealthy)
        self.waiting = WorkQueue()  # pending work and its order
        self.rank_memo = RankMemo()  # the orders of the last cycle's ranking, kept
        self.cluster = self._fresh_cluster(cluster)  # (or one kept from an earlier cycle)
        self.meter = UsageMeter(self.policy)
        self.running: dict[str, Workload] = {}
        self.reservations: dict[str, tuple[float, Placement]] = {}
        # per waiting gang, the start its first reservation planned (Policy.gang_overdue_after)
        self.first_planned: dict[str, float] = {}
        self.drained: set[str] = set()
        self.capacity_gpu_hours = inventory.gpu_count * self.policy.window / HOUR
        self.predictor = Predictor(self.history, self.policy,
                                   max((len(n.gpus) for n in inventory.nodes), default=0))
        self.predict = self.predictor.predict
        self.predict_long = self.predictor.predict_long
        self.short = self.predictor.short
        self.demand = self.predictor.demand
        self.waits_for_nodes = self.predictor.waits_for_nodes
        self.gain_horizon = self.predictor.gain_horizon
        # within one cycle: predicted ends of running work (sorted again when it changes)
        self.ends = RunningEnds(self.predictor, self.policy)
        self.backing = Backing(accounts, self.capacity_gpu_hours, self.policy)
        self.grants = self.backing.grants
        #: running workloads left out of the state because their placement is impossible
        #: (no placement, or a slice already held): (id, why), for the caller to report
        self.inconsistent: list[tuple[str, str]] = []
        self.lane = ShortLane()  # GPUs kept for the short lane (Policy.short_lane_hold)
        self.bookings = Bookings()  # advance reservations (ClusterState.bookings)
        # what preemptions threw away in the trailing day (Policy.finish_drain_budget)
        self.loss = LossBudget(self.policy, inventory.gpu_count)
        self.recent_loss = self.loss.recent  # GPU-hours thrown away in the trailing day
        self.loss_budget = self.loss.budget  # ... and how many may be (0: no budget)

    @property
    def accounts(self) -> AccountTree:
        """The account tree (changed by :meth:`set_accounts`)."""
        return self.backing.accounts

    @property
    def _st(self) -> Standings | None:
        """The standings of the last full cycle (None: none yet)."""
        return self.backing.st

    @property
    def _committed(self) -> dict[str, float]:
        """Per account, the GPU-hours the protected runs going on under it still hold."""
        return self.backing.committed

    @property
    def pending(self) -> dict[str, Workload]:
        """Pending workloads by id."""
        return self.waiting.pending

    @property
    def mix(self) -> dict[tuple[object, ...], float]:
        """Decayed histogram of request shapes."""
        return self.waiting.mix

    @property
    def recent_losses(self) -> deque[tuple[float, float]]:
        """(time, GPU-hours thrown away) of the preemptions in the trailing day, oldest first."""
        return self.loss.losses

    # the collaborators' state under the names it had when it was the Scheduler's own
    @property
    def _order(self) -> list[tuple[float, int, str]]:
        return self.waiting.order

    @property
    def _shape_count(self) -> dict[tuple[object, ...], int]:
        return self.waiting.shape_count

    # ================================================================= building
    def new_cluster(self) -> Cluster:
        """An empty capacity model of the inventory, with the policy's placement rules."""
        return new_cluster(self.inventory, self.unhealthy, self.policy)

    def _fresh_cluster(self, kept: Cluster | None = None) -> Cluster:
        """:meth:`new_cluster` (or ``kept``: kept.py), with a new FGD index if the policy says."""
        c = self.new_cluster() if kept is None else kept
        if self.policy.placement == "fgd":
            c.frag = None
            fragmentation.index_for(c, fragmentation.MixView(self.mix))
        return c

    @classmethod
    def from_state(cls, state: ClusterState, kept: Cluster | None = None) -> Scheduler:
        """A scheduler of ``state``; ``kept``: a model kept from an earlier cycle (kept.py)."""
        s = cls(state.accounts, state.inventory, state.policy, state.history, state.unhealthy, kept)
        for c in state.charges:
            s.meter.add(c)
        for w in state.running:
            if w.placement is None:
                s.inconsistent.append((w.id, "running without a placement"))
                continue
            s.running[w.id] = w
        s.cluster = load_running(s.cluster, s.running, s.inconsistent, s._fresh_cluster,
                                 s.unhealthy if kept is not None else None)
        s.waiting.add_all(runnable(state.pending, state.running, state.finished),  # holds.py
                          s.running, s.policy)
        s.loss.losses.extend(sorted(state.recent_losses))
        s.bookings = Bookings(state.bookings)
        return s

    def usage_hours(self, now: float) -> dict[str, float]:  # per account, in the window
        return self.standings(now).usage

    def standings(self, now: float) -> Standings:
        """Where every account stands now (:meth:`Backing.stand`)."""
        return self.backing.stand(*self.meter.split(now), self.running.values(), now)

    _standings = standings  # its old name

    def next_free(self, req: SliceRequest, now: float) -> float:
        """Seconds until running work is predicted to free capacity ``req`` needs
        (:func:`predict.next_free`)."""
        return next_free(self.cluster, req, now, lambda: self.ends.running(self.running, now))

    def is_backed(self, w: Workload, now: float) -> bool:
        """Does the project's grant (and every ancestor's) cover its window usage, the protected
        time already promised, and this workload's protected demand (:meth:`Backing.backs`)?"""
        return self.backing.backs(w, lambda: self.standings(now))

    def queue(self) -> list[str]:
        """Pending workload ids in the order they will be considered."""
        return self.waiting.ids()

    # ================================================================= queue
    def _enqueue(self, w: Workload, key: float | None = None, bulk: bool = False) -> Workload:
        if w.id in self.pending or w.id in self.running:
            raise ValueError(f"workload {w.id} is already known")
        w = with_interconnect(w, self.policy)
        self.waiting.add(w)
        if key is None:
            key = self.waiting.arrival_key(w, self.accounts, self.grants(), self._st,
                                           self.short, self.demand)
        self.waiting.put(w.id, key, bulk)
        return w

    def _dequeue(self, wid: str) -> Workload:
        w = self.waiting.remove(wid)
        self.first_planned.pop(wid, None)
        own = self.reservations.pop(wid, None)
        if own is not None:  # its reserved GPUs are no longer held back
            for sl in own[1].slices:
                self.cluster.by_name[sl.node].gpus[sl.gpu].reserved_at = float("inf")
        return w

    def _place(self, w: Workload, end: float, now: float | None = None) -> Placement | None:
        """Place ``w``; a workload may always use the GPUs reserved for itself. Given
        ``now``, leasable work (:func:`backfill.leasable`) that fits nowhere else may take
        GPUs a gang has reserved from ``now + policy.backfill_lease`` (or its protection's
        end) on or later."""
        p = place_reserved(self.cluster, self.reservations, w, end)
        if p is None and now is not None and self.reservations and leasable(w, self.policy):
            # at least the lease, and never due before its protection ends (semantics 2)
            due = now + max(self.policy.backfill_lease, self.policy.effective_min_runtime(w))
            if end > due:
                with self.lane.closed(now):
                    p = place_reserved(self.cluster, self.reservations, w, due)
        return p

    def _start(self, w: Workload, placement: Placement, backed: bool, now: float,
               out: list[Decision]) -> None:
        backfill_until = reserved_until(self.cluster, placement, self.lane.keeps)
        self.cluster.allocate(w.id, placement)
        self._dequeue(w.id)
        protected = self.bookings.protect(w, placement, now, self.policy) if backed else None
        started = replace(w, started_at=now, placement=placement, backed=backed,
                          protected_until=protected, idle=False, stopping=False,
                          backfill_until=backfill_until)
        self.running[w.id] = started
        self.ends.started(started, now)
        self.meter.open_interval(w.id, w.project, w.user, placement.milli, now)
        if backed and protected is not None:
            self.backing.promise(w, placement, protected, now)
        out.append(Start(w.id, placement, backed, protected, backfill_until))

    def _stop(self, wid: str, now: float) -> Workload:
        w = self.running.pop(wid)
        self.ends.stopped(wid)
        self.cluster.release(wid)
        self.meter.close(wid, now)
        self.predictor.forget(wid)
        self.backing.release(w, now)
        return w

    def _preempt(self, v: Workload, now: float, reason: str, for_wid: str | None,
                 out: list[Decision]) -> None:
        """Preempt ``v``. One that stops at once releases its slice now; one that does not
        (a session being snapshotted) is marked stopping and holds its slice until its holder
        reports it gone."""
        if v.is_protected(now):  # semantics 2: a guard, not a choice
            raise AssertionError(f"refusing to preempt protected workload {v.id}")
        lost = preemption_cost(v, now, self.policy)
        if v.stops_at_once:
            self._stop(v.id, now)
        else:
            self.running[v.id] = replace(v, stopping=True)
        self.loss.add(now, lost)
        out.append(Preempt(v.id, reason, for_wid, lost))

    # ================================================================= incremental path
    def submit(self, w: Workload, now: float) -> list[Decision]:
        """One arrival: queue it, and start it at once if it fits idle capacity."""
        if self._st is None:
            self.standings(now)
        w = self._enqueue(w)
        out: list[Decision] = []
        backed = self.is_backed(w, now)
        p = self._place(w, now + self.predict_long(w), now)
        if p is not None:
            self._start(w, p, backed, now, out)
        return out

    def finish(self, wid: str, now: float) -> list[Decision]:
        """A completion: release, learn its run time, then fill the freed capacity."""
        return self._depart(wid, now, learn=True)

    def cancel(self, wid: str, now: float) -> list[Decision]:
        """Stopped by its owner or an admin: like a departure, but its run time says nothing
        about how long such work takes, so it is not learnt for prediction."""
        return self._depart(wid, now, learn=False)

    def _depart(self, wid: str, now: float, learn: bool) -> list[Decision]:
        if wid in self.running:
            w = self._stop(wid, now)
            if learn and w.started_at is not None:
                self.history.add_run(w, now - w.started_at)
            return self._fill(now)
        if wid in self.pending:
            self._dequeue(wid)
        return []

    def _fill(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        self.lane.top_up(self.cluster, self.policy)
        while self._fill_pass(now, out):
            pass  # a start on GPUs reserved for it freed the rest of them: look again
        return out

    def _fill_pass(self, now: float, out: list[Decision]) -> bool:
        """Start what fits, in rank order; True when a workload started on its own
        reservation (the GPUs held for it are no longer held back, so work passed over
        before may fit now)."""
        # whether a shape fits depends on its predicted end only against the times GPUs are
        # held back to (reservations, the short lane): work ending before one may fit where
        # longer work of the same shape did not
        res_times = sorted({at for at, _ in self.reservations.values()}
                           | ({self.lane.until} if self.lane.held else set()))
        failed: set[tuple[object, ...]] = set()
        q = self.waiting  # memo_key and q.current inlined: a forecast runs this 100× a cycle
        pending, seqs, reservations = q.pending, q.seq, self.reservations
        known, predict_long, lease = (self.predictor.predicted_long, self.predict_long,
                                      self.policy.backfill_lease > 0)
        for _, seq, wid in list(q.order):
            if not res_times and len(failed) >= len(q.shape_count):
                break  # no shape fits any more
            w = pending.get(wid)
            if w is None or seqs.get(wid) != seq:
                continue  # a stale entry
            pl = known.get(wid)
            end = now + (pl if pl is not None else predict_long(w))
            memo = (w.request.shape, bisect_left(res_times, end) if res_times else 0,
                    lease and leasable(w, self.policy))
            own = wid in reservations
            if memo in failed and not own:
                continue
            p = self._place(w, end, now)
            if p is None:
                failed.add(memo)
                continue
            self._start(w, p, self.is_backed(w, now), now, out)
            if own:
                return True
        return False

    def set_healthy(self, node: str, healthy: bool) -> None:
        self.cluster.set_healthy(node, healthy)
        if healthy:
            self.unhealthy.discard(node)
            self.drained.discard(node)
        else:
            self.unhealthy.add(node)

    def fail_node(self, node: str, now: float) -> list[str]:
        """The node died: everything on it stops now, protected or not (docs/core.md semantics 2's
        one exception). Returns the stopped workload ids; the caller decides what requeues."""
        self.set_healthy(node, False)
        victims = [wid for wid, w in self.running.items()
                   if w.placement and node in w.placement.nodes]
        for wid in victims:
            self._stop(wid, now)
        return victims

    def set_accounts(self, accounts: AccountTree) -> None:
        """A budget change: new grants apply from the next cycle."""
        self.backing.set_accounts(accounts)

    # ================================================================= full cycle
    def cycle(self, now: float) -> list[Decision]:
        with paused_gc():
            return self._cycle(now)

    def _cycle(self, now: float) -> list[Decision]:
        # 1. usage, grants and standings of every account; last cycle's plans forgotten
        cyc = self._begin_cycle(now)
        # 2. drain: unhealthy nodes get nothing new, their unprotected work leaves; bookings
        drain_nodes(now, cyc.out, self.unhealthy, self.drained, self.cluster, self.running,
                    self._preempt)
        self.bookings.step(cyc, self.pending, self._start, self._preempt, self.is_backed)
        # 3. rank pending work
        ranked = self._rank(cyc.st)
        # 4. the running work that may be preempted
        cyc.pool = victim_pool(self.running, now) if self.policy.preemption else {}
        # 5. backed work in rank order: start it, preempt for it, or reserve for a gang
        self._backed_pass(cyc, ranked)
        # 6. unbacked work on idle capacity, and work that may fit again after a preemption
        self._idle_pass(cyc)
        return cyc.out

    def _begin_cycle(self, now: float) -> CycleState:
        """A new cycle's state: predictions, reservations and the short lane's GPUs made
        afresh, every account standing where its usage puts it now."""
        self.predictor.new_cycle()
        st = self.standings(now)
        self.cluster.clear_reservations()
        self.lane.hold(self.cluster, self.policy, self.history, now)
        self.reservations.clear()
        self.ends.changed()
        return CycleState(now, st, self.policy, self.cluster, self.running, self.reservations,
                          self.first_planned, self._take)

    def _rank(self, st: Standings) -> list[tuple[float, Workload]]:
        """Pending work of known projects in rank order (ranking.py), which becomes the
        queue's order; work of unknown projects stays queued, last, and never starts."""
        ranked = rank(list(self.pending.values()), self.accounts, st, self.demand, self.short,
                      self.rank_memo)
        unranked = [] if len(ranked) == len(self.pending) else [
            w for w in self.pending.values() if not self.accounts.is_project(w.project)]
        self.waiting.rerank(ranked, unranked)
        return ranked

    def _backed_pass(self, cyc: CycleState, ranked: list[tuple[float, Workload]]) -> None:
        """Consider backed work in rank order (:meth:`_consider`); unbacked work, and work
        that does not start, is left for :meth:`_idle_pass`."""
        now, pending, paths = cyc.now, self.pending, cyc.st.path_standing
        backs, stand = self.backing.backs, lambda: self.standings(now)
        for _, w in ranked:
            if w.id not in pending or cyc.full():
                continue
            if not backs(w, stand):  # (whether its shape fits: the idle pass's question)
                cyc.later.append((w, -1))
                continue
            req = w.request
            end = now + self.predict_long(w)
            if memo_key(w, end, cyc.res_times, self.policy) in cyc.failed \
                    and not (req.kind == "gpu" and req.gpus >= 2
                             and len(self.reservations) < self.policy.max_reservations):
                # its shape no longer fits; no need to consider it unless preemption may help
                worst = cyc.preempt_failed.get(req.shape)
                if not cyc.pool or (worst is not None and paths[w.project] >= worst):
                    cyc.later.append((w, cyc.memo_gen))
                    continue
            if self.lane.held and req.kind == "gpu" and req.gpus > self.lane.room:
                with self.lane.lifted():  # a gang that needs the kept GPUs to fit at all
                    self._consider(cyc, w)
            else:
                self._consider(cyc, w)
            if w.id in pending:  # may fit what a preemption for work ranked after it frees
                cyc.later.append((w, cyc.memo_gen))

    def _idle_pass(self, cyc: CycleState) -> None:
        """Unbacked work on idle capacity, and work that may fit again (cycle.idle_pass)."""
        idle_pass(cyc, self.pending, self.waiting.shape_count, self.predict_long, self._place,
                  lambda w, p: self._start(w, p, self.is_backed(w, cyc.now), cyc.now, cyc.out))

    def _consider(self, cyc: CycleState, w: Workload) -> None:
        """Backed ``w``: start it where it fits; else reclaim overdue backfill for a gang,
        or preempt for it (by standing, or for the short lane); else reserve for a gang."""
        now, failed = cyc.now, cyc.failed
        end = now + self.predict_long(w)
        memo = memo_key(w, end, cyc.res_times, self.policy)
        if memo not in failed or w.id in self.reservations:
            p = self._place(w, end, now)
            if p is not None:
                self._start(w, p, True, now, cyc.out)
                return
            failed.add(memo)
        gang = w.request.kind == "gpu" and w.request.gpus >= 2
        if self.policy.backfill and gang and reclaim(cyc, w, end):
            cyc.capacity_changed()
            return
        if (cyc.pool and self.policy.preemption and w.project in cyc.st.path_standing
                and preempt_for(cyc, w, end, gain_horizon=lambda: min(
                    self.gain_horizon(w), self.next_free(w.request, now)), short=self.short,
                    accounts=self.accounts, grants=self.grants(), committed=self._committed)):
            cyc.capacity_changed()
            return
        if (self.policy.backfill and gang
                and len(self.reservations) < self.policy.max_reservations):
            reserve_gang(cyc, w, end, lambda: self.ends.reserving(self.running, now), self.loss)

    def _take(self, w: Workload, victims: list[Workload], end: float, now: float,
              out: list[Decision], pool: dict[str, Workload] | None,
              reason: Callable[[Workload], str]) -> None:
        """Preempt ``victims`` for ``w`` and start it (:func:`preemption_search.take`)."""
        take(w, victims, end, now, out, pool, reason, cluster=self.cluster,
             running=self.running, reservations=self.reservations, policy=self.policy,
             preempt=self._preempt, start=self._start)


# ===================================================================== pure functions


def schedule(state: ClusterState, now: float) -> list[Decision]:
    """One full scheduling cycle over ``state``; pure and deterministic (inputs untouched)."""
    with paused_gc():
        return Scheduler.from_state(state).cycle(now)
