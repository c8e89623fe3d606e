"""The state of one full scheduling cycle, passed from step to step (scheduler.py's
``Scheduler._cycle``), with named transitions instead of ad-hoc resets.

The cycle remembers which request shapes it already found no room for (the "does not fit"
memo, :func:`memo_key`): a shape that did not fit does not fit again until capacity is freed
or reservations move (:meth:`CycleState.capacity_changed`), which makes a deep queue cheap.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

from .backfill import leasable
from .model import Decision, Policy, Reserve, Workload
from .ranking import Standings

Memo = tuple[object, ...]
Shape = tuple[object, ...]


def memo_key(w: Workload, end: float, res_times: list[float], policy: Policy) -> Memo:
    """The "does not fit" memo key of ``w``: its shape, where its end falls among the
    times GPUs are held to (``res_times``, ascending), and whether it may lease reserved
    GPUs."""
    return (w.request.shape, bisect.bisect_left(res_times, end) if res_times else 0,
            policy.backfill_lease > 0 and leasable(w, policy))


def overdue_gang(w: Workload, now: float, policy: Policy, first_planned: Mapping[str, float]
                 ) -> bool:
    """Has gang ``w`` waited ``policy.gang_overdue_after`` past the start its first
    reservation planned for it (``first_planned``)?"""
    after = policy.gang_overdue_after
    first = first_planned.get(w.id)
    return after > 0 and first is not None and now >= first + after


@dataclass(slots=True)
class CycleState:
    """One cycle's clock, standings and decisions, and what it has learnt on the way."""

    now: float
    st: Standings
    out: list[Decision] = field(default_factory=list)
    #: running work that may be preempted in this cycle (empty: preemption is off)
    pool: dict[str, Workload] = field(default_factory=dict)
    #: the times GPUs are held back to by this cycle's reservations, ascending
    res_times: list[float] = field(default_factory=list)
    #: memo keys of the shapes known not to fit now
    failed: set[Memo] = field(default_factory=set)
    #: bumped whenever ``failed`` is reset
    memo_gen: int = 0
    #: per shape, the lowest path standing for which a preemption search found nothing
    preempt_failed: dict[Shape, tuple[float, ...]] = field(default_factory=dict)
    #: per gang constraints, the smallest gang that found no reservation
    no_plan: dict[tuple[object, ...], float] = field(default_factory=dict)
    #: backfill still running past its reservation's time (found once, when first needed)
    overdue: dict[str, Workload] | None = None
    #: unbacked work, and work that could not start in the backed pass; with the memo
    #: generation at which its shape was known not to fit (-1: not known)
    later: list[tuple[Workload, int]] = field(default_factory=list)

    def capacity_changed(self) -> None:
        """Capacity was freed (a preemption) or a reservation moved the times GPUs are held
        to: every shape may fit again, so the memo is reset."""
        self.failed.clear()
        self.memo_gen += 1

    def reserved(self, at: float) -> None:
        """GPUs are now held back to ``at`` (a new reservation): memo keys depend on these
        times, so the memo is reset."""
        bisect.insort(self.res_times, at)
        self.capacity_changed()

    def drop_reserve(self, wid: str) -> None:
        """``wid`` starts now instead: its reservation in this cycle's decisions is moot."""
        self.out[:] = [d for d in self.out if not (isinstance(d, Reserve) and d.workload == wid)]
