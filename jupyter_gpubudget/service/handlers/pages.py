"""The admin's and manager's pages at the service's root (``/services/gpubudget/``): Accounts,
Queue and running, Nodes, Decisions, and Audit (admins and managers only). Server-rendered
(Jinja2, ``service/templates``) with a little JavaScript (``service/static``), styled with the
hub's own CSS (Bootstrap, served by the hub at ``/hub/static/``), behind JupyterHub's OAuth
login (cookie). Every change the pages make goes through the REST API with JupyterHub's XSRF
token (``X-XSRFToken``); a dialog closes once its change is accepted and the page's content is
refreshed in place (no reload).

What a page shows is what the API answers (``service/operator.py`` builds both), limited to
what the caller may see: admins everything, managers the accounts they manage, everyone else
their own projects, read-only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.services.auth import HubOAuthenticated
from tornado import web

from .. import member_limits
from ..audit import (
    GROUP_WORDS,
    BadFilter,
    audit_overview,
    audit_scope,
    may_audit,
    parse_filters,
)
from ..auth import Caller
from ..base import ApiError, BaseHandler, check_path_escapes
from ..operator import (
    KIND_WORDS,
    accounts_overview,
    decisions_overview,
    nodes_overview,
    queue_overview,
)
from ..timefmt import BadTimeZone, duration_text, zone
from ..validate import MAX_DB_INT, Invalid, query_int

if TYPE_CHECKING:
    from ..app import GpuBudgetService

HERE = Path(__file__).resolve().parent.parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"

PAGES = [("accounts", "Accounts"), ("queue", "Queue and running"), ("nodes", "Nodes"),
         ("decisions", "Decisions"), ("reports", "Reports"),
         ("reservations", "Reservations"), ("requests", "Budget requests"),
         ("audit", "Audit")]
#: pages only admins and account managers get (the others would only say "not allowed")
AUDITORS_ONLY = {"audit"}

WHY_WORDS = {"starts": ("starting", "success"), "reserved": ("GPUs reserved for it", "info"),
             "reservation": ("blocked by a reservation", "warning"),
             "unbacked": ("unbacked", "secondary"), "capacity": ("blocked by capacity",
                                                                  "warning"),
             "draining": ("nodes out of service", "danger"),
             "unknown-project": ("unknown project", "danger"),
             "off-peak": ("waiting for the off-peak window", "info")}


def hours(x: float | None) -> str:
    """GPU-hours for people: one decimal below 100, none above ('12.5', '1,200')."""
    if x is None:
        return "—"
    return f"{x:,.1f}" if abs(x) < 100 else f"{x:,.0f}"


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)),
                      autoescape=select_autoescape(["html"]), trim_blocks=True,
                      lstrip_blocks=True)
    env.filters["hours"] = hours
    env.filters["pct"] = lambda x: "—" if x is None else f"{100 * x:.0f} %"
    env.filters["duration"] = duration_text
    env.globals["why_words"] = WHY_WORDS
    env.globals["kind_words"] = KIND_WORDS
    return env


ENV = _env()


class PageHandler(HubOAuthenticated, BaseHandler):
    """A page for any user the hub identifies; what it shows depends on the caller."""

    page = "accounts"
    title = "Accounts"

    @property
    def hub_scopes(self):  # noqa: ANN201 - any identified hub user; authority is per endpoint
        return None

    @property
    def allow_all(self) -> bool:
        return True

    async def prepare(self) -> None:
        """Identify the caller without blocking the event loop (the mixin's own
        ``get_current_user`` would ask the hub synchronously on a cache miss)."""
        check_path_escapes(self.request.path)
        if not hasattr(self, "_hub_auth_user_cache"):
            try:
                model = await self.svc.hub_auth.get_user(self, sync=False)
            except web.HTTPError as e:
                if e.status_code < 500:
                    raise
                raise ApiError(503, "JupyterHub cannot confirm your login right now; "
                                    "reload the page in a moment") from None
            self._hub_auth_user_cache = self.check_hub_user(model) if model else None
        if self.get_argument("gb-renew-xsrf", None) is not None:
            # gpubudget.js renewing a stale XSRF token (a page view in a hidden frame): an
            # empty page, never a redirect to the hub's login (which may not be framed)
            if self._hub_auth_user_cache:
                self.xsrf_token  # noqa: B018 - sets the _xsrf cookie of this login
            self.finish("")

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("Content-Security-Policy", "frame-ancestors 'self'")
        self.set_header("X-Content-Type-Options", "nosniff")

    def write_error(self, status_code: int, **kw: Any) -> None:
        exc = kw.get("exc_info", (None, None, None))[1]
        msg = exc.message if isinstance(exc, ApiError) else self._reason
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.finish(ENV.get_template("error.html").render(
            status=status_code, message=msg, **self.frame(None)))

    def caller_now(self) -> Caller:
        return Caller.from_hub_model(self.current_user, self.svc.service_name)

    def frame(self, c: Caller | None) -> dict[str, Any]:
        """What every page's frame needs: the hub's URLs, the page list, the user."""
        base = os.environ.get("JUPYTERHUB_BASE_URL", "/")
        if not base.endswith("/"):
            base += "/"
        prefix = self.svc.service_prefix.rstrip("/") + "/"
        view = self.svc.loop.view
        repair = sorted(n for n, info in view.nodes.items()
                        if info.get("state") == "ready_for_repair")
        auditor = bool(c and may_audit(c, self.svc.tree()))
        pages = [p for p in PAGES if auditor or p[0] not in AUDITORS_ONLY]
        return {"hub": base + "hub/", "hub_static": base + "hub/static/", "prefix": prefix,
                "static": prefix + "static/", "pages": pages, "page": self.page,
                "title": self.title, "user": c.name if c else None,
                "is_admin": bool(c and c.is_admin),
                "repair": repair if (c and c.is_admin) else [],
                "boot": {"user": c.name if c else None, "api": self.svc.api_prefix,
                         "is_admin": bool(c and c.is_admin), "page": self.page,
                         "prefix": prefix}}

    def render_page(self, template: str, c: Caller, **data: Any) -> None:
        # JupyterHub's XSRF token (the _xsrf cookie) is made for this login when a page is
        # viewed and the one the browser holds is not this login's (a tab kept across a
        # browser restart, a login in another tab): asking for it here renews the cookie, so
        # a page's changes (gpubudget.js, which views the page again to renew it) are not
        # refused as if the user had logged out
        self.xsrf_token  # noqa: B018
        self.finish(ENV.get_template(template).render(**self.frame(c), **data))

    async def data(self, c: Caller) -> dict[str, Any]:
        raise NotImplementedError

    @web.authenticated
    async def get(self) -> None:
        c = self.caller_now()
        c.require_read()
        self.render_page(f"{self.page}.html", c, **await self.data(c))


class IndexHandler(PageHandler):
    """The service's root: the Accounts page for a browser; for a program (no ``text/html``
    in ``Accept``) who it is and where the API is, as JSON."""

    @web.authenticated
    async def get(self) -> None:
        if "text/html" not in self.request.headers.get("Accept", ""):
            self.set_header("Content-Type", "application/json")
            user = self.current_user
            self.finish(json.dumps({"user": user["name"], "api": self.svc.api_prefix,
                                    "openapi": self.svc.api_prefix + "/openapi.json"}))
            return
        await super().get()

    async def data(self, c: Caller) -> dict[str, Any]:
        data = await self.db(accounts_overview, self.svc, c, self.svc.clock())
        tree = await self.db(member_limits.with_ledger_limits, self.tree, self.svc.ledger)
        quoter = self.svc.loop.view.quoter
        limits = member_limits.overview(tree, c.name, c.is_admin,
                                        quoter.sched if quoter is not None else None)
        return {"data": data, "limits": limits, "api": self.svc.api_prefix}


class AccountsPage(IndexHandler):
    pass


class QueuePage(PageHandler):
    page, title = "queue", "Queue and running"

    async def data(self, c: Caller) -> dict[str, Any]:
        project = self.get_query_argument("project", None) or None
        if project is not None and project not in self.tree:
            raise ApiError(400, f"no project {project!r}")
        return {"data": await self.db(queue_overview, self.svc, c, self.svc.clock(), None,
                                      project)}


class NodesPage(PageHandler):
    page, title = "nodes", "Nodes"

    async def data(self, c: Caller) -> dict[str, Any]:
        return {"data": await self.db(nodes_overview, self.svc, c, self.svc.clock())}


class DecisionsPage(PageHandler):
    page, title = "decisions", "Decisions"

    async def data(self, c: Caller) -> dict[str, Any]:
        q = self.get_query_argument
        kind = q("kind", "") or ""
        filters = {"kind": kind, "workload": q("workload", "") or "",
                   "actor": q("actor", "") or "", "q": (q("q", "") or "")[:200]}
        try:
            before = query_int(q("before", None), "before", 0, MAX_DB_INT)
        except Invalid as e:
            raise ApiError(400, f"{e.field}: {e.message}") from None
        data = await self.db(lambda: decisions_overview(
            self.svc, c, self.svc.clock(), None, kinds=[kind] if kind else None,
            workload=filters["workload"] or None, actor=filters["actor"] or None,
            text=filters["q"] or None, before=before, limit=100))
        older = None
        if data["next_before"]:
            older = "?" + urlencode({**{k: v for k, v in filters.items() if v},
                                     "before": data["next_before"]})
        return {"data": data, "filters": filters, "older": older}


class AuditPage(PageHandler):
    """Who changed grants, drained nodes, cancelled, preempted or requeued work: when and
    why, filtered by account, time and kind, with a CSV download (``service/audit.py``).
    A bad filter is shown above the form (the form keeps what was typed)."""

    page, title = "audit", "Audit"

    async def data(self, c: Caller) -> dict[str, Any]:
        scope = audit_scope(c, self.tree)
        q = self.get_query_argument
        raw = {k: (q(k, "") or "")[:200] for k in ("account", "since", "until", "what", "tz")}
        try:
            tz = zone(raw["tz"] or None)
        except BadTimeZone:
            tz = None
        try:
            before = query_int(q("before", None), "before", 0, MAX_DB_INT)
        except Invalid:
            before = None
        error = None
        try:
            f = parse_filters(lambda k: raw.get(k) or None, self.tree, scope, tz)
        except BadFilter as e:
            error, f = e.message, None
        if f is None:
            data = {"entries": [], "next_before": None, "is_admin": c.is_admin,
                    "accounts": sorted(self.tree.accounts) if scope is None else sorted(scope)}
        else:
            data = await self.db(lambda: audit_overview(self.svc, c, scope, f,
                                                        self.svc.clock(), tz, before, 100))
        kept = {k: v for k, v in raw.items() if v}
        older = ("?" + urlencode({**kept, "before": data["next_before"]})
                 if data["next_before"] else None)
        return {"data": data, "filters": raw, "error": error, "older": older,
                "csv": self.svc.api_prefix + "/audit?" + urlencode({**kept, "format": "csv"}),
                "groups": GROUP_WORDS}


class ReportsPage(PageHandler):
    """Where the GPU-hours went over a day, week, month or chosen dates: charged against busy
    per project over time, a bar per user, the sessions that held GPUs idle longest, and the
    CSV. The page draws its pictures (inline SVG, ``static/gpubudget-reports.js``) from
    ``GET /reports`` in the browser's time zone; the API decides what the caller may see
    (admins everything, managers their subtree, researchers their projects and own line)."""

    page, title = "reports", "Reports"

    async def data(self, c: Caller) -> dict[str, Any]:
        tree = self.tree
        names = list(tree.accounts)  # the budgets file's order: parents before children
        if c.is_admin:
            offered = names
        else:
            mine = set(tree.projects_of(c.name))
            offered = [a for a in names if tree.can_manage(c.name, a)
                       or a in mine or any(a in tree.path(p) for p in mine)]
        depth = {a: len(tree.path(a)) - 1 for a in offered}
        return {"accounts": [(a, depth[a], tree.is_project(a)) for a in offered],
                "reports_api": self.svc.api_prefix + "/reports"}


class StaticHandler(web.StaticFileHandler):
    """The pages' own script and style (everything else comes from the hub)."""

    def initialize(self, svc: GpuBudgetService) -> None:  # type: ignore[override]
        super().initialize(path=str(STATIC))

    def set_extra_headers(self, path: str) -> None:
        self.set_header("X-Content-Type-Options", "nosniff")


ROOT_ROUTES = [("/?", IndexHandler), ("/accounts", AccountsPage), ("/queue", QueuePage),
               ("/nodes", NodesPage), ("/decisions", DecisionsPage), ("/reports", ReportsPage),
               ("/audit", AuditPage),
               (r"/static/(.*)", StaticHandler)]
API_ROUTES: list = []
