"""The sidebar's handlers: ``gpubudget/api/info`` and an allow-list of service calls.

``GET  gpubudget/api/info`` — this server's session and project, whether the service is
configured and reachable, which optional endpoints it has, the server's clock.

``GET|DELETE|POST gpubudget/api/v1/<path>`` — forwarded to the service's ``/api/v1/<path>`` with the
server's token, only for the (method, path) pairs in ``ALLOWED`` and only with the query
parameters listed there; everything else is refused (403) without reaching the service. A
DELETE of a session is forwarded only while that session is queued (leaving the queue): a
running server is stopped through JupyterHub, not by ending its charge here.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any
from urllib.parse import quote, urlencode

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from .config import GpuBudgetLab
from .service import FEATURE_PATHS, ServiceClient, ServiceUnavailable

AUTH_RESOURCE = "gpubudget"
_SEG = r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,199}"
_SID = r"(?!offer$)[A-Za-z0-9][A-Za-z0-9_.@+-]{0,199}"  # a session id, not /sessions/offer

# (method, service path under /api/v1, query parameters passed on)
ALLOWED: list[tuple[str, re.Pattern[str], frozenset[str]]] = [
    (m, re.compile(p), frozenset(q)) for m, p, q in [
        ("GET", rf"sessions/{_SID}", ()),
        ("GET", rf"sessions/{_SID}/snapshots", ()),
        ("GET", rf"sessions/{_SID}/history", ()),
        ("POST", rf"sessions/{_SID}/release", ()),  # "Save and release now" (preempted)
        ("DELETE", rf"sessions/{_SID}", ()),  # queued sessions only: checked below
        ("GET", r"workloads/me", ("state",)),
        ("GET", r"workloads/me/ended", ("limit",)),  # what ended work cost (no ?user=)
        ("GET", r"accounts", ()),
        ("GET", rf"accounts/{_SEG}", ()),
        ("GET", rf"accounts/{_SEG}/usage", ()),
        ("GET", rf"accounts/{_SEG}/usage/daily", ("tz",)),
        ("GET", r"notices", ()),
        ("GET", r"me/week", ("tz",)),  # my own week, charged and busy
        ("GET", rf"sessions/{_SID}/utilisation", ()),
        ("GET", r"budget-requests", ("state",)),
        ("POST", r"budget-requests", ()),  # asking for more GPU-hours (body forwarded)
        ("GET", r"queue", ()),
        ("GET", r"jobs", ("state",)),
        ("DELETE", rf"jobs/{_SEG}", ()),
        ("GET", rf"jobs/{_SEG}/log", ("offset", "limit")),
        ("GET", r"healthz", ()),
    ]
]


def allowed(method: str, path: str) -> frozenset[str] | None:
    """The query parameters passed on for this call, or None when it is not forwarded."""
    for m, pattern, query in ALLOWED:
        if m == method and pattern.fullmatch(path):
            return query
    return None


class _Base(APIHandler):
    auth_resource = AUTH_RESOURCE

    def initialize(self, lab: GpuBudgetLab, client: ServiceClient) -> None:
        self.lab, self.client = lab, client

    def send(self, status: int, body: Any) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))


class InfoHandler(_Base):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        problem = self.lab.problem()
        features = {k: False for k in (*FEATURE_PATHS, "snapshots")}
        message, reachable = problem, False
        if problem is None:
            found, error = await self.client.features()
            features.update(found)
            reachable, message = error is None, error
        user = self.current_user
        self.send(200, {
            "user": getattr(user, "username", None) or getattr(user, "name", None),
            "session": self.lab.session_id or None,
            "project": self.lab.project or None,
            "server_time": time.time(),
            "service": {"configured": problem is None, "reachable": reachable,
                        "url": self.lab.service_url or None, "message": message},
            "features": features,
        })


class ForwardHandler(_Base):
    """Forwards an allow-listed call to the service with the server's token."""

    async def _forward(self, method: str, path: str) -> None:
        query = allowed(method, path)
        if query is None:
            raise web.HTTPError(403, f"{method} {path} is not forwarded to the gpubudget "
                                     "service from JupyterLab")
        params = []
        for k in sorted(query):
            v = self.get_query_argument(k, None)
            if v is not None:
                if len(v) > 200:
                    raise web.HTTPError(400, f"{k}: at most 200 characters")
                params.append((k, v))
        safe = "/".join(quote(seg, safe="") for seg in path.split("/"))
        try:
            if method == "DELETE" and path.startswith("sessions/"):
                await self._check_queued(safe)
            body = self.get_json_body() if method == "POST" else None
            a = await self.client.call(method, safe, urlencode(params), body)
        except ServiceUnavailable as e:
            raise web.HTTPError(e.status, e.message) from None
        self.send(a.status, a.body)

    async def _check_queued(self, safe: str) -> None:
        sid = safe.split("/", 1)[1]
        if sid == self.lab.session_id:
            raise web.HTTPError(409, "this is the session JupyterLab runs in: stop it from the "
                                     "JupyterHub control panel (File > Hub Control Panel)")
        a = await self.client.call("GET", safe)
        if a.status != 200:
            self.send(a.status, a.body)
            raise web.Finish()
        state = a.body.get("state") if isinstance(a.body, dict) else None
        if state != "pending":
            raise web.HTTPError(409, f"session {sid} is {state}: only a queued session can be "
                                     "cancelled here; stop a running server from the "
                                     "JupyterHub control panel")

    @web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        await self._forward("GET", path)

    @web.authenticated
    @authorized
    async def delete(self, path: str) -> None:
        await self._forward("DELETE", path)

    @web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        """Only the allow-list's POSTs (their JSON body, if any, is passed on)."""
        await self._forward("POST", path)


def routes(base_url: str, lab: GpuBudgetLab) -> list:
    kw = {"lab": lab, "client": ServiceClient(lab)}
    api = url_path_join(base_url, "gpubudget", "api")
    return [
        (url_path_join(api, "info"), InfoHandler, kw),
        (url_path_join(api, "v1", "(.*)"), ForwardHandler, kw),
    ]
