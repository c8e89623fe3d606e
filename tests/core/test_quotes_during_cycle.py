"""Quotes are answered from the last cycle's scheduler (``core/offer.py``'s ``Quoter``) and its
forecast (a ``LazyForecast``, replayed as far as a quote's slice shape needs, in the thread
that asks), while the service's loop runs the next cycle on the other capacity model it keeps
(``core/kept.py``: two models used in turn, each under its lock). A quote asked while that
cycle runs, and one asked after it, is the quote a scheduler built from scratch for the last
cycle's state gives with the whole forecast: no exception, no figure of a half-updated model
or of the next cycle's."""

from __future__ import annotations

import random
import threading

import pytest

from jupyter_gpubudget.core.forecast import LazyForecast, forecast
from jupyter_gpubudget.core.kept import KeptCycle
from jupyter_gpubudget.core.offer import Quoter, request_for, slice_choices
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler

from .test_forecast_fill import NOW, random_state
from .test_kept import EVENTS, RUNS, step


def quotes(q: Quoter, now: float, keys: list[str]) -> dict[tuple[str, str], dict]:
    return {(p, key): q.quote("u", p, key, request_for(key), 1800.0, now)
            for p in ("p", "q", "r") for key in keys}


def from_scratch(state: ClusterState, now: float, keys: list[str]
                 ) -> tuple[Scheduler, dict[tuple[str, str], dict]]:
    """The scheduler after a cycle built from scratch, and its quotes with the whole
    forecast."""
    s = Scheduler.from_state(state)
    s.cycle(now)
    fc = forecast(state, now, probes={k: request_for(k) for k in keys})
    return s, quotes(Quoter(s, fc, now), now, keys)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_quotes_asked_while_the_next_cycle_runs(seed):
    rng = random.Random(seed)
    state, now = random_state(seed, lease=seed % 2 == 0), NOW
    RUNS[id(state)] = []
    keys = [c["key"] for c in slice_choices(state.inventory)]
    probes = {k: request_for(k) for k in keys}
    kept = KeptCycle()
    sched, _, lock = kept.cycle(state, now)
    quoter = Quoter(sched, LazyForecast(state, now, probes=probes), now, lock)
    for k in range(5):
        scratch, want = from_scratch(state, now, keys)
        nxt, nxt_now = step(state, scratch, rng.sample(EVENTS, 3), rng, now, k)
        asked: dict[str, object] = {}
        asking = threading.Event()

        def ask(q: Quoter = quoter, at: float = now, asked: dict = asked,
                asking: threading.Event = asking) -> None:
            asking.set()
            try:
                asked["during"] = quotes(q, at, keys)
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                asked["during"] = e

        t = threading.Thread(target=ask)
        t.start()
        asking.wait(60)
        sched, _, lock = kept.cycle(nxt, nxt_now)  # the next cycle, on the other model
        t.join(120)
        assert asked["during"] == want, f"cycle {k}: a quote asked while the next cycle ran"
        assert quotes(quoter, now, keys) == want, f"cycle {k}: a quote asked after it"
        quoter = Quoter(sched, LazyForecast(nxt, nxt_now, probes=probes), nxt_now, lock)
        state, now = nxt, nxt_now
