"""The operator's endpoints: nodes and their health (drain / undrain), the account tree with
shares and history, a grant change's preview, queue and running work with why work waits, the
audit log, and an admin's requeue. The pages (``handlers/pages.py``) show the same data."""

from __future__ import annotations

from typing import Any

from ..base import ApiError, BaseHandler
from ..operator import (
    accounts_overview,
    decisions_overview,
    nodes_overview,
    preview,
    queue_overview,
)
from ..timefmt import BadTimeZone, zone
from ..validate import MAX_DB_INT, parse_grant, query_int
from ..views import workload_json


class OperatorHandler(BaseHandler):
    def node_or_404(self, name: str) -> None:
        try:
            self.svc.inventory.node(name)
        except KeyError:
            raise ApiError(404, f"no node {name!r}") from None

    def tz(self) -> Any:
        try:
            return zone(self.get_query_argument("tz", None))
        except BadTimeZone as e:
            raise ApiError(400, f"tz: {e}", "tz") from None


class NodesHandler(OperatorHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        tz = self.tz()
        self.send(await self.db(nodes_overview, self.svc, c, self.svc.clock(), tz))


def parse_health(body: Any) -> tuple[bool, str]:
    if not isinstance(body, dict):
        raise ApiError(400, "body: expected a JSON object", "body")
    unknown = sorted(set(body) - {"healthy", "reason"})
    if unknown:
        raise ApiError(400, f"{unknown[0]}: unknown field (expected healthy, reason)",
                       unknown[0])
    healthy = body.get("healthy")
    if not isinstance(healthy, bool):
        raise ApiError(400, "healthy: expected true (return to service) or false (drain)",
                       "healthy")
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > 500:
        raise ApiError(400, "reason: expected a string of at most 500 characters", "reason")
    reason = " ".join(reason.split())
    if not healthy and not reason:
        raise ApiError(400, "reason: say why the node is drained (it is shown to everyone "
                            "and kept in the audit log)", "reason")
    return healthy, reason or ("repaired" if healthy else "")


class NodeHandler(OperatorHandler):
    async def get(self, name: str) -> None:
        c = await self.caller()
        c.require_read()
        self.node_or_404(name)
        tz = self.tz()
        out = await self.db(nodes_overview, self.svc, c, self.svc.clock(), tz)
        self.send(next(n for n in out["nodes"] if n["name"] == name))


class NodeHealthHandler(OperatorHandler):
    async def put(self, name: str) -> None:
        c = await self.caller()
        self.node_or_404(name)
        c.require_admin()
        healthy, reason = parse_health(self.body())
        tz = self.tz()
        changed = await self.db(self.svc.loop.set_node_health, name, healthy, reason, c.name)
        if changed:
            self.svc.log.warning("node %s %s by %s: %s", name, "returned to service"
                                 if healthy else "marked unhealthy (draining)", c.name, reason)
        self.svc.kick()
        out = await self.db(nodes_overview, self.svc, c, self.svc.clock(), tz)
        node = next(n for n in out["nodes"] if n["name"] == name)
        node["changed"] = changed
        self.send(node)


class TreeHandler(OperatorHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        tz = self.tz()
        self.send(await self.db(accounts_overview, self.svc, c, self.svc.clock(), tz))


class GrantPreviewHandler(OperatorHandler):
    async def post(self, name: str) -> None:
        c = await self.caller()
        self.account_or_404(name)
        c.require_manage(self.tree, name)
        g = parse_grant(self.body())
        self.send(await self.db(preview, self.svc, c, name, g, self.svc.clock()))


class QueueDetailHandler(OperatorHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        tz = self.tz()
        project = self.get_query_argument("project", None) or None
        if project is not None and project not in self.tree:
            raise ApiError(400, f"project: no account {project!r}", "project")
        self.send(await self.db(queue_overview, self.svc, c, self.svc.clock(), tz, project))


class DecisionsHandler(OperatorHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        tz = self.tz()
        q = self.get_query_argument
        kinds = [k for k in (q("kind", "") or "").split(",") if k] or None
        limit = query_int(q("limit", None), "limit", 1, 1000, default=100)
        # a decision's id: a database integer (a longer number is a 400, never a 500)
        before = query_int(q("before", None), "before", 0, MAX_DB_INT)
        text = q("q", None)
        if text is not None and len(text) > 200:
            raise ApiError(400, "q: at most 200 characters", "q")
        self.send(await self.db(
            lambda: decisions_overview(self.svc, c, self.svc.clock(), tz, kinds=kinds,
                                       workload=q("workload", None) or None,
                                       actor=q("actor", None) or None, text=text or None,
                                       before=before, limit=limit)))


class RequeueHandler(OperatorHandler):
    async def post(self, wid: str) -> None:
        c = await self.caller()
        row = await self.db(self.svc.ledger.get, wid)
        if row is None:
            raise ApiError(404, f"no workload {wid!r}")
        c.require_admin()
        row = await self.db(self.svc.loop.requeue, wid, c.name)
        self.svc.kick()
        # its predicted start may replay the forecast as far as it needs: off the event loop
        self.send(await self.db(workload_json, row, self.svc.loop.view, self.svc.clock(),
                                self.tz()))


_NAME = r"([^/]+)"
API_ROUTES = [
    ("/nodes", NodesHandler),
    (f"/nodes/{_NAME}", NodeHandler),
    (f"/nodes/{_NAME}/health", NodeHealthHandler),
    ("/tree", TreeHandler),
    (f"/accounts/{_NAME}/grant/preview", GrantPreviewHandler),
    ("/queue/detail", QueueDetailHandler),
    ("/decisions", DecisionsHandler),
    (f"/workloads/{_NAME}/requeue", RequeueHandler),
]
