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
import threading
from bisect import bisect_left
from collections.abc import Iterator, Mapping
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

    def start_of(self, wid: str) -> float | None:
        """When pending workload ``wid`` starts (as :meth:`LazyForecast.start_of`)."""
        return self.starts.get(wid)

    def probe_start(self, key: str) -> float | None:
        """When slice choice ``key`` first fits (as :meth:`LazyForecast.probe_start`)."""
        return self.probe_starts.get(key)


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
    exact to the minute, distant ones to a few percent of their distance.

    The whole replay at once; :class:`LazyForecast` replays only as far as what is asked."""
    return LazyForecast(state, now, probes, horizon, max_fills).result()


class LazyForecast:
    """:func:`forecast`, replayed only as far as the answers asked need: the start of one
    workload (:meth:`start_of`: until it starts, or the replay ends), the answer for one slice
    shape (:meth:`probe_start`). The replay is continued, never restarted, when a later answer
    is asked, and kept with its answers until the object is dropped (the service makes one
    per forecast). Nothing runs when it is made; every answer is :func:`forecast`'s (the
    replay takes the same steps, whatever is asked and in whatever order).

    Safe to ask from several threads: a lock guards the replay (it runs on a scheduler of
    its own, built from ``state``, that nothing else reads)."""

    def __init__(self, state: ClusterState, now: float,
                 probes: dict[str, SliceRequest] | None = None, horizon: float | None = None,
                 max_fills: int = 200) -> None:
        self._state, self.now = state, now
        self._probes = dict(probes or {})
        self._horizon, self._max_fills = horizon, max_fills
        self._lock = threading.Lock()
        self._s: Scheduler | None = None
        self._replay: _Replay | None = None
        self._starts: dict[str, float] = {}
        self._probe_starts: dict[str, float] = {}
        self._open: dict[str, SliceRequest] = {}
        self._ends: list[tuple[float, str]] = []
        self._fills = 0
        self._done = False

    @property
    def done(self) -> bool:
        """Has the replay ended (every answer is known)?"""
        return self._done

    @property
    def fills(self) -> int:
        """Fills replayed so far (a figure for tests and benchmarks)."""
        return self._fills

    def start_of(self, wid: str) -> float | None:
        """When pending workload ``wid`` starts (``forecast(...).starts.get(wid)``)."""
        with self._lock:
            s = self._begin()
            while wid not in self._starts and wid in s.waiting.pending and self._step():
                pass
            return self._starts.get(wid)

    def probe_start(self, key: str) -> float | None:
        """When slice choice ``key`` (one of ``probes``) first fits behind the queue
        (``forecast(...).probe_starts.get(key)``)."""
        with self._lock:
            self._begin()
            while key in self._open and self._step():
                pass
            return self._probe_starts.get(key)

    def result(self) -> Forecast:
        """The whole forecast (the replay run to its end)."""
        with self._lock:
            self._begin()
            while self._step():
                pass
            return Forecast(dict(self._starts), dict(self._probe_starts))

    def _begin(self) -> Scheduler:
        """The cycle at ``now`` and the probes at ``now``, once."""
        if self._s is not None:
            return self._s
        s = Scheduler.from_state(self._state)
        now, ends = self.now, self._ends
        self._limit = now + (self._horizon if self._horizon is not None else s.policy.window)
        # what runs, from its predicted end (work the cycle preempts stays on the heap: its
        # time still ends a step)
        for w in s.running.values():
            heapq.heappush(ends, (predicted_end(w, now, s.predict(w)), w.id))
        for d in s.cycle(now):
            if isinstance(d, Start):
                self._starts[d.workload] = now
                heapq.heappush(ends, (now + s.predict(s.running[d.workload]), d.workload))
        self._replay = _Replay(s)
        self._open = dict(self._probes)
        self._s = s
        self._probe(now)
        return s

    def _probe(self, t: float) -> None:
        s = self._s
        assert s is not None
        for key, req in list(self._open.items()):
            if place(s.cluster, req, t + s.policy.default_runtime) is not None:
                self._probe_starts[key] = t
                del self._open[key]

    def _step(self) -> bool:
        """One step of the replay (its departures, then one fill); False when it has ended."""
        s, replay, ends = self._s, self._replay, self._ends
        assert s is not None and replay is not None
        if self._done or not (ends and (s.waiting.pending or self._open)
                              and self._fills < self._max_fills):
            self._done = True
            return False
        t = ends[0][0]
        if t > self._limit:
            self._done = True
            return False
        step_end = t + max(60.0, (t - self.now) / 20)
        while ends and ends[0][0] <= step_end:  # every departure of this step, then one fill
            replay.stop(heapq.heappop(ends)[1])
        self._fills += 1
        for wid, run in replay.fill(t):
            self._starts[wid] = t
            heapq.heappush(ends, (t + run, wid))
        self._probe(t)
        return True


class PredictedStarts(Mapping[str, float]):
    """Each queued workload's predicted start as the queue page and the sidebar show it, read
    from a forecast only when asked: a reservation's time where the cycle made one
    (``reserved``), else the forecast's start, else — work that arrived since the forecast —
    when its slice shape first fits behind the queue (the answer of the probe of its shape,
    not before ``now``). ``pending``: each queued workload's shape; ``keys``: each probe's
    shape. Iterating asks for every start (the whole replay)."""

    def __init__(self, fc: Forecast | LazyForecast, now: float,
                 pending: dict[str, tuple[object, ...] | None], keys: dict[str, object],
                 reserved: dict[str, float]) -> None:
        self._fc, self._now, self._pending = fc, now, pending
        self._reserved = {w: t for w, t in reserved.items() if w in pending}
        self._keys: dict[object, list[str]] = {}  # shape -> its probes, in the probes' order
        for key, shape in keys.items():
            self._keys.setdefault(shape, []).append(key)

    def __getitem__(self, wid: str) -> float:
        if wid in self._reserved:
            return self._reserved[wid]
        if wid not in self._pending:
            raise KeyError(wid)
        t = self._fc.start_of(wid)
        if t is not None:
            return t
        shape = self._pending[wid]
        # of several probes of one shape, the one answered last (the latest time, then the
        # later in the probes' order: answers are found in time order, probes in theirs)
        answers = [(at, i) for i, key in enumerate(self._keys.get(shape, ()))
                   if (at := self._fc.probe_start(key)) is not None]
        if not answers:
            raise KeyError(wid)
        return max(max(answers)[0], self._now)

    def __iter__(self) -> Iterator[str]:
        return (wid for wid in self._pending if wid in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)
