"""The forecast replayed only as far as what is asked (``core/forecast.py``'s
``LazyForecast``: the start of one workload, the answer for one slice shape, the replay
continued, never restarted, for a later answer) answers as the whole replay does: every start
and every slice shape's answer equal to the forecast as it was written before (the reference
in ``test_forecast_replay.py``: the scheduler's own ``_stop`` and ``_fill`` after every step),
whatever is asked and in whatever order — on random queues, and on a scaled-down instance of
the benchmark's state (``bench/cycle.py``), the full one and the one a tenth of whose GPUs
freed. Asking for the first rows of the queue and one quote replays less than the whole."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core.forecast import Forecast, LazyForecast, PredictedStarts, forecast
from jupyter_gpubudget.core.model import HOUR
from jupyter_gpubudget.core.offer import request_for, slice_choices
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler

from .helpers import prop_settings
from .test_forecast_fill import NOW, plain_fill, random_state
from .test_forecast_replay import bench_cycle, reference_forecast
from .test_kept import EVENTS, RUNS, step


def asked_as_the_reference(state: ClusterState, order_seed: int, asks: int | None = None,
                           first: list[str] | None = None, **kw: object) -> LazyForecast:
    """Ask a lazy forecast of ``state`` for ``first`` then ``asks`` random answers (every
    workload's start and every slice shape: None), each compared with the reference as soon
    as it is answered; then the whole forecast."""
    probes = {c["key"]: request_for(c["key"]) for c in slice_choices(state.inventory)}
    with plain_fill():
        starts, probe_starts = reference_forecast(state, NOW, probes=probes,
                                                  **kw)  # type: ignore[arg-type]
    lazy = LazyForecast(state, NOW, probes=probes, **kw)  # type: ignore[arg-type]
    ids = [w.id for w in state.pending] + [w.id for w in state.running] + ["no-such-workload"]
    questions = [("start", wid) for wid in ids] + [("probe", key) for key in probes]
    rng = random.Random(order_seed)
    rng.shuffle(questions)
    questions = [("start", wid) for wid in first or []] + questions[:asks]
    for what, name in questions:
        if what == "start":
            assert lazy.start_of(name) == starts.get(name), name
        else:
            assert lazy.probe_start(name) == probe_starts.get(name), name
    whole = lazy.result()
    assert whole.starts == starts
    assert whole.probe_starts == probe_starts
    return lazy


@given(seed=st.integers(0, 10_000), lease=st.booleans(), fills=st.sampled_from([3, 200]),
       order=st.integers(0, 1000), asks=st.sampled_from([0, 1, 5, None]))
@prop_settings(30)
def test_a_lazy_forecast_answers_as_the_whole_replay(seed, lease, fills, order, asks):
    asked_as_the_reference(random_state(seed, lease), order, asks, max_fills=fills)


@pytest.mark.parametrize("freed", [False, True])
def test_the_benchmarks_state_asked_a_page_and_a_quote(freed):
    state = bench_cycle.build_state(1, nodes=48, queued=600)
    if freed:
        state = bench_cycle.freed_tenth(state, 1)
    s = Scheduler.from_state(state)
    s.cycle(NOW)
    page = s.queue()[:20]  # the queue's first rows, in its order
    probes = {c["key"]: request_for(c["key"]) for c in slice_choices(state.inventory)}
    whole = LazyForecast(state, NOW, probes=probes)
    full = whole.result()
    assert len(full.starts) > 300 and len(full.probe_starts) >= 8  # not a vacuous comparison
    lazy = LazyForecast(state, NOW, probes=probes)
    for wid in page:
        assert lazy.start_of(wid) == full.starts.get(wid)
    assert lazy.probe_start("mig:1g.10gb") == full.probe_starts.get("mig:1g.10gb")
    assert not lazy.done and lazy.fills < whole.fills  # a prefix of the replay
    asked_as_the_reference(state, 7, asks=40, first=page)


def reference_view(fc: Forecast, now: float, sched: Scheduler, reserved: dict[str, float]
                   ) -> dict[str, float]:
    """The predicted starts the service's view held before they were read lazily: the
    forecast's starts, then the probe of the shape for work that arrived since, then the
    reservations."""
    pend = set(sched.queue())
    out = {w: t for w, t in fc.starts.items() if w in pend}
    by_shape = {request_for(k).shape: t for k, t in fc.probe_starts.items()}
    for wid in pend - out.keys():
        t = by_shape.get(sched.pending[wid].request.shape) if wid in sched.pending else None
        if t is not None:
            out[wid] = max(t, now)
    out.update({w: t for w, t in reserved.items() if w in pend})
    return out


@given(seed=st.integers(0, 10_000), lease=st.booleans(), order=st.integers(0, 1000))
@prop_settings(20)
def test_the_views_predicted_starts_are_those_of_the_whole_forecast(seed, lease, order):
    """A forecast of one cycle's state read for the view of a later cycle (work arrived,
    finished, was cancelled since: the forecast is redone at most every few seconds)."""
    rng = random.Random(order)
    state = random_state(seed, lease)
    RUNS[id(state)] = []
    probes = {c["key"]: request_for(c["key"]) for c in slice_choices(state.inventory)}
    s = Scheduler.from_state(state)
    s.cycle(NOW)
    later, now = step(state, s, rng.sample(EVENTS, 3), rng, NOW, 0)
    now += rng.choice([0.0, HOUR, 6 * HOUR])  # (answers of the forecast before now)
    sched = Scheduler.from_state(later)
    sched.cycle(now)
    queue = sched.queue()
    reserved = {wid: now + 600 for wid in rng.sample(queue, min(2, len(queue)))}
    reserved["gone"] = now
    want = reference_view(forecast(state, NOW, probes=probes), now, sched, reserved)
    view = PredictedStarts(LazyForecast(state, NOW, probes=probes), now,
                           {w: sched.pending[w].request.shape for w in queue},
                           {k: r.shape for k, r in probes.items()}, reserved)
    asked = queue + ["gone", "no-such-workload"]
    rng.shuffle(asked)
    assert {w: t for w in asked if (t := view.get(w)) is not None} == want
    assert dict(view) == want
