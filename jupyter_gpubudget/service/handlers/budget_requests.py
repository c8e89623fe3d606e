"""Asking for more budget: a member asks for more GPU-hours for a project, its managers grant
or decline (``ledger/budget_requests.py``).

``POST /budget-requests`` ``{"project", "gpu_hours", "reason"}`` (scope ``submit``; a member
of the project): a pending request; the managers of the accounts above the project (else the
admins) are told by a notice. ``GET /budget-requests?state=pending`` (``read``): an admin's
every request, a manager's those of the projects they may fund, and one's own.
``POST /budget-requests/{id}/grant`` ``{"note"?}`` (``manage``): the project's grant is
raised by the amount through the grant change (``PUT /accounts/{name}/grant``'s checks: the
parent's grant bounds a manager, a manager funding their own project needs another's
approval); ``POST /budget-requests/{id}/decline`` ``{"reason"}`` (``manage``). The member is
told the answer by a notice. Bad input is a 400 naming the field, and changes nothing.

``GET /requests``: the admin page listing the pending requests with Grant and Decline.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpubudget.core.accounts import AccountTree
from jupyter_gpubudget.ledger import budget_requests as br
from jupyter_gpubudget.ledger.models import BudgetRequestRow, DecisionRow

from ..auth import SCOPE_MANAGE, SCOPE_READ, SCOPE_SUBMIT, Caller, needs_scope
from ..base import ApiError, BaseHandler
from ..notices import Notice
from ..state import tree_with_ledger_grants
from ..validate import MAX_GRANT_HOURS, Invalid, _check_keys, _grant_number, _text
from ..views import grant_json
from .accounts import note_approval
from .pages import PageHandler

MAX_REASON = 2000
STATES = ("pending", "granted", "declined")


def deciders(tree: AccountTree, project: str, admins: frozenset[str]) -> list[str]:
    """Who may grant a request for ``project``: the managers of the accounts above it, else
    the admins."""
    above = {m for a in tree.path(project)[:-1] for m in tree.get(a).managers}
    return sorted(above or admins)


def parse_request(body: Any) -> dict[str, Any]:
    body = _check_keys(body, {"project", "gpu_hours", "reason"})
    project = body.get("project")
    if not isinstance(project, str) or not project:
        raise Invalid("project", "required: the project that needs more GPU-hours")
    hours = _grant_number(body, "gpu_hours", MAX_GRANT_HOURS, "GPU-hours")
    if hours is None or hours <= 0:
        raise Invalid("gpu_hours", "required: how many more GPU-hours per window, above 0")
    reason = _text(body, "reason", MAX_REASON).strip()
    if not reason:
        raise Invalid("reason", "required: say what the GPU-hours are for")
    return {"project": project, "gpu_hours": hours, "reason": reason}


def may_decide(c: Caller, tree: AccountTree, project: str) -> bool:
    return c.is_admin or any(c.name in tree.get(a).managers for a in tree.path(project)[:-1])


def request_notice(d: DecisionRow) -> Notice:
    """The words of a budget request's notice (to its deciders, or the answer to its maker)."""
    det = d.detail or {}
    p, who, h = det.get("project", ""), det.get("user", ""), float(det.get("gpu_hours") or 0)
    ids = {"request": det.get("request"), "project": p, "at": d.at}
    if d.kind == "budget-request":
        return Notice("budget-request", "request",
                      f"{who} asks for {h:g} more GPU-hours for project {p}",
                      f"{who} asks for {h:g} more GPU-hours per window for project {p}: "
                      f"“{d.reason}”. Grant or decline it on the Budget requests page.", ids)
    if d.kind == "budget-granted":
        return Notice("budget-granted", "request",
                      f"Your request for {h:g} more GPU-hours for {p} was granted",
                      f"{d.actor} granted your request: project {p}'s grant is now "
                      f"{float(det.get('grant_hours') or 0):g} GPU-hours per window."
                      + (f" Their note: “{d.reason}”." if d.reason else ""), ids)
    return Notice("budget-declined", "request",
                  f"Your request for {h:g} more GPU-hours for {p} was declined",
                  f"{d.actor} declined your request for project {p}: “{d.reason}”. Its "
                  "grant is unchanged.", ids)


def notices_json(ledger: Any, user: str) -> list[dict[str, Any]]:
    """The user's budget-request notices, as ``GET /notices`` lists notices."""
    with ledger.ro() as s:
        rows = br.decisions_for(s, user)
    out = []
    for d in rows:
        n = request_notice(d)
        out.append({"kind": d.kind, "workload": None, "name": "", "project": n.details["project"],
                    "at": d.at, "reason": n.body, "title": n.title, "body": n.body,
                    "cause": n.cause, "details": n.details, "decision_reason": d.reason,
                    "requeued": False, "state": None})
    return out


def pending_deliveries(ledger: Any, after: int, s: Any = None
                       ) -> list[tuple[int, str, Notice]]:
    """Budget-request notices recorded after decision ``after``: (decision id, user, notice)
    for each user told, oldest first (``service/delivery.py`` sends them; ``s``: its read
    transaction)."""
    from sqlalchemy import select

    with ledger.ro(s) as s:
        rows = list(s.scalars(select(DecisionRow).where(
            DecisionRow.kind.in_(br.REQUEST_KINDS), DecisionRow.id > after)
            .order_by(DecisionRow.id).limit(200)))
    return [(d.id, u, request_notice(d)) for d in rows
            for u in ((d.detail or {}).get("notify") or [])]


def visible(c: Caller, tree: AccountTree) -> list[str] | None:
    """The projects whose requests the caller sees (None: all); plus always their own."""
    if c.is_admin:
        return None
    return [p for p in tree.projects() if may_decide(c, tree, p)]


