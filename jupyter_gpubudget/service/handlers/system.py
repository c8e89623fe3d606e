"""The service's root (browser login), OAuth callback, health, the OpenAPI document and
Prometheus metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from tornado import web

from ..base import BaseHandler
from ..openapi import openapi_document

if TYPE_CHECKING:
    from ..app import GpuBudgetService


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


class HealthHandler(BaseHandler):
    """Liveness for load balancers and monitoring: 503 with the reasons when scheduling
    cycles fail or stop, or the ledger is unavailable. Never touches the ledger itself."""

    def get(self) -> None:
        v = self.svc.loop.view
        healthy, reasons = self.svc.health()
        body = {"status": "ok" if healthy else "unhealthy", "cycle": v.cycle,
                "last_cycle_at": v.at, "last_ok_cycle_at": self.svc.loop.last_ok_at,
                "inventory": self.svc.inventory.source, "version": "v1"}
        if reasons:
            body["reasons"] = reasons
            body["message"] = "; ".join(reasons)
        if v.inconsistent:
            body["left_out"] = v.inconsistent  # running records the core could not place
        self.send(body, 200 if healthy else 503)


class OpenAPIHandler(BaseHandler):
    def get(self) -> None:
        self.send(openapi_document(self.svc.api_prefix))


class MetricsHandler(BaseHandler):
    async def get(self) -> None:
        if self.svc.metrics_require_auth:
            c = await self.caller()
            c.require_admin()
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.svc.registry))


#: under the service prefix
ROOT_ROUTES = [("/?", IndexHandler), ("/oauth_callback", OAuthCallbackHandler),
               ("/metrics", MetricsHandler)]
#: under /api/v1
API_ROUTES = [("/healthz", HealthHandler), ("/openapi.json", OpenAPIHandler)]
