"""Usage reports: where an account subtree's GPU-hours went over a period (docs/admin.md,
"Reports").

Figures come from the hourly rollups (``usage_hourly``: charged per closed interval, measured
and busy per sample) plus the open intervals' charge so far, so a year's report reads one row
per project, user and hour however many intervals the year held, and the periods of the
reader's time zone (days, weeks starting Monday) are formed in SQL with integer arithmetic on
the hour (one query per stretch of constant UTC offset). A clock hour that straddles a local
midnight (zones with a half-hour offset) counts in the local day it starts in.

*busy* is ``None`` (unknown) where nothing measured; where only part of the charged time was
measured, busy and idle describe the measured part (``measured_gpu_h`` says how much).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import BigInteger, cast, func, literal_column, select, text
from sqlalchemy.orm import Session

from ..core.pricing import OffPeak
from ..usage_report import MS_PER_H, Figures, csv_rows, grant_figures, waits_figures
from .busy import bucket_seconds, wait_of
from .models import (
    WAIT_BUCKETS,
    BusyChargeRow,
    ChargeRow,
    UsageDailyRow,
    UsageHourlyRow,
    WaitDailyRow,
    WorkloadRow,
)
from .report_prices import discounts

HOUR = 3600
BY = ("day", "week", "user")


@dataclass
class Scope:
    """What the reader may see: the projects reported, and (None: everyone) the one user
    whose line alone is shown inside them (a researcher)."""

    projects: list[str]
    only_user: str | None = None
    users_of: dict[str, list[str]] = field(default_factory=dict)


def offset_stretches(start: int, end: int, tz: ZoneInfo) -> list[tuple[int, int, int]]:
    """``[start, end)`` (hour-aligned) cut where ``tz``'s UTC offset changes: (from, to,
    offset seconds); an hour counts with the offset at its start."""
    out: list[tuple[int, int, int]] = []
    a, off = start, _off(start, tz)
    t = start + HOUR
    while t < end:
        o = _off(t, tz)
        if o != off:
            out.append((a, t, off))
            a, off = t, o
        t += HOUR
    if a < end:
        out.append((a, end, off))
    return out


def _off(t: float, tz: ZoneInfo) -> int:
    delta = datetime.fromtimestamp(t, tz).utcoffset()
    return int(delta.total_seconds()) if delta is not None else 0


def periods(a: float, b: float, tz: ZoneInfo, by: str) -> Iterable[tuple[float, float]]:
    """The local days (or weeks) overlapping ``[a, b)``: (start, end) UNIX seconds (a day
    is 23 or 25 hours long when the clocks change)."""
    ps = period_start(a, tz, by)
    while ps.timestamp() < b:
        d = ps.date() + timedelta(days=7 if by == "week" else 1)
        nxt = datetime(d.year, d.month, d.day, tzinfo=tz)
        yield ps.timestamp(), nxt.timestamp()
        ps = nxt


def period_start(t: float, tz: ZoneInfo, by: str) -> datetime:
    """The local day (or Monday-starting week) holding ``t``, as a local midnight."""
    d = datetime.fromtimestamp(t, tz).date()
    if by == "week":
        d = d - timedelta(days=d.weekday())
    return datetime(d.year, d.month, d.day, tzinfo=tz)


def _bucket_expr(hour_col: Any, off: int, by: str) -> Any:
    # UNIX day 0 (1970-01-01) was a Thursday: +3 days makes weeks start on Monday
    # (integer literals inline: integer division on SQLite and PostgreSQL alike)
    if by == "week":
        return (hour_col + literal_column(str(int(off) + 3 * 86400))) // literal_column(
            str(7 * 86400))
    return (hour_col + literal_column(str(int(off)))) // literal_column("86400")


def _bucket_start(k: int, off: int, by: str, tz: ZoneInfo) -> float:
    local_midnight = (k * 7 * 86400 - 3 * 86400) if by == "week" else k * 86400
    t = local_midnight - off
    # the period's true local midnight (the offset at its start may differ from ``off``)
    return period_start(t + 43200, tz, by).timestamp()


def report(s: Session, *, account: str, scope: Scope, start: float, end: float, tz: ZoneInfo,
           by: str, now: float, grants: dict[str, float | None], window: float,
           idle_top: int = 10, off_peak: OffPeak | None = None) -> dict[str, Any]:
    """The report's figures (see the module docstring); ``grants``: each project's (and the
    account's) grant in GPU-hours per ``window``, None where it has none; ``off_peak``: the
    policy's prices, which ``priced_gpu_h`` applies (report_prices.py)."""
    if s.get_bind().dialect.name == "postgresql":
        # this read-only transaction sums one statement's rows before it sends the next: on a
        # loaded machine that can pass the 5 s the server allows an idle transaction (set for
        # writers, ``db.PG_CONNECT_ARGS``); it holds no lock a writer or a new leader waits for
        s.execute(text("SET LOCAL idle_in_transaction_session_timeout = '60s'"))
    projects = list(scope.projects)
    only = scope.only_user
    lo, hi = (int(start) // HOUR) * HOUR, int(end)
    per_user: dict[tuple[str, str], Figures] = {}
    per_period: dict[tuple[str, float], Figures] = {}
    if projects:
        _totals(s, projects, lo, hi, per_user)
        if by in ("day", "week"):
            _series(s, projects, only, lo, hi, tz, by, per_period)
        # what runs now: charged until now (closed intervals joined the rollups already)
        c = ChargeRow.__table__.c
        for p, u, milli, a0 in s.execute(
                select(c.project, c.user, c.milli, c.start)
                .where(c.end.is_(None), c.project.in_(projects), c.start < end)):
            a, b = max(a0, start), min(end, now)
            if b <= a:
                continue
            ms = milli * (b - a)
            per_user.setdefault((p, u), Figures()).add(ms, 0, 0)
            if by in ("day", "week") and (only is None or u == only):
                for ps, pe in periods(a, b, tz, by):
                    seg = min(b, pe) - max(a, ps)
                    per_period.setdefault((p, ps), Figures()).add(milli * seg, 0, 0)
    disc_user, disc_period = discounts(
        s, off_peak, projects, only, lo, hi, start, end, now, tz, by,
        lambda col, off: _bucket_expr(col, off, by),
        lambda k, off: _bucket_start(k, off, by, tz),
        lambda t: period_start(t, tz, by).timestamp(),
        lambda a, b: periods(a, b, tz, by))
    for key, f in per_user.items():
        f.discount_ms = disc_user.get(key, 0.0)
    for pkey, f in per_period.items():
        f.discount_ms = disc_period.get(pkey, 0.0)
    # projects and their users' lines
    totals = Figures(discount_ms=0.0)
    proj_out = []
    for p in projects:
        pf = Figures(discount_ms=0.0)
        lines = []
        for (pp, u), f in sorted(per_user.items()):
            if pp != p:
                continue
            pf.add(f.charged_ms, f.measured_ms, f.busy_ms, f.discount_ms)
            if only is None or u == only:
                lines.append({"user": u, **f.json()})
        totals.add(pf.charged_ms, pf.measured_ms, pf.busy_ms, pf.discount_ms)
        proj_out.append({"project": p, **pf.json(), **grant_figures(grants.get(p), start, end,
                                                                    window),
                         "users": lines})
    waits, preempted, by_project = _waits_and_preemptions(s, projects, only, start, end)
    for e in proj_out:
        e["preemptions"] = by_project.get(e["project"], 0)
    out: dict[str, Any] = {
        "account": account, "from": start, "to": end, "by": by,
        "from_local": datetime.fromtimestamp(start, tz).isoformat(),
        "to_local": datetime.fromtimestamp(end, tz).isoformat(),
        "totals": {**totals.json(), **grant_figures(grants.get(account), start, end, window),
                   "preemptions": preempted},
        "projects": proj_out, "waits": waits,
        "idle_sessions": _idle_sessions(s, projects, only, start, end, idle_top),
        "computed_at": now}
    if by in ("day", "week"):
        per_period = {k: f for k, f in per_period.items() if not f.empty()}
        starts = sorted({ps for _, ps in per_period})
        out["periods"] = [{
            "start": ps, "start_local": datetime.fromtimestamp(ps, tz).isoformat(),
            "projects": [{"project": p, **per_period[(p, ps)].json()}
                         for p in projects if (p, ps) in per_period]} for ps in starts]
    return out


_SUMS = ("charged_ms", "measured_ms", "busy_ms")


def _days(lo: int, hi: int) -> tuple[int, int]:
    """The whole UTC days inside ``[lo, hi)``: their first and end (UNIX seconds)."""
    a = -(-lo // 86400) * 86400
    b = (hi // 86400) * 86400
    return (a, b) if a < b else (hi, hi)


def _totals(s: Session, projects: list[str], lo: int, hi: int,
            per_user: dict[tuple[str, str], Figures]) -> None:
    """Per (project, user) over ``[lo, hi)``: whole UTC days from the daily rollups, the
    hours before and after them from the hourly ones."""
    h, d = UsageHourlyRow.__table__.c, UsageDailyRow.__table__.c
    a, b = _days(lo, hi)
    parts = []
    if a < b:
        parts.append(select(d.project, d.user, *(func.sum(d[k]) for k in _SUMS))
                     .where(d.day >= a // 86400, d.day < b // 86400, d.project.in_(projects))
                     .group_by(d.project, d.user))
    for x, y in ((lo, a), (b, hi)) if a < b else ((lo, hi),):
        if x < y:
            parts.append(select(h.project, h.user, *(func.sum(h[k]) for k in _SUMS))
                         .where(h.hour >= x, h.hour < y, h.project.in_(projects))
                         .group_by(h.project, h.user))
    for q in parts:
        for p, u, c, m, bz in s.execute(q):
            per_user.setdefault((p, u), Figures()).add(c or 0, m or 0, bz or 0)


def _series(s: Session, projects: list[str], only: str | None, lo: int, hi: int,
            tz: ZoneInfo, by: str, per_period: dict[tuple[str, float], Figures]) -> None:
    """Per (project, local day or week) over ``[lo, hi)``, one stretch of constant UTC offset
    at a time: a whole UTC day counts in the local period its noon falls in, then the hours
    that belong to a neighbouring local day (its ``hod`` band: 1 or 2 hours a day in Europe)
    move there; the stretch's partial days are read by the hour."""
    h, d = UsageHourlyRow.__table__.c, UsageDailyRow.__table__.c
    starts: dict[tuple[int, int], float] = {}

    def add(p: str, k: Any, off: int, c: Any, m: Any, bz: Any, sign: float = 1.0) -> None:
        key = (int(k), off)
        ps = starts.get(key)
        if ps is None:
            ps = starts[key] = _bucket_start(int(k), off, by, tz)
        per_period.setdefault((p, ps), Figures()).add(sign * (c or 0), sign * (m or 0),
                                                      sign * (bz or 0))

    for x, y, off in offset_stretches(lo, hi, tz):
        a, b = _days(x, y)
        qs = []
        if a < b:
            k = _bucket_expr(cast(d.day, BigInteger) * literal_column("86400")
                             + literal_column("43200"), off, by)
            q = (select(d.project, k.label("k"), *(func.sum(d[c]) for c in _SUMS))
                 .where(d.day >= a // 86400, d.day < b // 86400, d.project.in_(projects)))
            qs.append((q.where(d.user == only) if only is not None else q)
                      .group_by(d.project, k))
            band = [o for o in range(24) if (o * 3600 + off) // 86400 != 0]
            if band:  # hours of these UTC days that belong to a neighbouring local day
                mid = _bucket_expr(h.hour - (h.hour % literal_column("86400"))
                                   + literal_column("43200"), off, by)
                own = _bucket_expr(h.hour, off, by)
                # over months, read the band through its index (``hour + 0``: not the
                # key's range, which would be every row of the period)
                hour = h.hour + literal_column("0") if b - a > 31 * 86400 else h.hour
                q = (select(h.project, mid.label("mid"), own.label("own"),
                            *(func.sum(h[c]) for c in _SUMS))
                     .where(h.hod.in_(band), hour >= a, hour < b,
                            h.project.in_(projects)))
                q = (q.where(h.user == only) if only is not None else q).group_by(
                    h.project, mid, own)
                for p, km, ko, c, m, bz in s.execute(q):
                    if km != ko:
                        add(p, km, off, c, m, bz, -1.0)
                        add(p, ko, off, c, m, bz)
        for u, v in ((x, a), (b, y)) if a < b else ((x, y),):
            if u < v:
                k = _bucket_expr(h.hour, off, by)
                q = (select(h.project, k.label("k"), *(func.sum(h[c]) for c in _SUMS))
                     .where(h.hour >= u, h.hour < v, h.project.in_(projects)))
                qs.append((q.where(h.user == only) if only is not None else q)
                          .group_by(h.project, k))
        for q in qs:
            for p, k, c, m, bz in s.execute(q):
                add(p, k, off, c, m, bz)


def _waits_and_preemptions(s: Session, projects: list[str], only: str | None, start: float,
                           end: float) -> tuple[dict, int, dict[str, int]]:
    """Waits before the intervals that began in the period (the projects', by UTC day of
    their start, to within a quarter octave; what runs now counted exactly) and preemptions
    suffered (by UTC day of the preemption; a researcher: their own)."""
    if not projects:
        return {}, 0, {}
    lo_day, hi_day = int(start) // 86400, -(-int(end) // 86400)
    wt = WaitDailyRow.__table__.c
    hist: dict[str, list[tuple[float, int]]] = {}
    for kind, *counts in s.execute(
            select(wt.kind, *(func.sum(wt[f"w{b}"]) for b in range(WAIT_BUCKETS)))
            .where(wt.day >= lo_day, wt.day < hi_day, wt.project.in_(projects))
            .group_by(wt.kind)):
        hist.setdefault(kind, []).extend((bucket_seconds(b), int(n)) for b, n in
                                         enumerate(counts) if n)
    c = ChargeRow.__table__.c
    for seq, wid, a in s.execute(select(c.seq, c.workload, c.start).where(
            c.end.is_(None), c.project.in_(projects), c.start >= lo_day * 86400,
            c.start < hi_day * 86400)):
        got = wait_of(s, wid, seq, a)
        if got is not None:
            hist.setdefault(got[0], []).append((got[1], 1))
    d = UsageDailyRow.__table__.c
    q = (select(d.project, func.sum(d.preemptions))
         .where(d.day >= lo_day, d.day < hi_day, d.project.in_(projects))
         .group_by(d.project))
    if only is not None:
        q = q.where(d.user == only)
    by_project = {p: int(n or 0) for p, n in s.execute(q) if n}
    return waits_figures(hist), sum(by_project.values()), by_project


def _idle_sessions(s: Session, projects: list[str], only: str | None, start: float,
                   end: float, top: int) -> list[dict]:
    """The interactive sessions whose measured slices sat idle longest, over their charge
    intervals that overlap the period: the ``4 × top`` idlest intervals name the sessions
    (a top-k read, no grouping of the whole period), whose intervals are then summed."""
    if not projects or top <= 0:
        return []
    b = BusyChargeRow.__table__.c
    where = [b.project.in_(projects), b.last > start, b.first < end]
    if only is not None:
        where.append(b.user == only)
    # the idlest intervals first, from the (kind, idle_ms) index: no sort of the period
    wids = list(dict.fromkeys(s.execute(select(b.workload).where(b.kind == "interactive",
                                                                  *where)
                                        .order_by(b.idle_ms.desc()).limit(4 * top)).scalars()))
    if not wids:
        return []
    # their intervals through the workload index (their kind is known: not filtered again,
    # which would lead the planner to the kind index and the whole period)
    rows = sorted(s.execute(select(b.workload, b.user, b.project,
                                   func.sum(b.measured_ms - b.busy_ms), func.sum(b.measured_ms),
                                   func.sum(b.busy_ms))
                            .where(*where, b.workload.in_(wids))
                            .group_by(b.workload, b.user, b.project)).all(),
                  key=lambda r: -(r[3] or 0))[:top]
    names = dict(s.execute(select(WorkloadRow.id, WorkloadRow.name)
                           .where(WorkloadRow.id.in_([r[0] for r in rows]))).all())
    return [{"workload": wid, "name": names.get(wid, ""), "user": u, "project": p,
             "idle_gpu_h": max(0.0, (i or 0) / MS_PER_H), "measured_gpu_h": (m or 0) / MS_PER_H,
             "busy_gpu_h": (bz or 0) / MS_PER_H} for wid, u, p, i, m, bz in rows]


__all__ = ["BY", "MS_PER_H", "Figures", "Scope", "csv_rows", "period_start", "periods", "report"]
