"""Advance reservations ("bookings") in the ledger.

A booking is written in one transaction with its ``book`` decision in the audit log, after
the core chose its GPUs among those no other live booking holds in an overlapping window
(:func:`core.reservations.choose_gpus`); bookings are made one at a time in a process (the
service's leader is the only writer), so two cannot take the same GPU. Cancelling keeps
the row (``cancelled_at``) and records an ``unbook`` decision.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterable, Sequence

from sqlalchemy import select

from ..core.inventory import Inventory
from ..core.reservations import Booking, BookingError, choose_gpus
from .models import BookingRow, DecisionRow
from .store import Ledger, LedgerError

_one_at_a_time = threading.Lock()


def gpu_keys(keys: Iterable[tuple[str, int]]) -> list[str]:
    return [f"{node}:{i}" for node, i in keys]


def parse_keys(names: Iterable[str]) -> tuple[tuple[str, int], ...]:
    out = []
    for k in names:
        node, _, i = str(k).rpartition(":")
        out.append((node, int(i)))
    return tuple(out)


def as_core(rows: Iterable[BookingRow]) -> list[Booking]:
    """The core's bookings of ledger rows (cancelled ones left out)."""
    return [Booking(r.id, r.project, r.start_at, r.end_at, parse_keys(r.gpus))
            for r in rows if r.cancelled_at is None]


def bookings(ledger: Ledger, *, ending_after: float | None = None,
             projects: Sequence[str] | None = None, cancelled: bool = False) -> list[BookingRow]:
    """Bookings by start: those whose window ends after ``ending_after`` (None: all), of
    ``projects`` (None: every project), cancelled ones only with ``cancelled``."""
    with ledger.ro() as s:
        q = select(BookingRow)
        if ending_after is not None:
            q = q.where(BookingRow.end_at > ending_after)
        if projects is not None:
            q = q.where(BookingRow.project.in_(list(projects)))
        if not cancelled:
            q = q.where(BookingRow.cancelled_at.is_(None))
        return list(s.scalars(q.order_by(BookingRow.start_at, BookingRow.id)))


def live_bookings(ledger: Ledger, now: float) -> list[Booking]:
    """What a cycle at ``now`` needs: the bookings not yet over, for ``ClusterState``."""
    return as_core(bookings(ledger, ending_after=now))


def book(ledger: Ledger, inventory: Inventory, *, project: str, gpus: int, start: float,
         end: float, by: str, now: float, nodes: Sequence[str] = (),
         gpu_model: str | None = None, cluster: str | None = None, note: str = "") -> BookingRow:
    """Book ``gpus`` whole GPUs for ``project`` over ``[start, end)``; the row. Raises
    :class:`LedgerError` 400 naming the field (nothing written) when it cannot be made."""
    if start < now - 60:
        raise LedgerError(400, "start: the window is in the past", "start")
    with _one_at_a_time, ledger.tx() as s:
        live = as_core(s.scalars(select(BookingRow).where(BookingRow.end_at > start,
                                                          BookingRow.cancelled_at.is_(None))))
        try:
            chosen = choose_gpus(inventory, live, gpus, start, end, nodes=nodes,
                                 gpu_model=gpu_model, cluster=cluster)
        except BookingError as e:
            raise LedgerError(400, str(e), e.field) from None
        row = BookingRow(id=f"bk-{secrets.token_hex(4)}", project=project, cluster=cluster,
                         gpu_count=gpus, gpus=gpu_keys(chosen), start_at=start, end_at=end,
                         note=note, created_by=by, created_at=now)
        s.add(row)
        s.add(DecisionRow(at=now, kind="book", actor=by,
                          reason=f"{gpus} GPUs booked for {project} ({row.id})",
                          detail={"booking": row.id, "project": project, "start": start,
                                  "end": end, "gpus": row.gpus}))
        s.flush()
        s.expunge(row)
        return row


def cancel(ledger: Ledger, booking_id: str, *, by: str, now: float) -> BookingRow | None:
    """Cancel a booking; the row, or None when there is no such live booking."""
    with ledger.tx() as s:
        row = s.get(BookingRow, booking_id, with_for_update=True)
        if row is None or row.cancelled_at is not None:
            return None
        row.cancelled_at, row.cancelled_by = now, by
        s.add(DecisionRow(at=now, kind="unbook", actor=by,
                          reason=f"booking {row.id} of {row.project} cancelled",
                          detail={"booking": row.id, "project": row.project}))
        s.flush()
        s.expunge(row)
        return row


def get(ledger: Ledger, booking_id: str) -> BookingRow | None:
    with ledger.ro() as s:
        return s.get(BookingRow, booking_id)
