"""Advance reservations ("bookings"): list, book, cancel.

Admins book for any project, managers for the projects below the accounts they manage (the
``manage`` scope); everyone who may read sees the bookings of their projects (members) and
of the accounts they manage. Bad input is a 400 naming the field, with nothing booked."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from ...core.booked_slices import from_stored
from ...ledger import bookings as store
from ...ledger.models import BookingRow
from ..auth import SCOPE_MANAGE, SCOPE_READ, Caller, Denied, needs_scope
from ..base import ApiError, BaseHandler
from .pages import PageHandler

FIELDS = {"project", "gpus", "start", "end", "nodes", "gpu_model", "cluster", "note",
          "mig_profile"}
#: epoch seconds accepted (years 2000 to 2200): a bigger number is a mistake, not a time
MIN_TIME, MAX_TIME = 946684800.0, 7258118400.0


def mig_profile_of(r: BookingRow) -> str | None:
    """The MIG profile a booking holds instances of; None for whole GPUs."""
    first = from_stored(r.gpus[0]) if r.gpus else None
    return first.profile if first is not None else None


def booking_json(r: BookingRow, now: float) -> dict[str, Any]:
    state = ("cancelled" if r.cancelled_at is not None else "ended" if r.end_at <= now
             else "active" if r.start_at <= now else "booked")
    return {"id": r.id, "project": r.project, "cluster": r.cluster, "gpus": r.gpu_count,
            "mig_profile": mig_profile_of(r),
            "devices": list(r.gpus), "nodes": sorted({store.key_node(k) for k in r.gpus}),
            "start": r.start_at, "end": r.end_at, "note": r.note, "state": state,
            "created_by": r.created_by, "created_at": r.created_at,
            "cancelled_at": r.cancelled_at, "cancelled_by": r.cancelled_by}


def parse_time(name: str, value: Any) -> float:
    """Epoch seconds, or an ISO 8601 time with its offset (``2026-12-07T10:00+01:00``)."""
    if isinstance(value, bool):
        raise ApiError(400, f"{name}: a time (epoch seconds or ISO 8601), got {value!r}", name)
    if isinstance(value, (int, float)):
        t = float(value)
    elif isinstance(value, str) and len(value) <= 40:
        try:
            d = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ApiError(400, f"{name}: not an ISO 8601 time: {value!r}", name) from None
        if d.tzinfo is None:
            raise ApiError(400, f"{name}: give the time's offset or zone ({value!r} + "
                                "'+01:00' or 'Z')", name)
        t = d.timestamp()
    else:
        raise ApiError(400, f"{name}: a time (epoch seconds or ISO 8601)", name)
    if not (math.isfinite(t) and MIN_TIME <= t <= MAX_TIME):
        raise ApiError(400, f"{name}: out of range", name)
    return t


def parse_booking(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "body: a JSON object", "body")
    extra = sorted(set(body) - FIELDS)
    if extra:
        raise ApiError(400, f"{extra[0]}: unknown field (known: {', '.join(sorted(FIELDS))})",
                       extra[0])
    for key in ("project", "gpus", "start", "end"):
        if key not in body:
            raise ApiError(400, f"{key}: required", key)
    project = body["project"]
    if not isinstance(project, str) or not project:
        raise ApiError(400, "project: a project's name", "project")
    gpus = body["gpus"]
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 100_000:
        raise ApiError(400, f"gpus: a whole number from 1 to 100000, got {gpus!r}", "gpus")
    nodes = body.get("nodes") or []
    if not (isinstance(nodes, list) and len(nodes) <= 1000
            and all(isinstance(n, str) and n for n in nodes)):
        raise ApiError(400, "nodes: a list of node names", "nodes")
    out: dict[str, Any] = {"project": project, "gpus": gpus, "nodes": nodes,
                           "start": parse_time("start", body["start"]),
                           "end": parse_time("end", body["end"])}
    for key in ("gpu_model", "cluster", "note", "mig_profile"):
        v = body.get(key)
        if v is not None and not (isinstance(v, str) and len(v) <= 1000):
            raise ApiError(400, f"{key}: a string", key)
        out[key] = v
    out["note"] = out["note"] or ""
    if out["mig_profile"] is not None and out["gpu_model"] is not None:
        raise ApiError(400, "gpu_model: not with mig_profile (a profile names its GPU's "
                       "memory already)", "gpu_model")
    return out


def may_book(c: Caller, tree: Any, project: str, gpus: int = 0, limit: int = 0) -> None:
    """Admins book for any project; managers for projects below an account they manage, at
    most ``limit`` GPUs a booking (the policy's ``manager_booking_limit``; 0: not at all)."""
    if c.is_admin:
        return
    c.require_scope(SCOPE_MANAGE)
    if not tree.can_manage(c.name, project):
        raise Denied(f"user {c.name!r} neither is an admin nor manages {project!r}: "
                     "only they book its GPUs")
    if gpus > limit:
        raise Denied(f"gpus: a manager books at most {limit} GPUs at a time (the budgets "
                     f"file's policy manager_booking_limit); {gpus} asked — an admin may book "
                     "more")


class ReservationsHandler(BaseHandler):
    @needs_scope(SCOPE_READ)
    async def get(self) -> None:
        c = await self.caller()
        now = self.svc.clock()
        everything = self.get_query_argument("all", "") in ("1", "true")
        rows = await self.db(lambda: store.bookings(
            self.svc.ledger, ending_after=None if everything else now, cancelled=everything))
        seen = c.visible_accounts(self.tree)
        self.send({"reservations": [booking_json(r, now) for r in rows
                                    if c.is_admin or r.project in seen]})

    @needs_scope(SCOPE_MANAGE)
    async def post(self) -> None:
        c = await self.caller()
        spec = parse_booking(self.body())
        tree = self.tree
        if spec["project"] not in tree or not tree.is_project(spec["project"]):
            raise ApiError(400, f"project: no project {spec['project']!r}", "project")
        may_book(c, tree, spec["project"], spec["gpus"], self.svc.policy().manager_booking_limit)
        now = self.svc.clock()
        row = await self.db(lambda: store.book(
            self.svc.ledger, self.svc.inventory, project=spec["project"], gpus=spec["gpus"],
            start=spec["start"], end=spec["end"], by=c.name, now=now, nodes=spec["nodes"],
            gpu_model=spec["gpu_model"], cluster=spec["cluster"], note=spec["note"],
            mig_profile=spec["mig_profile"]))
        self.send(booking_json(row, now), 201)


class ReservationHandler(BaseHandler):
    @needs_scope(SCOPE_READ)
    async def get(self, bid: str) -> None:
        c = await self.caller()
        row = await self.db(lambda: store.get(self.svc.ledger, bid))
        if row is None:
            raise ApiError(404, f"no reservation {bid!r}")
        c.require_see_account(self.tree, row.project)
        self.send(booking_json(row, self.svc.clock()))

    @needs_scope(SCOPE_MANAGE)
    async def delete(self, bid: str) -> None:
        c = await self.caller()
        row = await self.db(lambda: store.get(self.svc.ledger, bid))
        if row is None or row.cancelled_at is not None:
            raise ApiError(404, f"no reservation {bid!r} (or it was cancelled)")
        may_book(c, self.tree, row.project)
        now = self.svc.clock()
        done = await self.db(lambda: store.cancel(self.svc.ledger, bid, by=c.name, now=now))
        if done is None:
            raise ApiError(404, f"no reservation {bid!r} (or it was cancelled)")
        self.send(booking_json(done, now))


API_ROUTES = [
    (r"/reservations", ReservationsHandler),
    (r"/reservations/([A-Za-z0-9_.-]{1,64})", ReservationHandler),
]


class ReservationsPage(PageHandler):
    """Bookings not yet over, in the viewer's local time (the zone said once below the page),
    with a form to book (admins for any project, managers for theirs) and Cancel; members
    see their projects' bookings read-only. Changes go through the REST API
    (``static/gpubudget-reservations.js``)."""

    page, title = "reservations", "Reservations"

    async def data(self, c: Caller) -> dict[str, Any]:
        tree, now = self.tree, self.svc.clock()
        rows = await self.db(lambda: store.bookings(self.svc.ledger, ending_after=now))
        seen = c.visible_accounts(tree)
        items = [dict(booking_json(r, now), may_cancel=c.is_admin or (
            SCOPE_MANAGE in c.scopes and tree.can_manage(c.name, r.project)))
            for r in rows if c.is_admin or r.project in seen]
        bookable = [p for p in tree.accounts if tree.is_project(p) and (
            c.is_admin or (SCOPE_MANAGE in c.scopes and tree.can_manage(c.name, p)))]
        return {"items": items, "bookable": bookable, "api": self.svc.api_prefix,
                "gpus": self.svc.inventory.gpu_count,
                "nodes": [n.name for n in self.svc.inventory.nodes]}


ROOT_ROUTES = [("/reservations", ReservationsPage)]
