"""The preemption outlook: for running work, whether — and about when — the scheduler is
likely to preempt it, so a researcher is warned minutes ahead instead of at the stop.

No second policy: the outlook runs the scheduler's own cycle (the same preemption search,
drain and protection rules) at the moments something may change for running work — now,
each protection that ends within the horizon, and the horizon's end — on one scheduler
built from the state, with running work leaving at its predicted end (as the forecast in
offer.py does) and preempted work leaving at once (it is gone within its stop grace). The
first moment a cycle preempts a workload is its outlook. Nothing arrives in the meantime,
so the outlook is what today's queue makes likely, not a promise either way.

Pure like the rest of the core: no I/O, deterministic, the state is not touched.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from .backfill import predicted_end
from .model import HOUR, Preempt
from .scheduler import ClusterState, Scheduler
from .state import paused_gc


@dataclass(frozen=True, slots=True)
class Outlook:
    """A running workload's likely preemption: ``at`` (epoch seconds; the first cycle of
    the replay that preempts it), ``for_workload`` (the pending work it would yield to;
    None for a drain) and ``reason`` (the scheduler's own words)."""

    at: float
    for_workload: str | None
    reason: str


def probe_times(state: ClusterState, now: float, horizon: float, max_probes: int
                ) -> list[float]:
    """When a cycle may decide differently for running work: now, every protection that
    ends within ``(now, now + horizon]`` (at most ``max_probes`` - 2 of them, the earliest),
    and the horizon's end (standings drift as usage grows)."""
    ends = sorted({w.protected_until for w in state.running
                   if w.protected_until is not None and now < w.protected_until
                   <= now + horizon})
    return [now, *ends[:max(0, max_probes - 2)], now + horizon]


def preemption_outlook(state: ClusterState, now: float, horizon: float = HOUR,
                       max_probes: int = 10) -> dict[str, Outlook]:
    """Running workload id -> :class:`Outlook`, for those the scheduler's cycle preempts at
    one of :func:`probe_times` given the work queued now. Work already stopping is left out
    (its preemption is no longer a forecast). Empty when nothing is queued and no node is
    unhealthy: then no cycle preempts anything."""
    if not state.running or not (state.pending or state.unhealthy):
        return {}
    watched = {w.id for w in state.running if not w.stopping}
    out: dict[str, Outlook] = {}
    with paused_gc():
        s = Scheduler.from_state(state)
        ends = [(predicted_end(w, now, s.predict(w)), w.id) for w in s.running.values()]
        heapq.heapify(ends)
        for t in probe_times(state, now, horizon, max_probes):
            while ends and ends[0][0] <= t:  # work predicted to have ended by then
                _, wid = heapq.heappop(ends)
                if wid in s.running and wid not in out:
                    s._stop(wid, t)
            gone: list[str] = []
            for d in s.cycle(t):
                if isinstance(d, Preempt) and d.workload in watched and d.workload not in out:
                    out[d.workload] = Outlook(t, d.for_workload, d.reason)
                    gone.append(d.workload)
            for wid in gone:  # it leaves within its stop grace; what waited for it starts
                if wid in s.running:
                    s._stop(wid, t)
            if gone:
                s._fill(t)
            if len(out) == len(watched):
                break
    return out
