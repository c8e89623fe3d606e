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

from sqlalchemy import or_, select

from ..core.booked_slices import BookedMig, from_stored
from ..core.inventory import Inventory
from ..core.reservations import Booking, BookingError, choose_gpus, choose_mig
from . import rollups
from .models import BookingRow, ChargeRow, DecisionRow, DeviceClaimRow, WorkloadRow
from .store import Ledger, LedgerError

#: ``closed_by`` of the charge intervals of a booking's idle part (its GPU-hours booked and
#: held by nobody, times the policy's ``reservation_idle_charge``)
IDLE_CHARGE = "booking_idle"

_one_at_a_time = threading.Lock()


def gpu_keys(keys: Iterable[tuple[str, int]]) -> list[str]:
    return [f"{node}:{i}" for node, i in keys]


def parse_keys(names: Iterable[object]) -> tuple[tuple[str, int], ...]:
    """The whole GPUs of a booking's keys (``node:index``; a MIG instance's entry, a
    mapping, is :func:`parse_mig`'s)."""
    out = []
    for k in names:
        if not isinstance(k, str):
            continue
        node, _, i = str(k).rpartition(":")
        out.append((node, int(i)))
    return tuple(out)


def parse_mig(names: Iterable[object]) -> tuple[BookedMig, ...]:
    """The MIG instances of a booking's keys (``BookedMig.stored``'s mappings)."""
    return tuple(m for k in names if (m := from_stored(k)) is not None)


def key_node(key: object) -> str:
    """The node a booking's key names."""
    m = from_stored(key)
    return m.node if m is not None else str(key).rpartition(":")[0]