class BudgetRequestsHandler(BaseHandler):
    @needs_scope(SCOPE_READ)
    async def get(self) -> None:
        c = await self.caller()
        raw = self.get_query_argument("state", None) or "pending"
        states = [x for x in raw.split(",") if x]
        bad = [x for x in states if x not in STATES]
        if bad or not states:
            raise ApiError(400, f"state: expected pending, granted or declined (comma-"
                                f"separated), got {raw[:40]!r}", "state")
        tree, ledger = self.tree, self.svc.ledger
        projects = visible(c, tree)

        def read() -> list[dict]:
            with ledger.ro() as s:
                return [{**br.request_json(r), "may_decide": may_decide(c, tree, r.project)}
                        for r in br.listing(s, projects=projects, user=c.name, states=states)]

        self.send({"requests": await self.db(read)})

    @needs_scope(SCOPE_SUBMIT)
    async def post(self) -> None:
        c = await self.caller()
        req = parse_request(self.body())
        tree, svc = self.tree, self.svc
        if req["project"] not in tree or not tree.is_project(req["project"]):
            raise ApiError(400, f"project: no project {req['project'][:200]!r} in the budgets "
                                "file", "project")
        c.require_submit(tree, req["project"])
        notify = deciders(tree, req["project"], svc.budgets.admins)

        def apply() -> dict:
            with svc.ledger.tx() as s:
                row = br.create(s, project=req["project"], user=c.name,
                                gpu_hours=req["gpu_hours"], reason=req["reason"],
                                now=svc.clock(), notify=notify)
                return {**br.request_json(row), "notified": notify}

        self.send(await self.db(apply), 201)


def _rid(raw: str) -> int:
    if not raw.isdigit() or len(raw) > 12:
        raise ApiError(404, f"no budget request {raw[:40]!r}")
    return int(raw)


class DecideHandler(BaseHandler):
    @needs_scope(SCOPE_MANAGE)
    async def post(self, raw: str, verb: str) -> None:
        c = await self.caller()
        rid = _rid(raw)
        body = _check_keys(self.body() or {}, {"note"} if verb == "grant" else {"reason"})
        if verb == "decline":
            note = _text(body, "reason", MAX_REASON).strip()
            if not note:
                raise Invalid("reason", "required: say why the request is declined")
        else:
            note = _text(body, "note", MAX_REASON).strip()
        svc, tree = self.svc, self.tree

        def apply() -> dict:
            with svc.ledger.tx() as s:
                row = br.pending(s, rid)
                if row.project not in tree:
                    raise ApiError(409, f"project {row.project!r} is no longer in the budgets "
                                        "file")
                c.require_manage(tree, row.project)
                now = svc.clock()
                if verb == "decline":
                    br.decide(s, row, state="declined", by=c.name, now=now, note=note)
                    return {"request": br.request_json(row)}
                granted = _grant_sync(svc, s, c, row, note, now)
                return {"request": br.request_json(row), **granted}

        out = await self.db(apply)
        if verb == "grant":
            svc.kick()
        self.send(out)


def _grant_sync(svc: Any, s: Any, c: Caller, row: BudgetRequestRow, note: str,
                now: float) -> dict:
    """Raise the project's grant by the request's amount through the grant change's own
    checks and audit entry (who asked, who approved), in the caller's transaction."""
    before = tree_with_ledger_grants(svc.tree(), svc.ledger)
    old = before.get(row.project).grant_hours
    if old is None:
        raise ApiError(409, f"project {row.project!r} is funded by a share in percent, not "
                            "GPU-hours: change its share on the Accounts page and decline "
                            "the request with a note")
    new = round(old + row.gpu_hours, 3)
    after = before.with_grant(row.project, new, None)
    hours = svc.inventory.gpu_count * svc.budgets.policy.window / 3600
    c.require_within_parent(before, after, row.project, hours)
    approval = c.grant_approval(before, after, row.project, hours, svc.budgets.admins,
                                svc.budgets.policy.managers_fund_own_projects, row.user)
    text = note or f"budget request {row.id} of {row.user}: {row.reason}"
    g = svc.ledger.set_grant(row.project, new, None, by=c.name, now=now, note=text[:2000], s=s)
    note_approval(s, g, c.name, now, approval or {"requested_by": row.user,
                                                  "approved_by": c.name})
    br.decide(s, row, state="granted", by=c.name, now=now, note=note, grant_version=g.version,
              detail={"grant_hours": new, "was": old})
    return {"grant": grant_json(g)}


class RequestsPage(PageHandler):
    """The pending budget requests the caller may answer, with Grant and Decline (and their
    own requests); answered ones below."""

    page, title = "requests", "Budget requests"

    async def data(self, c: Caller) -> dict[str, Any]:
        tree, ledger = self.tree, self.svc.ledger
        projects = visible(c, tree)

        def read() -> dict:
            with ledger.ro() as s:
                rows = br.listing(s, projects=projects, user=c.name, states=list(STATES))
                grants = ledger.current_grants()
            return {"pending": [{**br.request_json(r), "may_decide": may_decide(c, tree,
                                                                                 r.project),
                                 "grant_hours": getattr(grants.get(r.project), "grant_hours",
                                                        None)}
                                for r in rows if r.state == "pending"],
                    "answered": [br.request_json(r) for r in rows if r.state != "pending"]}

        return {"data": await self.db(read), "api": self.svc.api_prefix}


API_ROUTES = [
    ("/budget-requests", BudgetRequestsHandler),
    (r"/budget-requests/([^/]+)/(grant|decline)", DecideHandler),
]
ROOT_ROUTES = [("/requests", RequestsPage)]
