"""Hub-side HTTP handlers of BudgetSpawner: the spawn form's live quote, and what the user's
recently ended sessions cost (the hub's home page says it after a stop).

The spawn form's page has only the hub's login cookie, never a token for the gpubudget service.
``QuoteHandler`` (``GET /hub/api/gpubudget/users/{name}/quote``) is a JupyterHub API handler:
it authenticates the browser as the logged-in user (cookie + the hub's XSRF token, always: also
where JupyterHub itself would let a page-view GET pass without one) or a token, requires the
``servers`` scope for that user (the same right as starting the server), and asks the service
for *one* quote with the user's own spawner, whose token stays in the hub.

Register them in ``jupyterhub_config.py``::

    from jupyter_gpubudget.hub.handlers import register_handlers
    register_handlers()

(they join JupyterHub's own API handlers, which every hub loads: ``c.JupyterHub.extra_handlers
= extra_handlers()`` does the same, but JupyterHub logs a deprecation warning for it at every
start. Without them the form works, but its quote is the one computed when the page was
rendered.)

``EndedHandler`` (``GET /hub/api/gpubudget/users/{name}/ended``) is authenticated the same way
(``read:servers`` for the user) and answers the service's ``/workloads/me/ended`` for that user:
their last ended sessions and jobs with what each cost and to which project.

``HistoryHandler`` (``GET /hub/api/gpubudget/users/{name}/history``), authenticated the same way,
answers each of the user's servers' history across preemptions and restores — its session's
segments, where each ran, how and why it ended and what it cost (the service's
``/sessions/{id}/history``, which the lab's sidebar reads too) — and the same for the user's last
ended session: ``{"servers": [{"server": "", "session": …, "history": {…}}, …], "last": …}``.
Only the user's own sessions are asked for: those the hub's spawners hold, and the last one the
service says the user ended.
"""

from __future__ import annotations

import hmac
import json
from urllib.parse import quote

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import needs_scope
from jupyterhub.utils import url_path_join
from tornado import web

from jupyter_gpubudget.service.validate import Invalid, quote_slice

from .client import ServiceError

#: under the hub's prefix (``/hub/``); the group is the user's name
QUOTE_ROUTE = r"/api/gpubudget/users/([^/]+)/quote"
ENDED_ROUTE = r"/api/gpubudget/users/([^/]+)/ended"
HISTORY_ROUTE = r"/api/gpubudget/users/([^/]+)/history"


class _Base(APIHandler):
    def check_xsrf_always(self) -> None:
        """JupyterHub skips the XSRF check for cookie-authenticated GETs that look like page
        views (``Sec-Fetch-Mode: navigate`` or none); this endpoint is only ever fetched by
        the form's script, which sends the token, so it always wants it."""
        if getattr(self, "_token_authenticated", False):
            return
        sent = self.request.headers.get("X-XSRFToken") or self.get_argument("_xsrf", "")
        if not sent or not hmac.compare_digest(sent.encode(), self.xsrf_token):
            raise web.HTTPError(403, "the hub's XSRF token is missing or wrong (X-XSRFToken)")


def service_error(e: ServiceError) -> web.HTTPError:
    """The service's refusal as the hub's answer (its own status; 503 for its failures)."""
    return web.HTTPError(e.status if e.status < 500 else 503,
                         e.message.removeprefix("gpubudget service: "))


def default_spawner(handler: _Base, user_name: str):  # noqa: ANN201
    """``(user, the default server's spawner)`` of a user whose servers BudgetSpawner starts
    (the spawner is made if the server never started); 404 otherwise."""
    user = handler.find_user(user_name)
    if user is None:
        raise web.HTTPError(404, f"no user {user_name!r}")
    spawner = user.spawners[""]
    if not callable(getattr(spawner, "api", None)):
        raise web.HTTPError(404, "this server is not started by BudgetSpawner")
    return user, spawner


