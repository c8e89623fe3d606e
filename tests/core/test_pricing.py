"""Off-peak pricing (core/pricing.py): windows in local wall-clock time, the price at an
instant, the next window's start, and intervals split at the windows' edges to the second —
checked by hand on ordinary days, across a weekend and on both daylight-saving change days,
and as a property (the parts cover the interval exactly, each inside one price)."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core.accounts import BudgetError, load_budgets
from jupyter_gpubudget.core.model import Policy
from jupyter_gpubudget.core.pricing import (
    describe_start,
    make_off_peak,
    parse_window,
    priced_clock,
    weighted_seconds,
)
from jupyter_gpubudget.core.usage import interval_usage, usage_by_span

from .helpers import prop_settings

BERLIN = ZoneInfo("Europe/Berlin")
NIGHTS = make_off_peak("Europe/Berlin", 0.5, ["Mon-Fri 20:00-07:00", "Sat-Sun 00:00-24:00"])


def at(*args: int) -> float:
    return datetime(*args, tzinfo=BERLIN).timestamp()  # type: ignore[misc]


def local(t: float) -> datetime:
    return datetime.fromtimestamp(t, BERLIN)


def test_a_charge_across_the_evening_edge_by_hand() -> None:
    # Wednesday 2 December 2026, 19:30-20:30 on one GPU: half an hour at 1.0, half at 0.5
    a, b = at(2026, 12, 2, 19, 30), at(2026, 12, 2, 20, 30)
    assert NIGHTS.split(a, b) == [(a, at(2026, 12, 2, 20), 1.0), (at(2026, 12, 2, 20), b, 0.5)]
    assert weighted_seconds(NIGHTS, a, b) / 3600 == 0.75  # 0.5 + 0.25 GPU-h per GPU
    policy = Policy(window=30 * 86400.0, off_peak=NIGHTS)
    assert interval_usage(2000, a, b, b + 60, policy) == pytest.approx(1.5)  # two GPUs
    assert interval_usage(2000, a, b, b + 60, Policy(window=30 * 86400.0)) == 2.0


def test_the_price_now_and_the_next_window() -> None:
    assert NIGHTS.factor_at(at(2026, 12, 2, 19, 59, 59)) == 1.0
    assert NIGHTS.factor_at(at(2026, 12, 2, 20)) == 0.5
    assert NIGHTS.factor_at(at(2026, 12, 3, 6, 59, 59)) == 0.5
    assert NIGHTS.factor_at(at(2026, 12, 3, 7)) == 1.0
    assert NIGHTS.next_start(at(2026, 12, 2, 10)) == at(2026, 12, 2, 20)
    assert NIGHTS.next_start(at(2026, 12, 2, 23)) == at(2026, 12, 2, 23)  # inside: now
    q = describe_start(NIGHTS, at(2026, 12, 2, 10))
    assert q["text"] == "now: 1.0× — start after 20:00 CET for 0.5× (half the cost)"
    assert q["next_off_peak"] == at(2026, 12, 2, 20) and q["factor_now"] == 1.0
    assert describe_start(NIGHTS, at(2026, 12, 2, 21))["off_peak_now"] is True


def test_a_whole_weekend() -> None:
    # Friday noon to Monday noon: Friday 20:00 to Monday 00:00 is one window (the Friday
    # night window and the weekend touch), Monday morning is full price (no window starts
    # Sunday evening in this policy)
    a, b = at(2026, 12, 4, 12), at(2026, 12, 7, 12)
    parts = NIGHTS.split(a, b)
    assert [(local(s).strftime("%a %H:%M"), local(e).strftime("%a %H:%M"), f)
            for s, e, f in parts] == [("Fri 12:00", "Fri 20:00", 1.0),
                                      ("Fri 20:00", "Mon 00:00", 0.5),
                                      ("Mon 00:00", "Mon 12:00", 1.0)]
    assert weighted_seconds(NIGHTS, a, b) / 3600 == 8 + 52 * 0.5 + 12


def test_the_spring_change_night_is_an_hour_shorter() -> None:
    # Sunday 29 March 2026: clocks jump from 02:00 to 03:00. A Sat 20:00-07:00 window
    # (weekdays here, to see its night) lasts 10 real hours, not 11
    p = make_off_peak("Europe/Berlin", 0.5, ["Sat 20:00-07:00"])
    s, e = at(2026, 3, 28, 20), at(2026, 3, 29, 7)
    assert e - s == 10 * 3600
    assert p.split(s - 60, e + 60) == [(s - 60, s, 1.0), (s, e, 0.5), (e, e + 60, 1.0)]
    # an edge inside the skipped hour is the moment of the jump
    q = make_off_peak("Europe/Berlin", 0.25, ["Sun 02:30-04:00"])
    jump = at(2026, 3, 29, 3)  # 03:00 CEST, i.e. 01:00 UTC
    assert q.next_start(at(2026, 3, 29, 0)) == jump
    assert q.weighted_seconds(at(2026, 3, 29, 0), at(2026, 3, 29, 5)) == 4 * 3600 - 0.75 * 3600


def test_the_autumn_change_night_is_an_hour_longer() -> None:
    # Sunday 25 October 2026: clocks go back from 03:00 to 02:00
    p = make_off_peak("Europe/Berlin", 0.5, ["Sat 20:00-07:00"])
    s, e = at(2026, 10, 24, 20), at(2026, 10, 25, 7)
    assert e - s == 12 * 3600
    assert p.weighted_seconds(s, e) == 6 * 3600
    assert p.factor_at(e - 1) == 0.5 and p.factor_at(e) == 1.0


def test_bad_windows_say_what_is_wrong() -> None:
    for text, words in [("Mon-Fri 20:00", "expected '<days> HH:MM-HH:MM'"),
                        ("Mon-Fry 20:00-07:00", "days 'Mon-Fry'"),
                        ("Mon 25:00-07:00", "25:00 is not a time of day"),
                        ("Mon 24:00-07:00", "cannot start at 24:00")]:
        with pytest.raises(ValueError, match=words):
            parse_window(text)
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        make_off_peak("Mars/Olympus", 0.5, ["Mon 20:00-07:00"])
    with pytest.raises(ValueError, match="factor"):
        make_off_peak("UTC", 1.0, ["Mon 20:00-07:00"])
    assert parse_window("Fri-Mon 00:00-24:00").days == (0, 4, 5, 6)


BUDGETS = """\
policy:
  off_peak:
    timezone: Europe/Berlin
    factor: {factor}
    windows: [{windows}]
