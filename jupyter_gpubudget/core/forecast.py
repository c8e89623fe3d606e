"""The forecast of start times: the queue replayed forward by the scheduler itself.

Pure like the rest of the core. The replay runs the full cycle at ``now``, then takes running
work's departures in time order and fills the freed capacity in rank order, exactly as
``Scheduler._fill`` would — but nothing of a start or a stop is kept except what the next
fill reads: the capacity model, the queue (and the reservations and short-lane GPUs it holds
back), the predictions. No decision, charge, protection promise or running record is made
for work the forecast starts; none of them changes where or whether later work fits, and
building them was two thirds of the forecast's cost.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from dataclasses import dataclass

from .backfill import leasable, predicted_end
from .model import SliceRequest, Start
from .placement import place
from .scheduler import ClusterState, Scheduler


@dataclass(frozen=True)
class Forecast:
    """The core's one start-time prediction: the queue replayed forward by the scheduler
    itself, running work ending at its predicted time, nothing new arriving.

    ``starts``: when each pending workload starts. ``probe_starts``: for each offered slice
    choice, the first time a request of that shape fits once the queue ahead has been served
    (what a newcomer queued behind today's work can expect)."""

    starts: dict[str, float]
    probe_starts: dict[str, float]


class _Replay:
    """The fills of one forecast, on a scheduler that is thrown away afterwards: what
    ``Scheduler._fill`` does after a departure, keeping only what the next fill reads."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s
        self.running: set[str] = set(s.running)  # what the replay has not stopped
        self.started: list[tuple[str, float]] = []  # (id, predicted run) of each start
        # the queue in the order a fill considers it (a fill only takes work out of it):
        # per workload its id, shape, cautious run time and whether it may lease
        q = s.waiting
        lease = s.policy.backfill_lease > 0
        self.queue = [(wid, w.request.shape, s.predict_long(w), lease and leasable(w, s.policy))
                      for _, seq, wid in q.order
                      if (w := q.pending.get(wid)) is not None and q.seq.get(wid) == seq]

    def stop(self, wid: str) -> None:
        if wid in self.running:
            self.running.discard(wid)
            self.s.cluster.release(wid)

    def fill(self, t: float) -> list[tuple[str, float]]:
        """``Scheduler._fill`` at ``t``: what started, with its predicted run time."""
        s = self.s
        self.started = []
        s.lane.top_up(s.cluster, s.policy)
        while self._fill_pass(t):
            pass  # a start on GPUs reserved for it freed the rest of them: look again
        return self.started

    def _fill_pass(self, now: float) -> bool:
        """``Scheduler._fill_pass``: start what fits, in rank order; True when a workload
        started on its own reservation (then the pass begins again)."""
        s = self.s
        res_times = sorted({at for at, _ in s.reservations.values()}
                           | ({s.lane.until} if s.lane.held else set()))
        failed: set[tuple[object, ...]] = set()
        pending, reservations = s.waiting.pending, s.reservations
        shape_count = s.waiting.shape_count
        queue = self.queue
        kept: list[tuple[str, tuple[object, ...], float, bool]] = []
        again = False
        for i, entry in enumerate(queue):
            if not res_times and len(failed) >= len(shape_count):
                kept.extend(queue[i:])
                break  # no shape fits any more
            wid, shape, pl, lease = entry
            end = now + pl
            memo = (shape, bisect_left(res_times, end) if res_times else 0, lease)
            own = wid in reservations
            if memo in failed and not own:
                kept.append(entry)
                continue
            w = pending[wid]
            p = s._place(w, end, now)
            if p is None:
                failed.add(memo)
                kept.append(entry)
                continue
            s.cluster.allocate(wid, p)
            s._dequeue(wid)
            self.running.add(wid)
            self.started.append((wid, s.predict(w)))
            if own:
                kept.extend(queue[i + 1:])
                again = True
                break
        self.queue = kept
        return again


def forecast(state: ClusterState, now: float, probes: dict[str, SliceRequest] | None = None,
             horizon: float | None = None, max_fills: int = 200) -> Forecast:
    """Replay the queue from ``state``: the cycle at ``now``, then departures in time order,
    the freed capacity filled in rank order. Departures are taken in steps that grow with
    the distance from now (a minute at first, a twentieth of the distance later), so the
    replay does at most ``max_fills`` fills whatever the queue's length: near-term starts are
    exact to the minute, distant ones to a few percent of their distance."""
    s = Scheduler.from_state(state)
    limit = now + (horizon if horizon is not None else s.policy.window)
    starts: dict[str, float] = {}
    open_probes = dict(probes or {})
    probe_starts: dict[str, float] = {}
    ends: list[tuple[float, str]] = []

    def probe(t: float) -> None:
        for key, req in list(open_probes.items()):
            if place(s.cluster, req, t + s.policy.default_runtime) is not None:
                probe_starts[key] = t
                del open_probes[key]

    # what runs, from its predicted end (work the cycle preempts stays on the heap: its
    # time still ends a step)
    for w in s.running.values():
        heapq.heappush(ends, (predicted_end(w, now, s.predict(w)), w.id))
    for d in s.cycle(now):
        if isinstance(d, Start):
            starts[d.workload] = now
            heapq.heappush(ends, (now + s.predict(s.running[d.workload]), d.workload))
    replay = _Replay(s)
    probe(now)
    fills = 0
    while ends and (s.waiting.pending or open_probes) and fills < max_fills:
        t = ends[0][0]
        if t > limit:
            break
        step_end = t + max(60.0, (t - now) / 20)
        while ends and ends[0][0] <= step_end:  # every departure of this step, then one fill
            replay.stop(heapq.heappop(ends)[1])
        fills += 1
        for wid, run in replay.fill(t):
            starts[wid] = t
            heapq.heappush(ends, (t + run, wid))
        probe(t)
    return Forecast(starts, probe_starts)
