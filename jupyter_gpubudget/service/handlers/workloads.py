"""Workloads of every kind: mine, the ones of mine that ended (with what they cost), one,
the queue, and my notices."""

from __future__ import annotations

from jupyter_gpubudget.ledger.store import TERMINAL

from ..auth import Denied
from ..base import ApiError, BaseHandler
from ..delivery import is_notice, notice_of
from ..notices import server_label
from ..views import workload_json


class MyWorkloadsHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        states = self.query_states()
        rows = await self.db(self.svc.ledger.workloads_of, c.name, states)
        now, view = self.svc.clock(), self.svc.loop.view
        # a predicted start may replay the forecast as far as it needs: off the event loop
        self.send({"user": c.name, "workloads": await self.db(
            lambda: [workload_json(r, view, now) for r in rows])})


class MyEndedHandler(BaseHandler):
    """``GET /workloads/me/ended?limit=5[&user=]``: my most recently ended workloads, newest
    first, each with ``charged_gpu_hours`` (what it cost its project: slice fraction x time
    running, from the ledger's charge intervals) and ``ran_s`` — so a session that was just
    stopped can tell its user what it cost (the hub's home page, the lab's sidebar). Admins
    (BudgetSpawner's token, for the hub's home page) may ask for another ``user``."""

    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        user = self.get_query_argument("user", None) or c.name
        if user != c.name and not c.is_admin:
            raise Denied(f"only gpubudget admins may read another user's work ({user!r})")
        raw = self.get_query_argument("limit", "5")
        if not raw.isdigit() or not 1 <= int(raw) <= 50:
            raise ApiError(400, f"limit: {raw[:20]!r} is not a whole number from 1 to 50",
                           "limit")
        limit = int(raw)

        def read() -> list[dict]:
            rows = [r for r in self.svc.ledger.workloads_of(user, TERMINAL) if r.ended_at]
            rows.sort(key=lambda r: (r.ended_at, r.id), reverse=True)
            out = []
            now, view = self.svc.clock(), self.svc.loop.view
            for r in rows[:limit]:
                w = workload_json(r, view, now)
                end = float(r.ended_at or now)
                w["charged_gpu_hours"] = sum(
                    (ch.milli / 1000) * max(0.0, (end if ch.end is None else ch.end) - ch.start)
                    / 3600 for ch in self.svc.ledger.charges(workload=r.id))
                w["ran_s"] = max(0.0, end - r.started_at) if r.started_at else 0.0
                out.append(w)
            return out

        self.send({"user": user, "workloads": await self.db(read)})


class WorkloadHandler(BaseHandler):
    async def get(self, wid: str) -> None:
        c = await self.caller()
        row = await self.db(self.svc.ledger.get, wid)
        if row is None:
            raise ApiError(404, f"no workload {wid!r}")
        c.require_see_workload(row.user)
        self.send(await self.db(workload_json, row, self.svc.loop.view, self.svc.clock()))


class QueueHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        visible = c.visible_accounts(self.tree)
        view = self.svc.loop.view
        pending = await self.db(lambda: self.svc.ledger.workloads(states=("pending",)))
        rows = {r.id: r for r in pending}
        # each predicted start replays the forecast as far as it needs: off the event loop
        starts = await self.db(lambda: {w: view.reservations.get(w) for w in view.queue
                                        if w in rows})
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
                        "predicted_start": starts.get(wid)})
        self.send({"queue": out, "computed_at": view.at})


class NoticesHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        ledger = self.svc.ledger

        def read() -> list[dict]:
            out = []
            for d, w in ledger.notices_for(c.name):
                if not is_notice(d, w):
                    continue
                n = notice_of(ledger, d, w)
                # ``reason`` carries the words (the sidebar shows it); the ids stay in details
                out.append({"kind": d.kind, "workload": w.id,
                            "name": server_label(w.name, w.user, w.kind), "project": w.project,
                            "at": d.at, "reason": n.body, "title": n.title, "body": n.body,
                            "cause": n.cause, "details": n.details,
                            "decision_reason": d.reason,
                            "requeued": d.kind == "requeue"
                            or bool((d.detail or {}).get("requeued")), "state": w.state})
            from .budget_requests import notices_json  # requests for more budget, answers

            return sorted(out + notices_json(ledger, c.name), key=lambda n: -n["at"])

        self.send({"notices": await self.db(read)})


API_ROUTES = [
    ("/workloads/me", MyWorkloadsHandler),
    ("/workloads/me/ended", MyEndedHandler),
    (r"/workloads/([^/]+)", WorkloadHandler),
    ("/queue", QueueHandler),
    ("/notices", NoticesHandler),
]
