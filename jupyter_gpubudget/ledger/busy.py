"""Busy GPU time beside the charge intervals, and hourly rollups per project and per user.

Words (docs/admin.md, "Reports"): *charged* GPU time is what a workload's slices held; *busy*
GPU time is what its devices measured as computing. A sample says that from ``start`` to
``end`` the slices of a running workload's open charge interval were computing a fraction
``busy`` (0..1) of the time; it adds ``milli × (end − start)`` measured and ``busy ×`` that
busy milli-GPU-seconds to the interval's :class:`BusyChargeRow` and to the (project, user,
hour) buckets of :class:`UsageHourlyRow`. Charged time joins the same buckets when the
interval closes (:func:`add_charged`, called by ``Ledger._close``). Time nothing measured stays
unmeasured: a report shows its busy time as unknown, never as 0.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from .models import (
    WAIT_BUCKETS,
    BusyChargeRow,
    ChargeRow,
    UsageDailyRow,
    UsageHourlyRow,
    WaitDailyRow,
    WorkloadRow,
)
from .rollups import split_by_hour


def _insert(s: Session):  # noqa: ANN202
    if s.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert


def add_hourly(s: Session, project: str, user: str, milli: float, start: float, end: float,
               *, charged: bool = False, busy: float | None = None) -> None:
    """Add ``milli`` GPUs over ``[start, end)`` to the hourly buckets: as charged time
    (``charged``), or as measured time of which the fraction ``busy`` was computing."""
    if end <= start or milli <= 0:
        return
    insert = _insert(s)
    days: dict[int, dict[str, float]] = {}
    for hour, ms, _stop in split_by_hour(milli, start, end):
        vals = {"charged_ms": ms if charged else 0.0,
                "measured_ms": 0.0 if busy is None else ms,
                "busy_ms": 0.0 if busy is None else ms * busy}
        h = int(hour)
        _upsert(s, insert, UsageHourlyRow, ["hour", "project", "user"], vals,
                project=project, user=user, hour=h, hod=h % 86400 // 3600)
        day = days.setdefault(h // 86400, dict.fromkeys(vals, 0.0))
        for k, v in vals.items():
            day[k] += v
    for d, vals in days.items():
        _upsert(s, insert, UsageDailyRow, ["day", "project", "user"], vals, project=project,
                user=user, day=d)


def _upsert(s: Session, insert: Any, model: Any, keys: list[str], vals: dict[str, float],
            _add: dict[str, int] | None = None, **ident: Any) -> None:
    """Insert the row or add ``vals`` (and ``_add``) to the one there."""
    t = model.__table__.c
    stmt = insert(model).values(**ident, **vals)
    added = {k: v for k, v in vals.items() if v}
    added.update(_add or {})
    s.execute(stmt.on_conflict_do_update(
        index_elements=keys,
        set_={k: getattr(t, k) + getattr(stmt.excluded, k) for k in added}
        or {keys[0]: getattr(t, keys[0])}))


def wait_bucket(seconds: float) -> int:
    """A wait's half-octave bucket (``WaitDailyRow``): 0 .. WAIT_BUCKETS − 1."""
    return min(WAIT_BUCKETS - 1, int(math.floor(2 * math.log2(1 + max(0.0, seconds)))))


def bucket_seconds(bucket: int) -> float:
    """The middle of a bucket's range of waits, in seconds (geometric)."""
    return max(0.0, 2 ** ((bucket + 0.5) / 2) - 1)


def wait_of(s: Session, workload: str, seq: int, start: float) -> tuple[str, float] | None:
    """(kind, seconds) the workload waited before its ``seq``-th interval began at
    ``start``: since it was submitted, or since a preemption closed the one before."""
    row = s.execute(select(WorkloadRow.kind, WorkloadRow.submitted_at)
                    .where(WorkloadRow.id == workload)).first()
    if row is None:
        return None
    since = row[1]
    if seq > 1:
        prev = s.execute(select(ChargeRow.end).where(ChargeRow.workload == workload,
                                                     ChargeRow.seq == seq - 1)).scalar()
        since = prev if prev is not None else since
    return row[0], max(0.0, start - since)


