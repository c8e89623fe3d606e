"""A scheduler's capacity model kept between cycles: the service's cycle.

``schedule(state, now)`` builds every part of a :class:`~.scheduler.Scheduler` from the
state read for the cycle; the capacity model (every node, GPU and MIG slot map of the
inventory, and the placements of the running work loaded into it) is the costliest part to
build, and from one cycle to the next little of it changes. :class:`KeptCycle` keeps it and
brings it to the next state (:meth:`Cluster.resync`: what left is released, what started is
allocated, the indexes laid out as a new model's), and builds the rest afresh, so that its
decisions are those of ``schedule(state, now)`` to the bit (tests/core/test_kept.py).

Two models are kept and used in turn: the scheduler of the last cycle stays readable (the
service answers quotes from it, core/offer.py's ``Quoter``) while the next cycle runs on the
other; each model's ``lock`` is held while a cycle changes it and while a quote reads it.
The predictions of the last cycle are kept too, where the history they came from is the
same and the workload is the very one predicted (``Predictor.carry``), and the orders its
ranking made (``ranking.RankMemo``: an account's order is made again only where its
grant, usage, pending work, their demands or its members' usage changed).
A new inventory or policy starts afresh.
"""

from __future__ import annotations

import threading

from .capacity import Cluster
from .model import Decision, RuntimeHistory
from .ranking import RankMemo
from .scheduler import ClusterState, Scheduler
from .state import paused_gc


class KeptCycle:
    """The service's cycles on capacity models kept from one cycle to the next."""

    def __init__(self) -> None:
        #: (the model, what it models: (inventory, policy), its lock), used in turn
        self._models: list[tuple[Cluster | None, tuple[object, object], threading.Lock]] = [
            (None, (None, None), threading.Lock()) for _ in range(2)]
        self._turn = 0
        self.reused = 0  # cycles that ran on a kept model (a figure for tests and benchmarks)
        self._last: tuple[ClusterState, Scheduler] | None = None  # the last cycle's

    def scheduler(self, state: ClusterState) -> tuple[Scheduler, threading.Lock]:
        """A scheduler of ``state``, the same as ``Scheduler.from_state(state)``, on the model
        whose turn it is, and that model's lock (the caller holds it while the scheduler
        changes; :meth:`cycle` does)."""
        self._turn ^= 1
        model, of, lock = self._models[self._turn]
        same = of[0] is state.inventory and of[1] is state.policy
        kept = model if same else None
        s = Scheduler.from_state(state, kept)
        self.reused += kept is not None and s.cluster is kept
        if self._last is not None:
            self._carry(self._last, state, s)
            # the last cycle's orders (they answer for the inputs they were made from only)
            s.rank_memo, self._last[1].rank_memo = self._last[1].rank_memo, RankMemo()
        self._last = (state, s)
        self._models[self._turn] = (s.cluster, (state.inventory, state.policy), lock)
        return s, lock

    def cycle(self, state: ClusterState, now: float
              ) -> tuple[Scheduler, list[Decision], threading.Lock]:
        """One full cycle over ``state`` (``schedule(state, now)``'s decisions), on a kept
        model: the scheduler after its decisions, the decisions, and the lock that guards
        the scheduler's model from the next cycle but one."""
        lock = self._models[self._turn ^ 1][2]
        with lock, paused_gc():
            s, lock = self.scheduler(state)
            return s, s.cycle(now), lock

    @staticmethod
    def _carry(last: tuple[ClusterState, Scheduler], state: ClusterState, s: Scheduler) -> None:
        """Give ``s`` the last cycle's predictions where they hold: for the same inventory,
        policy and an equal history, those of the very workloads (the same objects: the
        service reuses a workload's object while its record is unchanged)."""
        was, old = last
        if not (was.inventory is state.inventory and was.policy is state.policy
                and same_history(was.history, state.history)):
            return
        before = {w.id: w for ws in (was.running, was.pending) for w in ws}
        get = before.get
        s.predictor.carry(old.predictor, {w.id for ws in (state.running, state.pending)
                                          for w in ws if get(w.id) is w})


def same_history(a: RuntimeHistory | None, b: RuntimeHistory | None) -> bool:
    """Do ``a`` and ``b`` hold the same runs (so predict alike)? None: no runs."""
    if a is b:
        return True
    a, b = a or RuntimeHistory(), b or RuntimeHistory()
    return (a.keep == b.keep and a.kind_version == b.kind_version and a.samples == b.samples
            and a.pooled == b.pooled and a.runs.keys() == b.runs.keys()
            and all(r.keep == b.runs[k].keep and r.recent == b.runs[k].recent
                    for k, r in a.runs.items()))
