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

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from .models import BusyChargeRow, ChargeRow, UsageHourlyRow, WorkloadRow
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
    t = UsageHourlyRow.__table__.c
    for hour, ms, _stop in split_by_hour(milli, start, end):
        vals = {"charged_ms": ms if charged else 0.0,
                "measured_ms": 0.0 if busy is None else ms,
                "busy_ms": 0.0 if busy is None else ms * busy}
        stmt = insert(UsageHourlyRow).values(project=project, user=user, hour=int(hour), **vals)
        s.execute(stmt.on_conflict_do_update(
            index_elements=["project", "user", "hour"],
            set_={k: getattr(t, k) + getattr(stmt.excluded, k) for k, v in vals.items() if v}
            or {"charged_ms": t.charged_ms}))


def add_charged(s: Session, project: str, user: str, milli: float, start: float,
                end: float) -> None:
    """A closed interval's charge, hour by hour (in the transaction that closes it)."""
    add_hourly(s, project, user, milli, start, end, charged=True)


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
                                source=source))
            s.flush()
        else:
            s.execute(update(BusyChargeRow).where(BusyChargeRow.charge == cid).values(
                measured_ms=BusyChargeRow.measured_ms + ms,
                busy_ms=BusyChargeRow.busy_ms + ms * busy,
                first=min(row.first, a), last=max(row.last, b), source=source))
        add_hourly(s, project, user, milli, a, b, busy=busy)
        done = True
    return done


def prune(s: Session, before: float) -> int:
    """Drop the hourly rollups and per-interval busy figures older than ``before`` (the
    retention, ``usage_history_days``). Returns the number of hourly rows removed."""
    n = s.execute(delete(UsageHourlyRow).where(UsageHourlyRow.hour < int(before) - 3600)
                  ).rowcount or 0
    s.execute(delete(BusyChargeRow).where(BusyChargeRow.last < before))
    return n
