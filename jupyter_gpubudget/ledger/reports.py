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

from sqlalchemy import func, literal_column, select
from sqlalchemy.orm import Session

from .models import BusyChargeRow, ChargeRow, DecisionRow, UsageHourlyRow, WorkloadRow

HOUR = 3600
MS_PER_H = 1000.0 * 3600.0  # milli-GPU-seconds in a GPU-hour
BY = ("day", "week", "user")


@dataclass
class Figures:
    charged_ms: float = 0.0
    measured_ms: float = 0.0
    busy_ms: float = 0.0

    def add(self, c: float, m: float, b: float) -> None:
        self.charged_ms += c
        self.measured_ms += m
        self.busy_ms += b

    def json(self) -> dict[str, Any]:
        charged = self.charged_ms / MS_PER_H
        if self.measured_ms <= 0:
            return {"charged_gpu_h": charged, "busy_gpu_h": None, "measured_gpu_h": 0.0,
                    "idle_gpu_h": None, "idle_share": None}
        measured, busy = self.measured_ms / MS_PER_H, self.busy_ms / MS_PER_H
        idle = max(0.0, measured - busy)
        return {"charged_gpu_h": charged, "busy_gpu_h": busy, "measured_gpu_h": measured,
                "idle_gpu_h": idle, "idle_share": idle / measured}


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
           idle_top: int = 10) -> dict[str, Any]:
    """The report's figures (see the module docstring); ``grants``: each project's (and the
    account's) grant in GPU-hours per ``window``, None where it has none."""
    projects = list(scope.projects)
    only = scope.only_user
    h = UsageHourlyRow.__table__.c
    lo, hi = (int(start) // HOUR) * HOUR, int(end)
    per_user: dict[tuple[str, str], Figures] = {}
    per_period: dict[tuple[str, float], Figures] = {}
    if projects:
        if by in ("day", "week"):
            for a, b, off in offset_stretches(lo, hi, tz):
                k = _bucket_expr(h.hour, off, by).label("k")
                q = (select(h.project, h.user, k, func.sum(h.charged_ms),
                            func.sum(h.measured_ms), func.sum(h.busy_ms))
                     .where(h.hour >= a, h.hour < b, h.project.in_(projects))
                     .group_by(h.project, h.user, k))
                for p, u, kk, c, m, bz in s.execute(q):
                    per_user.setdefault((p, u), Figures()).add(c or 0, m or 0, bz or 0)
                    if only is None or u == only:
                        ps = _bucket_start(int(kk), off, by, tz)
                        per_period.setdefault((p, ps), Figures()).add(c or 0, m or 0, bz or 0)
        else:
            q = (select(h.project, h.user, func.sum(h.charged_ms), func.sum(h.measured_ms),
                        func.sum(h.busy_ms))
                 .where(h.hour >= lo, h.hour < hi, h.project.in_(projects))
                 .group_by(h.project, h.user))
            for p, u, c, m, bz in s.execute(q):
                per_user.setdefault((p, u), Figures()).add(c or 0, m or 0, bz or 0)
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
    # projects and their users' lines
    totals = Figures()
    proj_out = []
    for p in projects:
        pf = Figures()
        lines = []
        for (pp, u), f in sorted(per_user.items()):
            if pp != p:
                continue
            pf.add(f.charged_ms, f.measured_ms, f.busy_ms)
            if only is None or u == only:
                lines.append({"user": u, **f.json()})
        totals.add(pf.charged_ms, pf.measured_ms, pf.busy_ms)
        proj_out.append({"project": p, **pf.json(), **_grant(grants.get(p), start, end,
                                                             window),
                         "users": lines})
    waits, preempted, by_project = _waits_and_preemptions(s, projects, only, start, end)
    for e in proj_out:
        e["preemptions"] = by_project.get(e["project"], 0)
    out: dict[str, Any] = {
        "account": account, "from": start, "to": end, "by": by,
        "from_local": datetime.fromtimestamp(start, tz).isoformat(),
        "to_local": datetime.fromtimestamp(end, tz).isoformat(),
        "totals": {**totals.json(), **_grant(grants.get(account), start, end, window),
                   "preemptions": preempted},
        "projects": proj_out, "waits": waits,
        "idle_sessions": _idle_sessions(s, projects, only, start, end, idle_top),
        "computed_at": now}
    if by in ("day", "week"):
        starts = sorted({ps for _, ps in per_period})
        out["periods"] = [{
            "start": ps, "start_local": datetime.fromtimestamp(ps, tz).isoformat(),
            "projects": [{"project": p, **per_period[(p, ps)].json()}
                         for p in projects if (p, ps) in per_period]} for ps in starts]
    return out


def _grant(hours: float | None, start: float, end: float, window: float) -> dict[str, Any]:
    if hours is None:
        return {"grant_gpu_h": None}
    return {"grant_gpu_h": hours * (end - start) / window, "grant_gpu_h_per_window": hours}


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[i]


def _waits_and_preemptions(s: Session, projects: list[str], only: str | None, start: float,
                           end: float) -> tuple[dict, int, dict[str, int]]:
    w = WorkloadRow.__table__.c
    waits: dict[str, list[float]] = {}
    if projects:
        q = (select(w.kind, w.started_at - w.submitted_at)
             .where(w.project.in_(projects), w.started_at >= start, w.started_at < end))
        if only is not None:
            q = q.where(w.user == only)
        for kind, wait in s.execute(q):
            waits.setdefault(kind, []).append(max(0.0, float(wait)))
    d = DecisionRow.__table__.c
    by_project: dict[str, int] = {}
    if projects:
        q2 = (select(w.project, func.count())
              .select_from(DecisionRow.__table__.join(WorkloadRow.__table__,
                                                       d.workload == w.id))
              .where(d.kind == "preempt", d.at >= start, d.at < end,
                     w.project.in_(projects)).group_by(w.project))
        if only is not None:
            q2 = q2.where(w.user == only)
        by_project = {p: int(n) for p, n in s.execute(q2)}
    return ({k: {"count": len(v), "p50_s": _pct(v, 0.5), "p90_s": _pct(v, 0.9)}
             for k, v in sorted(waits.items())}, sum(by_project.values()), by_project)


def _idle_sessions(s: Session, projects: list[str], only: str | None, start: float,
                   end: float, top: int) -> list[dict]:
    """The interactive sessions whose measured slices sat idle longest (per session, over
    its charge intervals that overlap the period)."""
    if not projects or top <= 0:
        return []
    b = BusyChargeRow.__table__.c
    idle = func.sum(b.measured_ms - b.busy_ms).label("idle")
    q = (select(b.workload, b.user, b.project, idle, func.sum(b.measured_ms),
                func.sum(b.busy_ms))
         .where(b.kind == "interactive", b.project.in_(projects), b.last > start,
                b.first < end)
         .group_by(b.workload, b.user, b.project).order_by(idle.desc()).limit(top))
    if only is not None:
        q = q.where(b.user == only)
    rows = s.execute(q).all()
    names = dict(s.execute(select(WorkloadRow.id, WorkloadRow.name)
                           .where(WorkloadRow.id.in_([r[0] for r in rows]))).tuples().all()) if rows else {}
    return [{"workload": wid, "name": names.get(wid, ""), "user": u, "project": p,
             "idle_gpu_h": max(0.0, (i or 0) / MS_PER_H), "measured_gpu_h": (m or 0) / MS_PER_H,
             "busy_gpu_h": (bz or 0) / MS_PER_H} for wid, u, p, i, m, bz in rows]


def csv_rows(rep: dict[str, Any]) -> Iterable[list[Any]]:
    """The report as CSV rows (header first): one row per project and user (``by=user``) or
    per period and project (``by=day|week``), then per project and a total row. The rows of
    one kind sum to the total, as the JSON's figures do."""
    cols = ["row", "period_start", "project", "user", "charged_gpu_h", "busy_gpu_h",
            "measured_gpu_h", "idle_gpu_h", "idle_share", "grant_gpu_h", "preemptions"]
    yield cols

    def fig(d: dict) -> list[Any]:
        return ["" if d.get(k) is None else d.get(k) for k in
                ("charged_gpu_h", "busy_gpu_h", "measured_gpu_h", "idle_gpu_h", "idle_share")]

    for per in rep.get("periods", []):
        for e in per["projects"]:
            yield ["period", per["start_local"], e["project"], "", *fig(e), "", ""]
    for p in rep["projects"]:
        for u in p["users"]:
            yield ["user", "", p["project"], u["user"], *fig(u), "", ""]
    for p in rep["projects"]:
        yield ["project", "", p["project"], "", *fig(p),
               "" if p.get("grant_gpu_h") is None else p["grant_gpu_h"], p["preemptions"]]
    t = rep["totals"]
    yield ["total", "", rep["account"], "", *fig(t),
           "" if t.get("grant_gpu_h") is None else t["grant_gpu_h"], t["preemptions"]]
