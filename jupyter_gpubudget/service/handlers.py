"""REST handlers for /api/v1. Order of checks: identity (403), object exists (404),
authority (403), body (400); a refused request changes nothing."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from tornado import web

from jupyter_gpubudget.ledger import LedgerError

from .auth import SCOPE_SUBMIT, Caller, Denied
from .state import request_to_dict
from .validate import Invalid, parse_event, parse_grant, parse_job
from .views import grant_json, workload_json

if TYPE_CHECKING:
    from .app import GpuBudgetService

_STATES = {"pending", "running", "done", "failed", "cancelled", "preempted"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


class BaseHandler(web.RequestHandler):
    svc: GpuBudgetService

    def initialize(self, svc: GpuBudgetService) -> None:
        self.svc = svc
        self.hub_auth = svc.hub_auth

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")

    def check_xsrf_cookie(self) -> None:  # token-authenticated API; HubOAuth guards cookies
        return

    # ---------------------------------------------------------------- errors
    def write_error(self, status_code: int, **kw: Any) -> None:
        exc = kw.get("exc_info", (None, None, None))[1]
        body: dict[str, Any] = {"status": status_code}
        if isinstance(exc, ApiError):
            body["message"] = exc.message
            if exc.field:
                body["field"] = exc.field
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            body["message"] = exc.log_message % exc.args if exc.args else exc.log_message
        else:
            body["message"] = self._reason
        self.finish(json.dumps(body))

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, Denied):
            e = ApiError(403, e.reason)
        elif isinstance(e, Invalid):
            e = ApiError(400, f"{e.field}: {e.message}", e.field)
        elif isinstance(e, LedgerError):
            e = ApiError(e.status, e.message, e.field)
        if isinstance(e, ApiError):
            if self._finished:
                return
            self.clear()
            self.set_status(e.status)
            self.set_default_headers()
            self.write_error(e.status, exc_info=(type(e), e, None))
            return
        super()._handle_request_exception(e)

    # ---------------------------------------------------------------- helpers
    async def caller(self) -> Caller:
        try:
            model = await self.svc.hub_auth.get_user(self, sync=False)
        except web.HTTPError as e:
            if e.status_code < 500:
                raise
            raise ApiError(503, "JupyterHub cannot confirm the token right now; retry") from None
        if not model:
            raise ApiError(403, "missing, invalid or expired token")
        return Caller.from_hub_model(model, self.svc.budgets.admins, self.svc.service_name)

    def body(self) -> Any:
        try:
            return json.loads(self.request.body or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"body: not valid JSON ({e})", "body") from None

    def send(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(obj, allow_nan=False))

    def idem_key(self, caller: Caller) -> str | None:
        key = self.request.headers.get("Idempotency-Key")
        if key is None:
            return None
        if not 1 <= len(key) <= 200:
            raise ApiError(400, "Idempotency-Key: 1..200 characters", "Idempotency-Key")
        return f"{caller.name}:{self.request.path}:{key}"

    @property
    def tree(self):  # noqa: ANN201
        return self.svc.tree()

    def account_or_404(self, name: str) -> None:
        if name not in self.tree:
            raise ApiError(404, f"no account {name!r}")

    def query_states(self) -> tuple[str, ...] | None:
        raw = self.get_query_argument("state", None)
        if raw is None:
            return None
        states = tuple(s for s in raw.split(",") if s)
        bad = [s for s in states if s not in _STATES]
        if bad or not states:
            raise ApiError(400, f"state: unknown state {bad[0] if bad else raw!r} "
                                f"(one of {', '.join(sorted(_STATES))})", "state")
        return states


class IndexHandler(HubOAuthenticated, BaseHandler):
    """The service's root: a browser is sent through JupyterHub's OAuth login, then told who
    it is (the OAuth cookie also authenticates the API afterwards)."""

    @property
    def hub_scopes(self):  # noqa: ANN201 - any identified hub user; authority is per endpoint
        return None

    @property
    def allow_all(self) -> bool:
        return True

    @web.authenticated
    def get(self) -> None:
        user = self.current_user
        self.send({"user": user["name"], "api": self.svc.api_prefix,
                   "openapi": self.svc.api_prefix + "/openapi.json"})


class OAuthCallbackHandler(HubOAuthCallbackHandler):
    """JupyterHub's OAuth callback, bound to the service's HubOAuth (which holds the state)."""

    def initialize(self, svc: GpuBudgetService) -> None:
        self.hub_auth = svc.hub_auth


class NotFoundHandler(BaseHandler):
    def prepare(self) -> None:
        raise ApiError(404, f"no such endpoint {self.request.path}")


class HealthHandler(BaseHandler):
    def get(self) -> None:
        v = self.svc.loop.view
        self.send({"status": "ok", "cycle": v.cycle, "last_cycle_at": v.at,
                   "inventory": self.svc.inventory.source, "version": "v1"})


class OpenAPIHandler(BaseHandler):
    def get(self) -> None:
        from .openapi import openapi_document

        self.send(openapi_document(self.svc.api_prefix))


class AccountsHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        visible = c.visible_accounts(self.tree)
        grants = self.svc.ledger.current_grants()
        self.send({"accounts": [self.svc.account_json(n, grants.get(n))
                                for n in sorted(visible)]})


class AccountHandler(BaseHandler):
    async def get(self, name: str) -> None:
        c = await self.caller()
        self.account_or_404(name)
        c.require_see_account(self.tree, name)
        self.send(self.svc.account_json(name, self.svc.ledger.current_grants().get(name)))


class GrantHistoryHandler(BaseHandler):
    async def get(self, name: str) -> None:
        c = await self.caller()
        self.account_or_404(name)
        c.require_see_account(self.tree, name)
        self.send({"account": name,
                   "versions": [grant_json(g) for g in self.svc.ledger.grant_history(name)]})


class GrantHandler(BaseHandler):
    async def put(self, name: str) -> None:
        c = await self.caller()
        self.account_or_404(name)
        c.require_manage(self.tree, name)
        g = parse_grant(self.body())
        row = self.svc.ledger.set_grant(name, g["grant_hours"], g["share_pct"], by=c.name,
                                        now=self.svc.clock(), note=g["note"])
        self.svc.kick()
        self.send({"account": name, "grant": grant_json(row)})


class UsageHandler(BaseHandler):
    async def get(self, name: str) -> None:
        c = await self.caller()
        self.account_or_404(name)
        c.require_see_account(self.tree, name)
        self.send(self.svc.usage_json(name))


class MyWorkloadsHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        states = self.query_states()
        rows = self.svc.ledger.workloads_of(c.name, states)
        now, view = self.svc.clock(), self.svc.loop.view
        self.send({"user": c.name, "workloads": [workload_json(r, view, now) for r in rows]})


class WorkloadHandler(BaseHandler):
    async def get(self, wid: str) -> None:
        c = await self.caller()
        row = self.svc.ledger.get(wid)
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
        rows = {r.id: r for r in self.svc.ledger.workloads(states=("pending",))}
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


class JobsHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        rows = self.svc.ledger.workloads(user=c.name, kind=None, states=self.query_states())
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
        refused = self.svc.backend.check_command(job["command"])
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
            status, body = apply(None)
        else:
            status, body, _ = self.svc.ledger.idempotent(key, apply, now)
        self.svc.kick()
        self.send(body, status)


class JobHandler(BaseHandler):
    async def delete(self, wid: str) -> None:
        c = await self.caller()
        row = self.svc.ledger.get(wid)
        if row is None:
            raise ApiError(404, f"no workload {wid!r}")
        c.require_see_workload(row.user)
        if not (SCOPE_SUBMIT in c.scopes or c.is_admin):
            raise Denied(f"token lacks scope {SCOPE_SUBMIT}")
        if row.backend == "external":
            raise ApiError(409, "this workload is run by an external backend; stop it there")
        row = await asyncio.get_running_loop().run_in_executor(
            self.svc.worker, self.svc.loop.cancel, wid, c.name)
        self.svc.kick()
        self.send(workload_json(row, self.svc.loop.view, self.svc.clock()))


class NoticesHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        self.send({"notices": [
            {"kind": d.kind, "workload": w.id, "name": w.name, "project": w.project, "at": d.at,
             "reason": d.reason, "requeued": bool((d.detail or {}).get("requeued")),
             "state": w.state}
            for d, w in self.svc.ledger.notices_for(c.name)]})


class UsageEventsHandler(BaseHandler):
    """Usage reported by an external backend (admin tokens only): start / checkpoint / stop."""

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

        key = self.idem_key(c)
        if key is None:
            with led.tx() as s:
                status, body = apply(s)
        else:
            status, body, _ = led.idempotent(key, apply, self.svc.clock())
        self.svc.kick()
        self.send(body, status)


class MetricsHandler(BaseHandler):
    async def get(self) -> None:
        if self.svc.metrics_require_auth:
            c = await self.caller()
            c.require_admin()
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.svc.registry))


def routes(prefix: str, svc: GpuBudgetService) -> list:
    from .sessions import session_routes
    api = prefix.rstrip("/") + "/api/v1"
    kw = {"svc": svc}
    name = r"([^/]+)"  # account names follow the budgets file; unknown ones are a 404
    return [
        (prefix.rstrip("/") + "/?", IndexHandler, kw),
        (api + "/healthz", HealthHandler, kw),
        (api + "/openapi.json", OpenAPIHandler, kw),
        (api + "/accounts", AccountsHandler, kw),
        (api + f"/accounts/{name}", AccountHandler, kw),
        (api + f"/accounts/{name}/grants", GrantHistoryHandler, kw),
        (api + f"/accounts/{name}/grant", GrantHandler, kw),
        (api + f"/accounts/{name}/usage", UsageHandler, kw),
        (api + "/workloads/me", MyWorkloadsHandler, kw),
        (api + f"/workloads/{name}", WorkloadHandler, kw),
        (api + "/queue", QueueHandler, kw),
        (api + "/jobs", JobsHandler, kw),
        (api + f"/jobs/{name}", JobHandler, kw),
        (api + "/notices", NoticesHandler, kw),
        (api + "/usage/events", UsageEventsHandler, kw),
        *session_routes(api, svc),  # interactive sessions (BudgetSpawner), sessions.py
        (prefix.rstrip("/") + "/metrics", MetricsHandler, kw),
        (prefix.rstrip("/") + "/.*", NotFoundHandler, kw),
    ]
