"""Usage in GPU-hours weighted by slice size, over a window or a half-life."""

import math

import pytest

from jupyter_gpubudget.core.model import DAY, HOUR, ChargeInterval, Policy
from jupyter_gpubudget.core.usage import UsageMeter, interval_usage, usage_by_project

NOW = 30 * DAY


def test_window_clips_intervals_and_weights_by_slice():
    p = Policy(window=7 * DAY)
    charges = [
        ChargeInterval("a", "x", "u", 1000, NOW - 2 * HOUR, NOW - HOUR),  # 1 GPU-hour
        ChargeInterval("b", "x", "u", 143, NOW - 7 * HOUR, NOW),  # a 1g slice for 7 h
        ChargeInterval("c", "x", "u", 2000, NOW - 8 * DAY, NOW - 6 * DAY),  # 1 day inside
        ChargeInterval("d", "x", "u", 1000, NOW - 9 * DAY, NOW - 8 * DAY),  # outside
        ChargeInterval("e", "y", "u", 500, NOW - HOUR, None),  # open: counts up to now
    ]
    u = usage_by_project(charges, NOW, p)
    assert u["x"] == pytest.approx(1 + 0.143 * 7 + 2 * 24)
    assert u["y"] == pytest.approx(0.5)


def test_half_life_decays_exponentially():
    p = Policy(half_life=DAY)
    fresh = interval_usage(1000, NOW - HOUR, NOW, NOW, p)
    old = interval_usage(1000, NOW - DAY - HOUR, NOW - DAY, NOW, p)
    assert old == pytest.approx(fresh / 2, rel=1e-9)
    # the integral is exact: one hour at the very end is worth slightly under one GPU-hour
    assert fresh == pytest.approx((DAY / math.log(2)) * (1 - 2 ** (-HOUR / DAY)) / HOUR)


def test_meter_closes_open_intervals_and_forgets_old_ones():
    m = UsageMeter(Policy(window=DAY))
    m.open_interval("w", "x", "u", 1000, NOW - 2 * HOUR)
    assert m.usage(NOW)["x"] == pytest.approx(2)
    done = m.close("w", NOW - HOUR)
    assert done.end == NOW - HOUR and "w" not in m.open
    assert m.usage(NOW)["x"] == pytest.approx(1)
    assert m.usage(NOW + 2 * DAY) == {}  # left the window
    assert m.closed[("x", "u")] == type(m.closed[("x", "u")])()  # and was dropped


def test_closing_twice_counts_once():
    m = UsageMeter(Policy())
    m.open_interval("w", "x", "u", 1000, NOW - HOUR)
    m.close("w", NOW)
    assert m.close("w", NOW + HOUR) is None
    assert m.usage(NOW + HOUR)["x"] == pytest.approx(1)
