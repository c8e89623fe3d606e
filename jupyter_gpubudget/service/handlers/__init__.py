"""The service's HTTP handlers, one module per group; each exports its ``API_ROUTES``
(under ``/api/v1``) and, where it has any, ``ROOT_ROUTES`` (under the service prefix)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base import NotFoundHandler
from . import (
    accounts,
    audit,
    budget_requests,
    events,
    jobs,
    member_limits,
    mine,
    notices,
    operator,
    pages,
    reports,
    reservations,
    sessions,
    snapshots,
    system,
    workloads,
)

if TYPE_CHECKING:
    from ..app import GpuBudgetService

MODULES = (system, accounts, member_limits, workloads, jobs, events, sessions, snapshots, operator, audit,
           reports, reservations, notices, mine, budget_requests, pages)


def routes(prefix: str, svc: GpuBudgetService) -> list:
    """Every route of the service, for ``tornado.web.Application``."""
    root = prefix.rstrip("/")
    api = root + "/api/v1"
    kw = {"svc": svc}
    out = []
    for mod in MODULES:
        out += [(root + path, handler, kw) for path, handler in getattr(mod, "ROOT_ROUTES", ())]
        out += [(api + path, handler, kw) for path, handler in mod.API_ROUTES]
    out.append((root + "/.*", NotFoundHandler, kw))
    return out
