"""Workloads of every kind: mine, one, the queue, and my notices."""

from __future__ import annotations

from ..base import ApiError, BaseHandler
from ..views import workload_json


class MyWorkloadsHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        states = self.query_states()
        rows = await self.db(self.svc.ledger.workloads_of, c.name, states)
        now, view = self.svc.clock(), self.svc.loop.view
        self.send({"user": c.name, "workloads": [workload_json(r, view, now) for r in rows]})


class WorkloadHandler(BaseHandler):
    async def get(self, wid: str) -> None:
        c = await self.caller()
        row = await self.db(self.svc.ledger.get, wid)
        if row is None:
            raise ApiError(404, f"no workload {wid!r}")
        c.require_see_workload(row.user)
        self.send(workload_json(row, self.svc.loop.view, self.svc.clock()))


class QueueHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        visible = c.visible_accounts(self.tree)
        view = self.svc.loop.view
        pending = await self.db(lambda: self.svc.ledger.workloads(states=("pending",)))
        rows = {r.id: r for r in pending}
        out = []
        for pos, wid in enumerate(view.queue, 1):
            r = rows.get(wid)
            if r is None:
                continue
            mine = c.is_admin or r.user == c.name
            out.append({"position": pos, "id": r.id if mine else None,
                        "user": r.user if mine else None,
                        "project": r.project if (mine or r.project in visible) else None,
                        "kind": r.kind, "request": r.request,
                        "submitted_at": r.submitted_at,
                        "predicted_start": view.reservations.get(wid)})
        self.send({"queue": out, "computed_at": view.at})


class NoticesHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        notices = await self.db(self.svc.ledger.notices_for, c.name)
        self.send({"notices": [
            {"kind": d.kind, "workload": w.id, "name": w.name, "project": w.project, "at": d.at,
             "reason": d.reason, "requeued": d.kind == "requeue"
             or bool((d.detail or {}).get("requeued")),
             "state": w.state}
            for d, w in notices]})


API_ROUTES = [
    ("/workloads/me", MyWorkloadsHandler),
    (r"/workloads/([^/]+)", WorkloadHandler),
    ("/queue", QueueHandler),
    ("/notices", NoticesHandler),
]
