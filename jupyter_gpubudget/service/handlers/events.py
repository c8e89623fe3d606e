"""Usage reported by an external backend (admin tokens only): start / checkpoint / stop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jupyter_gpubudget.core.capacity import CapacityError, Cluster
from jupyter_gpubudget.ledger import LedgerError

from ..base import ApiError, BaseHandler
from ..state import placement_from_list
from ..validate import parse_event

if TYPE_CHECKING:
    from ..app import GpuBudgetService


def occupied_by(svc: GpuBudgetService, placement: list[dict]) -> str | None:
    """Why ``placement`` cannot be held now (a slice already held, by whom), or None: a slice
    is never allocated twice, whoever reports the start."""
    state, _ = svc.loop.build_state(svc.clock())
    cluster = Cluster(state.inventory)
    for w in state.running:
        if w.placement is not None:
            try:
                cluster.allocate(w.id, w.placement)
            except CapacityError:
                continue  # already inconsistent: reported by the cycle
    try:
        cluster.allocate("reported-start", placement_from_list(placement))
    except CapacityError as e:
        return f"{e}; the slice is held by running work"
    except TypeError as e:
        return f"not a placement ({e})"
    return None


class UsageEventsHandler(BaseHandler):
    async def post(self) -> None:
        c = await self.caller()
        c.require_admin()
        ev = parse_event(self.body())
        led = self.svc.ledger
        if ev["event"] == "start":
            if ev["project"] not in self.tree or not self.tree.is_project(ev["project"]):
                raise ApiError(400, f"project: no project {ev['project']!r}", "project")
            self.svc.check_placement(ev["placement"])

        def apply(s):  # noqa: ANN001, ANN202
            wid, at = ev["workload"], ev["at"]
            if ev["event"] == "start":
                if led.get(wid, s=s) is not None:
                    raise LedgerError(409, f"workload {wid} already exists")
                held = occupied_by(self.svc, ev["placement"])
                if held:
                    raise LedgerError(409, f"placement: {held}", "placement")
                led.submit(project=ev["project"], user=ev["user"], kind=ev["kind"], now=at,
                           request={"kind": "gpu", "gpus": 0}, backend="external",
                           workload_id=wid, s=s)
                led.start(wid, placement=ev["placement"], milli=ev["milli"], backed=False,
                          protected_until=None, now=at, actor=c.name, s=s)
            else:
                row = led.get(wid, s=s)
                if row is None or row.backend != "external":
                    raise LedgerError(404, f"no external workload {wid!r}")
                if row.state != "running":
                    raise LedgerError(409, f"workload {wid} is {row.state}")
                if ev["event"] == "checkpoint":
                    led.checkpoint(at, [wid], s=s)
                else:
                    led.stop(wid, now=at, state="done", closed_by="stop", actor=c.name, s=s)
            return 200, {"workload": wid, "event": ev["event"], "at": at}

        def once(s):  # noqa: ANN001, ANN202
            with led.tx() as s:
                return apply(s)

        key = self.idem_key(c)
        if key is None:
            status, body = await self.db(once, None)
        else:
            status, body = await self.db(self.idempotent, key, apply, self.svc.clock())
        self.svc.kick()
        self.send(body, status)


API_ROUTES = [("/usage/events", UsageEventsHandler)]