accounts:
  lab: {{grant: 10, members: [ann]}}
"""


def test_the_budgets_key() -> None:
    b = load_budgets(BUDGETS.format(factor=0.5, windows='"Mon-Fri 20:00-07:00"'))
    assert b.policy.off_peak is not None and b.policy.off_peak.factor == 0.5
    assert load_budgets("accounts:\n  lab: {grant: 10}\n").policy.off_peak is None
    for factor, windows, words in [(1.5, '"Mon 20:00-07:00"', "must be ≤ 1, got 1.5"),
                                   (1, '"Mon 20:00-07:00"', "must be below 1"),
                                   (0.5, '"Mon 20-7"', "expected '<days> HH:MM-HH:MM'"),
                                   (0.5, "", "at least one window")]:
        with pytest.raises(BudgetError, match=words) as e:
            load_budgets(BUDGETS.format(factor=factor, windows=windows))
        assert "policy.off_peak" in str(e.value) and ":" in str(e.value)


def test_usage_by_span_prices_each_day() -> None:
    from jupyter_gpubudget.core.model import ChargeInterval

    a, b = at(2026, 12, 2, 12), at(2026, 12, 3, 12)  # Wed noon to Thu noon, one GPU
    c = ChargeInterval("w", "lab", "ann", 1000, a, b)
    days = [(at(2026, 12, 2), at(2026, 12, 3)), (at(2026, 12, 3), at(2026, 12, 4))]
    assert usage_by_span([c], days, b, NIGHTS) == [8 + 4 * 0.5, 7 * 0.5 + 5]
    assert usage_by_span([c], days, b) == [12.0, 12.0]


times = st.floats(min_value=at(2026, 1, 1), max_value=at(2027, 1, 1), allow_nan=False)


@prop_settings(200)
@given(times, st.floats(min_value=0, max_value=20 * 86400.0), st.sampled_from([
    NIGHTS, make_off_peak("America/New_York", 0.25, ["Sun-Thu 22:00-06:00", "Sat 01:30-03:30"]),
    make_off_peak("Australia/Lord_Howe", 0.0, ["Mon,Wed,Fri 02:00-02:45"])]))
def test_split_covers_the_interval_each_part_at_one_price(a: float, length: float, p) -> None:  # noqa: ANN001
    b = a + length
    parts = p.split(a, b)
    if b <= a:
        assert parts == []
        return
    assert parts[0][0] == a and parts[-1][1] == b
    for (_s1, e1, _), (s2, _, _) in zip(parts, parts[1:], strict=False):
        assert e1 == s2
    for (s, e, f), nxt in zip(parts, parts[1:] + [None], strict=False):
        assert s < e
        assert p.factor_at(s) == f and p.factor_at((s + e) / 2) == f and p.factor_at(e - 1e-3) == f
        if nxt is not None:
            assert nxt[2] != f  # cut only where the price changes
    total = sum((e - s) * f for s, e, f in parts)
    assert total == pytest.approx(p.weighted_seconds(a, b))
    assert priced_clock(p, b) - priced_clock(p, a) == pytest.approx(total, abs=1e-3)