def as_core(rows: Iterable[BookingRow]) -> list[Booking]:
    """The core's bookings of ledger rows (cancelled ones left out)."""
    return [Booking(r.id, r.project, r.start_at, r.end_at, parse_keys(r.gpus),
                    parse_mig(r.gpus))
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
         gpu_model: str | None = None, cluster: str | None = None, note: str = "",
         mig_profile: str | None = None) -> BookingRow:
    """Book ``gpus`` whole GPUs (with ``mig_profile``: that many MIG instances of it) for
    ``project`` over ``[start, end)``; the row. Raises :class:`LedgerError` 400 naming the
    field (nothing written) when it cannot be made."""
    if start < now - 60:
        raise LedgerError(400, "start: the window is in the past", "start")
    with _one_at_a_time, ledger.tx() as s:
        live = as_core(s.scalars(select(BookingRow).where(BookingRow.end_at > start,
                                                          BookingRow.cancelled_at.is_(None))))
        try:
            if mig_profile is not None:
                keys: list = [m.stored() for m in choose_mig(inventory, live, mig_profile, gpus, start,
                                                  end, nodes=nodes, cluster=cluster)]
            else:
                keys = gpu_keys(choose_gpus(inventory, live, gpus, start, end, nodes=nodes,
                                            gpu_model=gpu_model, cluster=cluster))
        except BookingError as e:
            field = "gpus" if e.field == "count" else \
                "mig_profile" if e.field == "profile" else e.field
            raise LedgerError(400, field + str(e)[len(e.field):] if str(e).startswith(
                e.field + ":") else str(e), field) from None
        row = BookingRow(id=f"bk-{secrets.token_hex(4)}", project=project, cluster=cluster,
                         gpu_count=gpus, gpus=keys, start_at=start, end_at=end,
                         note=note, created_by=by, created_at=now)
        s.add(row)
        what = f"{mig_profile} MIG instances" if mig_profile else "GPUs"
        s.add(DecisionRow(at=now, kind="book", actor=by,
                          reason=f"{gpus} {what} booked for {project} ({row.id})",
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


def idle_gaps(claims: Iterable[tuple[float, float | None]], start: float,
              end: float) -> list[tuple[float, float]]:
    """The parts of ``[start, end)`` that none of ``claims`` (start, end; None: still
    held) covers, in order."""
    spans = sorted((max(a, start), min(end if b is None else b, end)) for a, b in claims)
    out, t = [], start
    for a, b in spans:
        if b <= a:
            continue
        if a > t:
            out.append((t, a))
        t = max(t, b)
    if t < end:
        out.append((t, end))
    return out


def charge_idle(ledger: Ledger, now: float, fraction: float) -> list[str]:
    """Charge the idle part of every booking whose window is over (or that was cancelled
    inside it: up to its cancellation; one cancelled before its window charges nothing):
    for each booked GPU, each stretch of the window in which nothing held it (no device
    claim of any workload, the booking's project's or another's) becomes a closed charge
    interval of the booking's project at ``fraction`` of a GPU (in thousandths: the policy's
    ``reservation_idle_charge``; 0 charges nothing), ``closed_by`` :data:`IDLE_CHARGE`,
    under a finished workload row of the booking's own id (kind ``booking``, user
    ``booking:<id>``) that also marks the booking as charged. Exact to the second; each
    booking is charged once. Returns the ids of the bookings charged now."""
    milli = round(max(0.0, min(1.0, fraction)) * 1000)
    done: list[str] = []
    due_q = (select(BookingRow).outerjoin(WorkloadRow, WorkloadRow.id == BookingRow.id)
             .where(WorkloadRow.id.is_(None),
                    or_(BookingRow.end_at <= now, BookingRow.cancelled_at.is_not(None)),
                    or_(BookingRow.cancelled_at.is_(None),
                        BookingRow.cancelled_at > BookingRow.start_at))
             .order_by(BookingRow.start_at, BookingRow.id))
    with ledger.ro() as s:  # (most cycles: nothing due, nothing written)
        if s.scalars(due_q.limit(1)).first() is None:
            return done
    with ledger.tx() as s:
        for b in s.scalars(due_q).all():
            end = b.end_at if b.cancelled_at is None else min(b.end_at, b.cancelled_at)
            gaps: list[tuple[float, float, int]] = []  # (from, to, milli-GPU held idle)
            held: list[tuple[str, int, int | None, int]] = [
                (node, gpu, None, 1000) for node, gpu in parse_keys(b.gpus)]
            held += [(m.node, m.gpu, m.start, m.milli) for m in parse_mig(b.gpus)]
            for node, gpu, mig_start, size in held:
                q = select(DeviceClaimRow.start, DeviceClaimRow.end).where(
                    DeviceClaimRow.node == node, DeviceClaimRow.gpu == gpu,
                    DeviceClaimRow.start < end,
                    or_(DeviceClaimRow.end.is_(None), DeviceClaimRow.end > b.start_at))
                if mig_start is not None:  # a MIG instance: the claims of that instance
                    q = q.where(DeviceClaimRow.mig_start == mig_start)
                claims = s.execute(q).all()
                gaps += [(a, e, size) for a, e in
                         idle_gaps([(c.start, c.end) for c in claims], b.start_at, end)]
            idle_h = sum((e - a) * size / 1000 for a, e, size in gaps) / 3600
            charged_h = idle_h * milli / 1000 if all(g[2] == 1000 for g in gaps) else sum(
                (e - a) * round(milli * size / 1000) / 1000 for a, e, size in gaps) / 3600
            user = f"booking:{b.id}"
            s.add(WorkloadRow(
                id=b.id, name=f"idle part of booking {b.id}", project=b.project, user=user,
                kind="booking", state="done", request={"kind": "gpu", "gpus": b.gpu_count},
                command=None, env=None, min_runtime=0.0, resumable=False, time_limit=None,
                backend="booking", submitted_at=b.start_at, preemptions=0, backed=False,
                ended_at=end, reason=f"{idle_h:.4f} booked GPU-hours idle, charged at "
                f"{milli / 1000:g} (policy reservation_idle_charge)"))
            s.flush()
            if milli:
                for seq, (a, e, size) in enumerate(gaps, 1):
                    part = round(milli * size / 1000)
                    s.add(ChargeRow(workload=b.id, seq=seq, project=b.project, user=user,
                                    milli=part, start=a, end=e, checkpoint=e,
                                    closed_by=IDLE_CHARGE))
                    rollups.add(s, b.project, part, a, e)
            s.add(DecisionRow(at=now, kind="booking-charge", actor="scheduler",
                              workload=b.id,
                              reason=f"booking {b.id} of {b.project}: {idle_h:.4f} GPU-hours "
                              f"booked and idle, {charged_h:.4f} charged "
                              f"(reservation_idle_charge {milli / 1000:g})",
                              detail={"booking": b.id, "idle_gpu_hours": round(idle_h, 6),
                                      "charged_gpu_hours": round(charged_h, 6)}))
            done.append(b.id)
    return done
