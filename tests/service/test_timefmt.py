"""Times for people (service/timefmt.py): never a raw epoch; a bad time zone is a clear error."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from jupyter_gpubudget.service.timefmt import (
    BadTimeZone,
    clock_text,
    companions,
    duration_text,
    relative,
    zone,
)

BERLIN = ZoneInfo("Europe/Berlin")
NOW = datetime(2026, 6, 2, 13, 53, tzinfo=BERLIN).timestamp()


def test_durations_and_relative_times():
    assert [duration_text(s) for s in (13, 720, 7500, 3 * 86400 + 4 * 3600)] == [
        "13 s", "12 min", "2 h 5 min", "3 d 4 h"]
    assert relative(NOW + 720, NOW) == "in 12 min"
    assert relative(NOW - 7200, NOW) == "2 h ago"
    assert relative(NOW + 0.2, NOW) == "now"


def test_clock_text_in_the_callers_zone():
    assert clock_text(NOW + 720, NOW, BERLIN) == "14:05 (in 12 min)"
    assert clock_text(NOW + 720, NOW, ZoneInfo("UTC")) == "12:05 (in 12 min)"
    assert clock_text(NOW + 2 * 86400, NOW, BERLIN) == "Thu 4 Jun 13:53 (in 2 d)"
    d = companions({"at": NOW + 720, "none": None, "zero": 0}, ("at", "none", "zero"), NOW,
                   BERLIN)
    assert d["at_local"] == "2026-06-02T14:05:00+02:00" and d["at_text"] == "14:05 (in 12 min)"
    assert d["none_local"] is d["none_text"] is d["zero_text"] is None


@pytest.mark.parametrize("bad", ["Mars/Olympus", "America", "Etc", "../etc/passwd", "a\x00b",
                                 "x" * 100, "/UTC"])
def test_a_bad_zone_is_refused_clearly(bad):
    with pytest.raises(BadTimeZone):
        zone(bad)


def test_no_zone_means_the_services_own():
    assert zone(None) is None and zone("") is None
    assert zone("UTC") == ZoneInfo("UTC")
