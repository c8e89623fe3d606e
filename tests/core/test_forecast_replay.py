"""The forecast (``core/forecast.py``) replays the queue keeping only what the next fill reads:
no decision, charge, protection promise or running record for the work it starts. These
compare it with the forecast as it was written before (the reference below: the scheduler's
own ``_stop`` and ``_fill`` after every step, with the fill pass written plainly) and require
the same start for every queued workload and the same answer for every slice shape — on
random queues, and on a scaled-down instance of the benchmark's state (``bench/cycle.py``),
the full one and the one a tenth of whose GPUs freed."""

from __future__ import annotations

import heapq
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core.backfill import predicted_end
from jupyter_gpubudget.core.forecast import forecast
from jupyter_gpubudget.core.model import Decision, SliceRequest, Start
from jupyter_gpubudget.core.offer import request_for, slice_choices
from jupyter_gpubudget.core.placement import place
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler

from .helpers import prop_settings
from .test_forecast_fill import NOW, plain_fill, random_state

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import cycle as bench_cycle  # noqa: E402  (bench/cycle.py: the benchmark's state)


def reference_forecast(state: ClusterState, now: float,
                       probes: dict[str, SliceRequest] | None = None,
                       horizon: float | None = None, max_fills: int = 200
                       ) -> tuple[dict[str, float], dict[str, float]]:
    """The forecast as it was written before: every start and stop applied in full to the
    scheduler (``Scheduler._stop``, ``Scheduler._fill``)."""
    s = Scheduler.from_state(state)
    limit = now + (horizon if horizon is not None else s.policy.window)
    starts: dict[str, float] = {}
    open_probes = dict(probes or {})
    probe_starts: dict[str, float] = {}
    ends: list[tuple[float, str]] = []

    def started(decisions: list[Decision], t: float) -> None:
        for d in decisions:
            if isinstance(d, Start):
                starts[d.workload] = t
                heapq.heappush(ends, (t + s.predict(s.running[d.workload]), d.workload))

    def probe(t: float) -> None:
        for key, req in list(open_probes.items()):
            if place(s.cluster, req, t + s.policy.default_runtime) is not None:
                probe_starts[key] = t
                del open_probes[key]

    for w in s.running.values():
        heapq.heappush(ends, (predicted_end(w, now, s.predict(w)), w.id))
    started(s.cycle(now), now)
    probe(now)
    fills = 0
    while ends and (s.pending or open_probes) and fills < max_fills:
        t = ends[0][0]
        if t > limit:
            break
        step_end = t + max(60.0, (t - now) / 20)
        while ends and ends[0][0] <= step_end:
            _, wid = heapq.heappop(ends)
            if wid in s.running:
                s._stop(wid, t)
        fills += 1
        started(s._fill(t), t)
        probe(t)
    return starts, probe_starts


def same_answers(state: ClusterState, **kw: object) -> tuple[int, int]:
    probes = {c["key"]: request_for(c["key"]) for c in slice_choices(state.inventory)}
    fc = forecast(state, NOW, probes=probes, **kw)  # type: ignore[arg-type]
    with plain_fill():
        starts, probe_starts = reference_forecast(state, NOW, probes=probes,
                                                  **kw)  # type: ignore[arg-type]
    assert fc.starts == starts
    assert fc.probe_starts == probe_starts
    return len(starts), len(probe_starts)


@given(seed=st.integers(0, 10_000), lease=st.booleans(), fills=st.sampled_from([3, 200]))
@prop_settings(30)
def test_the_forecast_answers_as_the_full_replay_did(seed, lease, fills):
    same_answers(random_state(seed, lease), max_fills=fills)


@pytest.mark.parametrize("freed", [False, True])
def test_the_forecast_of_the_benchmarks_state_is_the_full_replays(freed):
    state = bench_cycle.build_state(1, nodes=48, queued=600)
    if freed:
        state = bench_cycle.freed_tenth(state, 1)
    starts, probes = same_answers(state)
    assert starts > 300 and probes >= 8  # the replay went far: not a vacuous comparison
