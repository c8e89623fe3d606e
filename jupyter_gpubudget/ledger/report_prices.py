"""The usage report's GPU-hours at their price (off-peak parts at the policy's factor,
core/pricing.py), beside the full-price GPU-hours the report counts: what the off-peak
windows took off each line, in milli-GPU-seconds, so that ``priced = charged − discount``
is what the standings count for the same intervals.

Read from the same hourly rollups as the report, grouped by the hour's place in the local
week of the policy's time zone (one query per stretch of constant UTC offsets): an hour that
lies wholly inside a window (or wholly outside) has one factor, the same in every week of the
stretch. An hour a window's edge cuts (an edge at 20:30, or a zone half an hour off UTC) is
read from the charge intervals themselves and cut at the edge to the second. What runs now
is cut the same way up to now.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import BigInteger, and_, cast, func, literal_column, or_, select
from sqlalchemy.orm import Session

from ..core.pricing import OffPeak
from .models import ChargeRow, UsageHourlyRow

HOUR = 3600
WEEK_H = 168
#: partial hours read per query of the charge intervals
_CHUNK = 200


def _off(t: float, tz: ZoneInfo) -> int:
    delta = datetime.fromtimestamp(t, tz).utcoffset()
    return int(delta.total_seconds()) if delta is not None else 0


def stretches(lo: int, hi: int, zones: Iterable[ZoneInfo]) -> list[tuple[int, int, list[int]]]:
    """``[lo, hi)`` (hour-aligned) cut where any of ``zones`` changes its UTC offset: (from,
    to, the zones' offsets there); an hour counts with the offsets at its start."""
    zs = list(zones)
    out: list[tuple[int, int, list[int]]] = []
    a, offs = lo, [_off(lo, z) for z in zs]
    t = lo + HOUR
    while t < hi:
        o = [_off(t, z) for z in zs]
        if o != offs:
            out.append((a, t, offs))
            a, offs = t, o
        t += HOUR
    if a < hi:
        out.append((a, hi, offs))
    return out


def _how(hour_col: Any, off: int) -> Any:
    """The hour's place in the local week (0 = Monday 00:00; UNIX day 0 was a Thursday)."""
    # (cast: PostgreSQL's FLOOR of the division is a double, which has no ``%``)
    local = cast((hour_col + literal_column(str(int(off)))) // literal_column(str(HOUR)),
                 BigInteger)
    return (local + literal_column("72")) % literal_column(str(WEEK_H))


def _cut(off_peak: OffPeak, a: float, b: float) -> float:
    """Seconds of ``[a, b)`` taken off by the windows: Σ part × (1 − factor)."""
    return sum((e - s) * (1.0 - f) for s, e, f in off_peak.split(a, b) if f < 1.0)


def discounts(s: Session, off_peak: OffPeak | None, projects: list[str], only: str | None,
              lo: int, hi: int, start: float, end: float, now: float, tz: ZoneInfo,
              by: str, bucket: Any, period_of: Any, period_at: Any, periods: Any
              ) -> tuple[dict[tuple[str, str], float], dict[tuple[str, float], float]]:
    """What the windows took off, in milli-GPU-seconds: per (project, user) over the
    report's ``[lo, hi)`` (its rollups' hours), and per (project, period start) for a series
    (``by`` day or week; the reader ``only``'s lines). ``bucket(hour_col, off)`` is the
    report's SQL period key for the report zone's offset ``off``, ``period_of(key, off)`` its
    start, ``period_at(t)`` the start of the period holding ``t`` and ``periods(a, b)`` the
    periods over ``[a, b)`` as (start, end); an hour counts in the period its start falls in,
    as the report's rollups do."""
    per_user: dict[tuple[str, str], float] = {}
    per_period: dict[tuple[str, float], float] = {}
    if off_peak is None or not projects or not any(
            f < 1.0 for _, _, f in off_peak.split(lo, max(hi, lo + 1))):
        return per_user, per_period
    series = by in ("day", "week")
    hi_h = -(-hi // HOUR) * HOUR
    ptz = ZoneInfo(off_peak.timezone)
    h = UsageHourlyRow.__table__.c
    partial: list[int] = []
    for x, y, (poff, roff) in stretches(lo, hi_h, (ptz, tz)):
        whole: dict[int, float] = {}  # place in the week -> share of the hour taken off
        cut: set[int] = set()
        for t in range(x, min(y, x + WEEK_H * HOUR), HOUR):
            parts = off_peak.split(t, t + HOUR)
            k = ((t + poff) // HOUR + 72) % WEEK_H
            if len(parts) == 1:
                if parts[0][2] < 1.0:
                    whole[k] = 1.0 - parts[0][2]
            else:
                cut.add(k)
        if cut:
            partial.extend(t for t in range(x, y, HOUR)
                           if ((t + poff) // HOUR + 72) % WEEK_H in cut)
        if not whole:
            continue
        how = _how(h.hour, poff)
        base = [h.hour >= x, h.hour < y, h.project.in_(projects), how.in_(sorted(whole))]
        for p, u, k, c in s.execute(select(h.project, h.user, how.label("k"),
                                           func.sum(h.charged_ms)).where(*base)
                                    .group_by(h.project, h.user, how)):
            per_user[(p, u)] = per_user.get((p, u), 0.0) + (c or 0.0) * whole[int(k)]
        if series:
            key = bucket(h.hour, roff)
            q = select(h.project, key.label("b"), how.label("k"),
                       func.sum(h.charged_ms)).where(*base)
            if only is not None:
                q = q.where(h.user == only)
            for p, b, k, c in s.execute(q.group_by(h.project, key, how)):
                ps = period_of(int(b), roff)
                per_period[(p, ps)] = per_period.get((p, ps), 0.0) + (c or 0.0) * whole[int(k)]
    c = ChargeRow.__table__.c
    for i in range(0, len(partial), _CHUNK):  # hours an edge cuts: from the intervals
        hours = partial[i:i + _CHUNK]
        q = select(c.project, c.user, c.milli, c.start, c.end).where(
            c.end.is_not(None), c.project.in_(projects), c.start < hours[-1] + HOUR,
            c.end > hours[0], or_(*(and_(c.start < t + HOUR, c.end > t) for t in hours)))
        rows: list[Any] = list(s.execute(q))
        for p, u, milli, a, b in rows:
            for t in hours:
                if a < t + HOUR and b > t:
                    ms = milli * _cut(off_peak, max(a, t), min(b, t + HOUR))
                    if ms:
                        per_user[(p, u)] = per_user.get((p, u), 0.0) + ms
                        if series and (only is None or u == only):
                            ps = period_at(t)
                            per_period[(p, ps)] = per_period.get((p, ps), 0.0) + ms
    # what runs now: charged until now, cut at the edges
    for p, u, milli, a0 in s.execute(select(c.project, c.user, c.milli, c.start).where(
            c.end.is_(None), c.project.in_(projects), c.start < end)):
        a, b = max(a0, start), min(end, now)
        if b <= a:
            continue
        per_user[(p, u)] = per_user.get((p, u), 0.0) + milli * _cut(off_peak, a, b)
        if series and (only is None or u == only):
            for ps, pe in periods(a, b):
                ms = milli * _cut(off_peak, max(a, ps), min(b, pe))
                per_period[(p, ps)] = per_period.get((p, ps), 0.0) + ms
    return per_user, per_period

