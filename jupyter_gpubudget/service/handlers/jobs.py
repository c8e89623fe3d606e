"""Batch jobs: list, submit, cancel."""

from __future__ import annotations

from ..auth import SCOPE_SUBMIT, Denied
from ..base import ApiError, BaseHandler
from ..state import request_to_dict
from ..validate import check_offered, parse_job
from ..views import workload_json


class JobsHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        states = self.query_states()
        rows = await self.db(lambda: self.svc.ledger.workloads(user=c.name, states=states))
        rows = [r for r in rows if r.kind in ("batch", "debug") and r.backend != "external"]
        now, view = self.svc.clock(), self.svc.loop.view
        self.send({"jobs": [workload_json(r, view, now) for r in rows]})

    async def post(self) -> None:
        c = await self.caller()
        if not (SCOPE_SUBMIT in c.scopes or c.is_admin):
            raise Denied(f"token lacks scope {SCOPE_SUBMIT}")
        job = parse_job(self.body())
        tree = self.tree
        if job["project"] not in tree:
            raise ApiError(400, f"project: no project {job['project']!r}", "project")
        if not tree.is_project(job["project"]):
            raise ApiError(400, f"project: {job['project']!r} is a program; jobs charge a "
                                "project (a leaf account)", "project")
        c.require_submit(tree, job["project"])
        check_offered(self.svc.inventory, job["request"])
        backend = self.svc.backend
        refused = backend.check_user(c.name)
        if refused:
            raise ApiError(403, f"user: {refused}", "user")
        try:
            job["command"] = backend.resolve_command(job["command"])
        except ValueError as e:
            field = getattr(e, "field", "command")
            raise ApiError(400, f"{field}: {getattr(e, 'message', e)}", field) from None
        refused = backend.check_command(job["command"])
        if refused:
            raise ApiError(400, f"command: {refused}", "command")
        now = self.svc.clock()

        def apply(s):  # noqa: ANN001, ANN202
            row = self.svc.ledger.submit(
                project=job["project"], user=c.name, kind=job["kind"], now=now,
                request=request_to_dict(job["request"]), command=job["command"],
                env=job["env"], min_runtime=job["min_runtime"], resumable=job["resumable"],
                time_limit=job["time_limit"], backend=self.svc.backend.name, name=job["name"],
                s=s)
            return 201, workload_json(row, self.svc.loop.view, now)

        key = self.idem_key(c)
        if key is None:
            status, body = await self.db(apply, None)
        else:
            status, body = await self.db(self.idempotent, key, apply, now)
        self.svc.kick()
        self.send(body, status)


class JobHandler(BaseHandler):
    async def delete(self, wid: str) -> None:
        c = await self.caller()
        row = await self.db(self.svc.ledger.get, wid)
        if row is None:
            raise ApiError(404, f"no workload {wid!r}")
        c.require_see_workload(row.user)
        if not (SCOPE_SUBMIT in c.scopes or c.is_admin):
            raise Denied(f"token lacks scope {SCOPE_SUBMIT}")
        if row.backend == "external":
            raise ApiError(409, "this workload is run by an external backend; stop it there")
        row = await self.db(self.svc.loop.cancel, wid, c.name)
        self.svc.kick()
        self.send(workload_json(row, self.svc.loop.view, self.svc.clock()))


API_ROUTES = [
    ("/jobs", JobsHandler),
    (r"/jobs/([^/]+)", JobHandler),
]
