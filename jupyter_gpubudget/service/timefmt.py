"""Times for people: '14:05 (in 12 min)', never a raw epoch.

JSON answers keep the number (seconds since the epoch, for programs) and add companions:
``<field>_local`` (ISO 8601 with the offset, in the caller's time zone) and ``<field>_text``
('14:05 (in 12 min)'; a date is added when it is not today). The time zone is the request's
``?tz=Area/City`` (the service's pages send the browser's), else the service's own. The pages
themselves render every time in the browser's local time (``static/gpubudget.js``).
"""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


class BadTimeZone(ValueError):
    pass


def zone(name: str | None) -> tzinfo | None:
    """The named IANA time zone; None: the service's own. Raises :class:`BadTimeZone`."""
    if not name:
        return None
    if len(name) > 64 or ".." in name or name.startswith("/"):
        raise BadTimeZone(f"not a time zone: {name[:64]!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as e:  # OSError: 'America' (a folder)
        raise BadTimeZone(f"unknown time zone {name!r} (e.g. Europe/Berlin, UTC)") from e


def _dt(t: float, tz: tzinfo | None) -> datetime:
    return datetime.fromtimestamp(t, tz) if tz is not None else datetime.fromtimestamp(t).astimezone()


def duration_text(seconds: float) -> str:
    """'13 s', '12 min', '2 h 5 min', '3 d 4 h'."""
    s = abs(seconds)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s // 60:.0f} min"
    if s < 86400:
        h, m = divmod(round(s / 60), 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(round(s / 3600), 24)
    return f"{d} d {h} h" if h else f"{d} d"


def relative(t: float, now: float) -> str:
    """'in 12 min', '3 h ago', 'now'."""
    delta = t - now
    if abs(delta) < 1:
        return "now"
    return f"in {duration_text(delta)}" if delta > 0 else f"{duration_text(delta)} ago"


def clock_text(t: float, now: float, tz: tzinfo | None = None) -> str:
    """'14:05 (in 12 min)'; 'Tue 3 Jun 14:05 (in 2 d)' when not today."""
    d, today = _dt(t, tz), _dt(now, tz)
    hm = d.strftime("%H:%M")
    if d.date() != today.date():
        hm = f"{d.strftime('%a')} {d.day} {d.strftime('%b')}" + (
            f" {d.year}" if d.year != today.year else "") + f" {hm}"
    return f"{hm} ({relative(t, now)})"


def local_iso(t: float, tz: tzinfo | None = None) -> str:
    return _dt(t, tz).isoformat(timespec="seconds")


def companions(d: dict[str, Any], fields: tuple[str, ...], now: float,
               tz: tzinfo | None = None) -> dict[str, Any]:
    """``d`` with ``<field>_local`` and ``<field>_text`` added for each of ``fields``."""
    for k in fields:
        t = d.get(k)
        ok = isinstance(t, int | float) and not isinstance(t, bool) and t > 0
        d[f"{k}_local"] = local_iso(t, tz) if ok else None
        d[f"{k}_text"] = clock_text(t, now, tz) if ok else None
    return d
