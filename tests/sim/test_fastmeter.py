"""The incremental usage meter gives the exact meter's figures."""

from __future__ import annotations

import random

import pytest

from jupyter_gpubudget.core.model import DAY, HOUR, Policy
from jupyter_gpubudget.core.usage import UsageMeter
from jupyter_gpubudget.sim.fastmeter import IncrementalUsageMeter


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_exact_meter(seed: int) -> None:
    rng = random.Random(seed)
    policy = Policy(window=2 * DAY)
    exact, fast = UsageMeter(policy), IncrementalUsageMeter(policy)
    now = 0.0
    running: dict[str, tuple[str, int]] = {}
    for k in range(600):
        now += rng.expovariate(1 / 1800)
        if running and rng.random() < 0.5:
            wid = rng.choice(sorted(running))
            del running[wid]
            for m in (exact, fast):
                m.close(wid, now)
        else:
            wid, proj = f"w{k}", rng.choice("abc")
            milli = rng.choice([125, 500, 1000, 8000])
            running[wid] = (proj, milli)
            for m in (exact, fast):
                m.open_interval(wid, proj, "u", milli, now)
        if k % 7 == 0:
            e, f = exact.usage(now), fast.usage(now)
            assert set(e) == set(f)
            for p in e:
                assert f[p] == pytest.approx(e[p], rel=1e-9, abs=1e-9)
    later = now + 3 * DAY  # everything closed has left the window
    for wid in sorted(running):
        for m in (exact, fast):
            m.close(wid, now)
    assert fast.usage(later) == pytest.approx(exact.usage(later)) == {}


def test_falls_back_when_time_goes_backwards() -> None:
    policy = Policy(window=HOUR)
    fast = IncrementalUsageMeter(policy)
    fast.open_interval("w", "a", "u", 1000, 0.0)
    fast.close("w", 1800.0)
    assert fast.usage(3600.0)["a"] == pytest.approx(0.5)
    assert fast.usage(1800.0)["a"] == pytest.approx(0.5)  # exact path
    assert fast.usage(4500.0)["a"] == pytest.approx(0.25)