def add_closed(s: Session, c: Any, end: float, closed_by: str) -> None:
    """What a closed interval ``c`` adds to the reports' rollups (in the transaction that
    closes it): its charge hour by hour, the preemption that closed it, its wait."""
    add_hourly(s, c.project, c.user, c.milli, c.start, end, charged=True)
    insert = _insert(s)
    if closed_by == "preempt":
        _upsert(s, insert, UsageDailyRow, ["day", "project", "user"], {}, project=c.project,
                user=c.user, day=int(end) // 86400, preemptions=1,
                _add={"preemptions": 1})
    w = wait_of(s, c.workload, c.seq, c.start)
    if w is not None:
        col = f"w{wait_bucket(w[1])}"
        t = WaitDailyRow.__table__.c
        stmt = insert(WaitDailyRow).values(project=c.project, day=int(c.start) // 86400,
                                           kind=w[0], **{col: 1})
        s.execute(stmt.on_conflict_do_update(
            index_elements=["day", "project", "kind"],
            set_={col: func.coalesce(t[col], 0) + 1}))


def record(s: Session, workload: str, start: float, end: float, busy: float,
           source: str) -> bool:
    """Record that ``workload``'s devices were busy a fraction ``busy`` of ``[start, end)``.

    Only the part of that span its charge intervals cover counts (a sample from before a
    preemption's requeue adds nothing to the next interval). False: nothing was recorded
    (no interval covers the span)."""
    busy = min(1.0, max(0.0, float(busy)))
    if not end > start:
        return False
    rows = s.execute(select(ChargeRow.id, ChargeRow.project, ChargeRow.user, ChargeRow.milli,
                            ChargeRow.start, ChargeRow.end, ChargeRow.checkpoint,
                            WorkloadRow.kind)
                     .join(WorkloadRow, WorkloadRow.id == ChargeRow.workload)
                     .where(ChargeRow.workload == workload, ChargeRow.start < end,
                            (ChargeRow.end.is_(None)) | (ChargeRow.end > start))).all()
    done = False
    for cid, project, user, milli, c_start, c_end, _ckpt, kind in rows:
        a, b = max(start, c_start), min(end, c_end if c_end is not None else end)
        if b <= a:
            continue
        ms = milli * (b - a)
        row = s.get(BusyChargeRow, cid)
        if row is None:
            s.add(BusyChargeRow(charge=cid, workload=workload, project=project, user=user,
                                kind=kind, measured_ms=ms, busy_ms=ms * busy, first=a, last=b,
                                source=source, last_busy=busy, idle_ms=ms - ms * busy))
            s.flush()
        else:
            s.execute(update(BusyChargeRow).where(BusyChargeRow.charge == cid).values(
                measured_ms=BusyChargeRow.measured_ms + ms,
                busy_ms=BusyChargeRow.busy_ms + ms * busy,
                idle_ms=BusyChargeRow.idle_ms + (ms - ms * busy),
                first=min(row.first, a), last=max(row.last, b), source=source,
                **({"last_busy": busy} if b >= row.last else {})))
        add_hourly(s, project, user, milli, a, b, busy=busy)
        done = True
    return done


def prune(s: Session, before: float) -> int:
    """Drop the hourly rollups and per-interval busy figures older than ``before`` (the
    retention, ``usage_history_days``). Returns the number of hourly rows removed."""
    n = s.execute(delete(UsageHourlyRow).where(UsageHourlyRow.hour < int(before) - 3600)
                  ).rowcount or 0
    s.execute(delete(UsageDailyRow).where(UsageDailyRow.day < int(before) // 86400))
    s.execute(delete(WaitDailyRow).where(WaitDailyRow.day < int(before) // 86400))
    s.execute(delete(BusyChargeRow).where(BusyChargeRow.last < before))
    return n
