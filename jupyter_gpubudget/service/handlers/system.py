"""The OAuth callback, health, the OpenAPI document and Prometheus metrics (the service's root
and its pages are in ``pages.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jupyterhub.services.auth import HubOAuthCallbackHandler

from ..base import BaseHandler
from ..openapi import openapi_document

if TYPE_CHECKING:
    from ..app import GpuBudgetService


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
                "role": "leader" if self.svc.is_leader else "standby",
                "last_cycle_at": v.at, "last_ok_cycle_at": self.svc.loop.last_ok_at,
                "inventory": self.svc.inventory.source, "version": "v1"}
        if reasons:
            body["reasons"] = reasons
            body["message"] = "; ".join(reasons)
        if v.inconsistent:
            body["left_out"] = v.inconsistent  # running records the core could not place
        self.send(body, 200 if healthy else 503)


class LeaderHandler(BaseHandler):
    """Which replica leads (no token needed: it says only roles and URLs): 200 on the
    leader, 503 on a standby — a readiness probe sends traffic to the leader only.
    ``{"role": "leader"|"standby", "leader": URL or null, "token": fencing token}``."""

    quiet_503 = True

    def get(self) -> None:
        svc = self.svc
        lease = svc.lease
        leads = svc.is_leader
        body = {"role": "leader" if leads else "standby",
                "leader": lease.leader_url() if lease is not None else None,
                "replica": lease.holder if lease is not None else None,
                "token": (lease.token if leads else lease.leader.token if lease.leader
                          else None) if lease is not None else None,
                "replicas": "lease" if lease is not None else "single (SQLite)"}
        self.send(body, 200 if leads else 503)


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
ROOT_ROUTES = [("/oauth_callback", OAuthCallbackHandler),
               ("/metrics", MetricsHandler)]
#: under /api/v1
API_ROUTES = [("/healthz", HealthHandler), ("/leader", LeaderHandler),
              ("/openapi.json", OpenAPIHandler)]