class QuoteHandler(_Base):
    """One quote for the project, slice and minimum runtime the form has selected."""

    @needs_scope("servers")
    async def get(self, user_name: str) -> None:
        self.check_xsrf_always()
        user = self.find_user(user_name)
        if user is None:
            raise web.HTTPError(404, f"no user {user_name!r}")
        server = self.get_argument("server", "")
        if server not in user.orm_user.orm_spawners:
            raise web.HTTPError(404, f"{user_name} has no server named {server!r}")
        spawner = user.spawners[server]
        if not callable(getattr(spawner, "quote", None)) or not hasattr(spawner, "offer"):
            raise web.HTTPError(404, "this server is not started by BudgetSpawner")
        args = {}
        for k in self.request.query_arguments:
            if k in ("server", "_xsrf"):
                continue
            v = self.get_argument(k)
            if len(v) > 200:
                raise web.HTTPError(400, f"{k}: at most 200 characters")
            args[k] = v
        try:  # a misspelt or unknown argument is refused, never read as a CPU slice
            key = quote_slice(args)
        except Invalid as e:
            raise web.HTTPError(400, f"{e.field}: {e.message}") from None
        try:
            answer = await spawner.quote(args.get("project", ""), key,
                                         args.get("min_runtime", "1h"),
                                         args.get("cluster", ""))
        except ServiceError as e:
            raise service_error(e) from None
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(answer))


class EndedHandler(_Base):
    """The user's last ended sessions and jobs, each with ``charged_gpu_hours``."""

    @needs_scope("read:servers")
    async def get(self, user_name: str) -> None:
        self.check_xsrf_always()
        user, spawner = default_spawner(self, user_name)
        limit = self.get_argument("limit", "3")
        try:
            answer = await spawner.api(
                "GET", f"/workloads/me/ended?user={quote(user.name, safe='')}"
                       f"&limit={quote(limit, safe='')}")
        except ServiceError as e:
            raise service_error(e) from None
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(answer))


class HistoryHandler(_Base):
    """Each server's history across preemptions, and the last ended session's."""

    @needs_scope("read:servers")
    async def get(self, user_name: str) -> None:
        self.check_xsrf_always()
        user, default = default_spawner(self, user_name)
        servers = []
        try:
            for name in sorted(user.orm_user.orm_spawners):
                sid = getattr(user.spawners[name], "session_id", "")
                if sid:
                    h = await default.api("GET", f"/sessions/{quote(sid, safe='')}/history")
                    servers.append({"server": name, "session": sid, "history": h})
            ended = await default.api(
                "GET", f"/workloads/me/ended?user={quote(user.name, safe='')}&limit=5")
            last = next((w for w in ended.get("workloads") or []
                         if w.get("kind") == "interactive"), None)
            if last is not None:
                last = {"session": last["id"], "history": await default.api(
                    "GET", f"/sessions/{quote(last['id'], safe='')}/history")}
        except ServiceError as e:
            raise service_error(e) from None
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"servers": servers, "last": last}))


def admin_landing(admins: list[str], service: str = "gpubudget"):  # noqa: ANN201
    """For ``c.JupyterHub.default_url``: where a user lands after logging in (and at the hub's
    root) when nothing else is asked for (``?next=``): the budgets' admins on the service's
    admin pages, everyone else where JupyterHub sends them (their server, or the spawn
    form)."""
    names = frozenset(admins)

    def landing(handler) -> str | None:  # noqa: ANN001
        user = handler.current_user
        if user is not None and user.name in names:
            return url_path_join(handler.base_url, "services", service) + "/"
        return None

    return landing


def extra_handlers() -> list[tuple[str, type]]:
    """For ``c.JupyterHub.extra_handlers``."""
    return [(QUOTE_ROUTE, QuoteHandler), (ENDED_ROUTE, EndedHandler),
            (HISTORY_ROUTE, HistoryHandler)]


def register_handlers() -> None:
    """Add the handlers to JupyterHub's own API handlers (``jupyterhub.apihandlers
    .default_handlers``, served under the hub's prefix like ``/hub/api/users``); call it in
    ``jupyterhub_config.py``. Twice adds them once."""
    from jupyterhub import apihandlers

    for route in extra_handlers():
        if route not in apihandlers.default_handlers:
            apihandlers.default_handlers.append(route)
