"""Hourly usage per project, kept as charge intervals close (see ``UsageRollupRow``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sqlalchemy import select
from sqlalchemy.orm import Session

from .models import UsageHourlyRow, UsageRollupRow

HOUR = 3600.0


def split_by_hour(milli: float, start: float, end: float) -> Iterator[tuple[float, float, float]]:
    """(hour, milli-GPU-seconds, end within that hour) for an interval, hour by hour."""
    t = start
    while t < end:
        hour = (t // HOUR) * HOUR
        stop = min(end, hour + HOUR)
        yield hour, milli * (stop - t), stop
        t = stop


def add(s: Session, project: str, milli: float, start: float, end: float) -> None:
    """Add a closed interval's usage to the project's hourly buckets (in the caller's
    transaction, so it happens exactly when the interval closes)."""
    if end <= start or milli <= 0:
        return
    dialect = s.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    for hour, gpu_ms, stop in split_by_hour(milli, start, end):
        stmt = insert(UsageRollupRow).values(project=project, hour=hour, gpu_ms=gpu_ms,
                                             last_end=stop)
        t = UsageRollupRow.__table__.c
        s.execute(stmt.on_conflict_do_update(
            index_elements=["project", "hour"],
            set_={"gpu_ms": t.gpu_ms + stmt.excluded.gpu_ms,
                  "last_end": _greatest(dialect, t.last_end, stmt.excluded.last_end)}))


def member_parts(s: Session, since: float) -> dict[tuple[str, int], list[tuple[str, float]]]:
    """Each user's part of the buckets :func:`buckets` reads: per (project, hour), (user,
    charged milli-GPU-seconds), from the reports' hourly rows (``usage_hourly``, added from
    the same closed intervals as the buckets; a booking's charge has no user there)."""
    t = UsageHourlyRow.__table__.c
    out: dict[tuple[str, int], list[tuple[str, float]]] = {}
    for project, hour, user, ms in s.execute(
            select(t.project, t.hour, t.user, t.charged_ms)
            .where(t.hour >= int(since - HOUR), t.charged_ms > 0)
            .order_by(t.hour, t.project, t.user)):
        out.setdefault((project, int(hour)), []).append((user, ms))
    return out


def _greatest(dialect: str, a, b):  # noqa: ANN001, ANN202
    from sqlalchemy import func

    return func.greatest(a, b) if dialect == "postgresql" else func.max(a, b)


def buckets(s: Session, since: float) -> Iterable[tuple[str, float, float, float]]:
    """Buckets that may hold usage after ``since``, oldest first: (project, hour, gpu_ms,
    last_end)."""
    t = UsageRollupRow.__table__.c
    return s.execute(select(t.project, t.hour, t.gpu_ms, t.last_end)
                     .where(t.hour >= since - HOUR).order_by(t.hour, t.project))
