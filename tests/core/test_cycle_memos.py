"""Two things a cycle that preempts asks again and again are kept instead of found afresh:
the predicted ends of running work (``predict.RunningEnds``: kept sorted as work starts and
stops, instead of sorted again after every change) and what a victim's preemption throws
away (``CycleState.lost``, per running workload). Both must leave every decision as it was:
these compare the cycle with them and with the plain way (the list sorted from scratch after
every change, the cost found at every search) on random queues and on a scaled-down
instance of the benchmark's state a tenth of whose GPUs freed (``bench/cycle.py``), where
the cycle both starts and preempts."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core import cycle as cycle_mod
from jupyter_gpubudget.core.model import HOUR, Preempt, Start
from jupyter_gpubudget.core.predict import RunningEnds
from jupyter_gpubudget.core.scheduler import Scheduler, schedule

from .helpers import prop_settings
from .test_forecast_fill import NOW, random_state

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import cycle as bench_cycle  # noqa: E402  (bench/cycle.py: the benchmark's state)


@contextmanager
def plain_way() -> Iterator[None]:
    """The ends sorted again after every start and stop; preemption costs never kept."""
    started, stopped, try_preempt = RunningEnds.started, RunningEnds.stopped, \
        cycle_mod.try_preempt

    def uncached(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        kw.pop("lost", None)
        return try_preempt(*args, **kw)

    RunningEnds.started = lambda self, w, now: self.changed()  # type: ignore[method-assign]
    RunningEnds.stopped = lambda self, wid: self.changed()  # type: ignore[method-assign]
    cycle_mod.try_preempt = uncached  # type: ignore[assignment]
    try:
        yield
    finally:
        RunningEnds.started = started  # type: ignore[method-assign]
        RunningEnds.stopped = stopped  # type: ignore[method-assign]
        cycle_mod.try_preempt = try_preempt  # type: ignore[assignment]


def decisions_and_ends(state, seed: int) -> tuple[list, list]:  # noqa: ANN001
    """A cycle, then departures and arrivals between cycles, then a cycle later: every
    decision, and the running work's predicted ends after each step."""
    rng = random.Random(seed)
    s = Scheduler.from_state(state)
    out = list(s.cycle(NOW))
    ends = [list(s.ends.running(s.running, NOW))]
    gone = sorted(s.running)
    rng.shuffle(gone)
    for k, wid in enumerate(gone[:8]):
        at = NOW + 60 * (k // 2)  # two departures at each moment: kept across a change
        out += s.finish(wid, at)
        ends.append(list(s.ends.running(s.running, at)))
    out += s.cycle(NOW + HOUR)
    ends.append(list(s.ends.running(s.running, NOW + HOUR)))
    return out, ends


@given(seed=st.integers(0, 10_000), lease=st.booleans())
@prop_settings(30)
def test_kept_ends_and_costs_decide_as_the_plain_way(seed, lease):
    state = random_state(seed, lease)
    kept = decisions_and_ends(state, seed)
    with plain_way():
        plain = decisions_and_ends(state, seed)
    assert kept == plain


def test_the_benchmarks_freed_cycle_decides_as_the_plain_way():
    state = bench_cycle.freed_tenth(bench_cycle.build_state(1, nodes=48, queued=600), 1)
    kept = schedule(state, bench_cycle.NOW)
    with plain_way():
        plain = schedule(state, bench_cycle.NOW)
    assert kept == plain
    # not a vacuous comparison: the cycle starts work and preempts
    assert sum(isinstance(d, Start) for d in kept) > 10
    assert sum(isinstance(d, Preempt) for d in kept) > 0
