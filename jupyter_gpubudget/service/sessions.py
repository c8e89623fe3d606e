"""Interactive sessions: what BudgetSpawner (running inside JupyterHub) asks of the service.

A session is a workload of kind ``interactive`` with ``backend="hub"``: the service queues and
schedules it and keeps its charge; JupyterHub's spawner starts and stops the server itself.

Endpoints (under ``/api/v1``):

- ``GET  /sessions/offer?user=U[&quotes=0]`` — the user's projects, the slice choices the
  inventory can offer and, for each project and choice (unless ``quotes=0``), a quote (predicted start, protected time, GPU-hour
  cost of the protected time, backed or not). Callers: the user, or an admin acting for U.
- ``POST /sessions`` — submit a session for ``user`` (an admin, e.g. the spawner's token, may
  act for anyone; a user only for themselves). Refused (403) when the user is not a member of
  the project.
- ``GET  /sessions[?user=U&state=a,b]`` — sessions (admins: everyone's).
- ``GET  /sessions/{id}`` — state, queue position, predicted start, placement, and
  ``preempt_requested`` when the scheduler wants it stopped.
- ``POST /sessions/{id}/heartbeat`` — the server is still alive: checkpoints the open charge.
- ``POST /sessions/{id}/idle`` — the spawner reports the session idle: recorded as a notice for
  the user and the admin, and the session's protection ends (it becomes preemptible).
- ``DELETE /sessions/{id}?reason=stop|cull|preempt|failed`` — ends the charge.

A session nobody vouches for any more (no long-poll while queued, no heartbeat while running,
for ``$GPUBUDGET_SESSION_STALE_S`` seconds, default 300) is ended by the service: e.g. a spawn
queued when the hub restarted would otherwise start and be charged with no server.
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from typing import TYPE_CHECKING, Any

from jupyter_gpubudget.core.backfill import predict_runtime
from jupyter_gpubudget.core.mig import profiles_for
from jupyter_gpubudget.core.model import Reserve, SliceRequest, Start, Workload
from jupyter_gpubudget.core.scheduler import Scheduler, request_milli
from jupyter_gpubudget.ledger import LedgerError
from jupyter_gpubudget.ledger.models import WorkloadRow

from .auth import SCOPE_SUBMIT, Caller, Denied
from .handlers import ApiError, BaseHandler
from .state import build_state, request_to_dict
from .validate import Invalid, duration, parse_slice
from .views import workload_json

if TYPE_CHECKING:
    from .app import GpuBudgetService

SESSION_BACKEND = "hub"
SESSION_FIELDS = {"user", "project", "gpus", "slice", "min_runtime", "name", "gpu_model"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,199}$")
_REASONS = {"stop": ("done", "stop"), "cull": ("done", "cull"),
            "preempt": ("preempted", "preempt"), "failed": ("failed", "exit"),
            "timeout": ("cancelled", "cancel")}
MPS_SHARES = (250, 500)


# ---------------------------------------------------------------------------- the backend
# ---------------------------------------------------------------------------- choices, quotes
def slice_choices(inventory: Any) -> list[dict]:
    """What the inventory can offer a session: CPU only, whole GPUs, MIG profiles, MPS."""
    models: dict[str, dict[str, Any]] = {}
    max_gpus = 0
    for node in inventory.nodes:
        max_gpus = max(max_gpus, sum(1 for g in node.gpus if not g.mig))
        for g in node.gpus:
            m = models.setdefault(g.model, {"whole": 0, "mig": False})
            if g.mig:
                m["mig"] = True
            else:
                m["whole"] += 1
    out = [{"key": "cpu", "label": "CPU only (no GPU)", "kind": "cpu", "fraction": 0.0}]
    n = 1
    while n <= max_gpus:
        out.append({"key": f"gpu:{n}", "label": f"{n} whole GPU{'s' if n > 1 else ''}",
                    "kind": "gpu", "fraction": float(n)})
        n *= 2
    for model, m in sorted(models.items()):
        if m["mig"]:
            for p in profiles_for(model).values():
                out.append({"key": f"mig:{p.name}", "label": f"MIG {p.name} on {model} "
                            f"({p.compute}/7 of a GPU)", "kind": "mig", "gpu_model": model,
                            "fraction": p.milli / 1000})
    if any(m["whole"] for m in models.values()):
        for milli in MPS_SHARES:
            out.append({"key": f"mps:{milli}", "label": f"MPS share, {milli / 10:g}% of a GPU",
                        "kind": "mps", "fraction": milli / 1000})
    return out


def request_from_choice(key: str) -> SliceRequest:
    """``cpu``, ``gpu:N``, ``mig:<profile>``, ``mps:<milli>`` -> a SliceRequest."""
    if key == "cpu":
        return SliceRequest.cpu_only()
    if key.startswith("gpu:"):
        return parse_slice({"gpus": _int(key[4:], "slice")})
    if key.startswith("mig:"):
        return parse_slice({"slice": key[4:]})
    if key.startswith("mps:"):
        return parse_slice({"slice": key})
    raise Invalid("slice", f"{key!r} is not one of cpu, gpu:N, mig:<profile>, mps:<milli>")


def check_offered(inventory: Any, req: SliceRequest) -> None:
    """Refuse (400, field ``slice``) a request no hardware in the inventory could ever hold,
    rather than letting it wait in the queue forever."""
    keys = {c["key"] for c in slice_choices(inventory)}
    if req.kind == "mig":
        if f"mig:{req.profile}" not in keys:
            offered = sorted(k[4:] for k in keys if k.startswith("mig:"))
            raise Invalid("slice", f"no MIG-partitioned GPU here offers {req.profile!r} "
                                   f"(offered: {', '.join(offered) or 'none'})")
    elif req.kind == "gpu":
        most = max((sum(1 for g in n.gpus if not g.mig) for n in inventory.nodes), default=0)
        if req.gpus > most and req.single_node:
            raise Invalid("gpus", f"at most {most} whole GPUs on one node")
        total = sum(sum(1 for g in n.gpus if not g.mig) for n in inventory.nodes)
        if req.gpus > total:
            raise Invalid("gpus", f"the cluster has {total} whole GPUs")
    elif req.kind == "mps" and not any(k.startswith("mps:") for k in keys):
        raise Invalid("slice", "no GPU here takes MPS shares")


def _int(text: str, field: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise Invalid(field, f"{text!r} is not a whole number") from None


def parse_session(body: Any) -> dict:
    if not isinstance(body, dict):
        raise Invalid("body", "expected a JSON object")
    for k in body:
        if k not in SESSION_FIELDS:
            raise Invalid(str(k), f"unknown field (allowed: {', '.join(sorted(SESSION_FIELDS))})")
    for k in ("user", "project"):
        v = body.get(k)
        if not isinstance(v, str) or not _NAME.match(v):
            raise Invalid(k, "is required (a name)" if v is None else f"{v!r} is not a valid name")
    sl = body.get("slice")
    if isinstance(sl, str) and (sl == "cpu" or sl.startswith(("gpu:", "mig:"))):
        req = request_from_choice(sl)
    else:
        req = parse_slice({k: body[k] for k in ("gpus", "slice", "gpu_model") if k in body})
    name = body.get("name", "")
    if not isinstance(name, str) or len(name) > 200:
        raise Invalid("name", "expected a string of at most 200 characters")
    return {"user": body["user"], "project": body["project"], "request": req, "name": name,
            "min_runtime": duration(body.get("min_runtime", 0), "min_runtime")}


def estimate_start(svc: GpuBudgetService, state: Any, position: int, now: float) -> float | None:
    """A rough predicted start for work queued at ``position`` without a reservation: the
    position-th earliest predicted end of running work (never before its protection ends)."""
    pol = svc.budgets.policy
    ends = []
    for w in state.running:
        if w.started_at is None or not w.placement or w.placement.milli <= 0:
            continue
        end = w.started_at + predict_runtime(w, state.history, pol) if state.history else \
            w.started_at + pol.default_runtime
        if w.protected_until:
            end = max(end, w.protected_until)
        ends.append(max(end, now))
    ends.sort()
    if not ends:
        return None
    return ends[min(len(ends), max(1, position)) - 1]


def quote(svc: GpuBudgetService, state: Any, user: str, project: str, req: SliceRequest,
          min_runtime: float, now: float) -> dict:
    """What a session would get if submitted now, from the core itself (pure, nothing saved)."""
    wid = "quote-" + uuid.uuid4().hex[:8]
    w = Workload(id=wid, project=project, user=user, request=req, submitted_at=now,
                 kind="interactive", min_runtime=min_runtime)
    state.pending = [*state.pending, w]
    try:
        s = Scheduler.from_state(state)
        backed = s.is_backed(w, now)
        decisions = s.cycle(now)
    finally:
        state.pending = state.pending[:-1]
    protected = svc.budgets.policy.effective_min_runtime(w)
    fraction = request_milli(req) / 1000
    out: dict[str, Any] = {"backed": backed, "predicted_start": None, "starts_now": False,
                           "protected_s": protected if backed else 0.0,
                           "cost_gpu_hours": round(fraction * protected / 3600, 4),
                           "fraction": fraction}
    for d in decisions:
        if isinstance(d, Start) and d.workload == wid:
            out.update(predicted_start=now, starts_now=True, backed=d.backed,
                       protected_s=(d.protected_until - now) if d.protected_until else 0.0)
            break
        if isinstance(d, Reserve) and d.workload == wid:
            out["predicted_start"] = d.at
            break
    else:
        out["predicted_start"] = estimate_start(svc, state, len(state.pending) + 1, now)
    if not out["backed"]:
        out["protected_s"] = 0.0
        out["note"] = ("unbacked: the project's grant does not cover this session's protected "
                       "time; it may run on idle capacity but is never protected and is "
                       "preempted first")
    out["cost_gpu_hours"] = round(fraction * out["protected_s"] / 3600, 4)
    return out


# ---------------------------------------------------------------------------- handlers
class _SessionBase(BaseHandler):
    async def acting_for(self, user: str | None) -> tuple[Caller, str]:
        c = await self.caller()
        c.require_read()
        user = user or c.name
        if user != c.name and not c.is_admin:
            raise Denied(f"only gpubudget admins may act for another user ({user!r})")
        return c, user

    def session_or_404(self, wid: str) -> WorkloadRow:
        row = self.svc.ledger.get(wid)
        if row is None or row.backend != SESSION_BACKEND:
            raise ApiError(404, f"no session {wid!r}")
        _seen(self.svc)[wid] = self.svc.clock()
        return row

    def session_json(self, row: WorkloadRow) -> dict:
        now, view = self.svc.clock(), self.svc.loop.view
        out = workload_json(row, view, now)
        out["preempt_requested"] = None
        out["idle_reported"] = None
        if row.state == "running":
            for d in self.svc.ledger.decisions(workloads=[row.id], limit=20):
                if d.at < (row.started_at or 0):
                    break
                if d.kind == "preempt-requested" and out["preempt_requested"] is None:
                    out["preempt_requested"] = d.reason or "preempted"
                if d.kind == "idle" and out["idle_reported"] is None:
                    out["idle_reported"] = d.at
        if row.state == "running" and row.placement:
            out["blocked_by"] = self.blocked_by(row)
        if row.state == "pending" and out["predicted_start"] is None:
            pos = out["queue_position"] or 1
            state, _ = build_state(self.svc.ledger, self.svc.tree(), self.svc.inventory,
                                   self.svc.budgets.policy, now)
            out["predicted_start"] = estimate_start(self.svc, state, pos, now)
            out["predicted_start_kind"] = "estimate"
        out["inventory"] = self.svc.inventory.source
        return out


    def blocked_by(self, row: WorkloadRow) -> list[str]:
        """Running sessions asked to stop (preempted) that still hold a slice conflicting with
        this session's placement: its server should start only once they are gone."""
        mine = [(s.get("node"), s.get("gpu"), s.get("kind"), s.get("mig_start"))
                for s in row.placement or [] if (s.get("gpu", -1) or 0) >= 0]
        if not mine:
            return []
        out = []
        for other in self.svc.ledger.workloads(states=("running",), backend=SESSION_BACKEND):
            if other.id == row.id or not other.placement:
                continue
            clash = any(n == s.get("node") and g == s.get("gpu") and (
                k == "gpu" or s.get("kind") == "gpu" or (k == s.get("kind") == "mig"
                                                         and st == s.get("mig_start")))
                for n, g, k, st in mine for s in other.placement)
            if clash and any(d.kind == "preempt-requested" and d.at >= (other.started_at or 0)
                             for d in self.svc.ledger.decisions(workloads=[other.id], limit=20)):
                out.append(other.id)
        return out


class OfferHandler(_SessionBase):
    async def get(self) -> None:
        _, user = await self.acting_for(self.get_query_argument("user", None))
        tree = self.tree
        projects = tree.projects_of(user)
        min_runtime = duration(self.get_query_argument("min_runtime", "1h"), "min_runtime")
        choices = slice_choices(self.svc.inventory)
        svc = self.svc

        want_quotes = self.get_query_argument("quotes", "1") not in ("0", "false", "no")

        def work() -> dict:
            now = svc.clock()
            if not want_quotes:
                return {"now": now, "quotes": {}}
            state, _ = build_state(svc.ledger, tree, svc.inventory, svc.budgets.policy, now)
            quotes = {p: {ch["key"]: quote(svc, state, user, p, request_from_choice(ch["key"]),
                                           min_runtime, now) for ch in choices}
                      for p in projects}
            return {"now": now, "quotes": quotes}

        q = await asyncio.get_running_loop().run_in_executor(None, work)
        pol = svc.budgets.policy
        self.send({"user": user, "projects": projects, "choices": choices,
                   "min_runtime": min_runtime, "min_runtime_cap": pol.cap_for("interactive"),
                   "inventory": svc.inventory.source,
                   "inventory_gpus": svc.inventory.gpu_count, **q})


class SessionsHandler(_SessionBase):
    async def get(self) -> None:
        c, user = await self.acting_for(self.get_query_argument("user", None))
        states = self.query_states()
        who = None if (c.is_admin and self.get_query_argument("user", None) is None) else user
        rows = [r for r in self.svc.ledger.workloads(user=who, states=states)
                if r.backend == SESSION_BACKEND]
        self.send({"sessions": [self.session_json(r) for r in rows]})

    async def post(self) -> None:
        c = await self.caller()
        sess = parse_session(self.body())
        user, project = sess["user"], sess["project"]
        if user != c.name and not c.is_admin:
            raise Denied(f"only gpubudget admins may start a session for another user ({user!r})")
        if not (SCOPE_SUBMIT in c.scopes or c.is_admin):
            raise Denied(f"token lacks scope {SCOPE_SUBMIT}")
        tree = self.tree
        if project not in tree:
            raise ApiError(400, f"project: no project {project!r}", "project")
        if not tree.is_project(project):
            raise ApiError(400, f"project: {project!r} is a program; a session charges a "
                                "project (a leaf account)", "project")
        check_offered(self.svc.inventory, sess["request"])
        mine = tree.projects_of(user)
        if project not in mine:
            raise ApiError(403, f"user {user!r} is not a member of project {project!r} "
                                f"(their projects: {', '.join(mine) or 'none'})", "project")
        now = self.svc.clock()

        def apply(s):  # noqa: ANN001, ANN202
            row = self.svc.ledger.submit(
                project=project, user=user, kind="interactive", now=now,
                request=request_to_dict(sess["request"]), command=None, env=None,
                min_runtime=sess["min_runtime"], resumable=False, time_limit=None,
                backend=SESSION_BACKEND, name=sess["name"], s=s)
            return 201, {"id": row.id}

        key = self.idem_key(c)
        if key is None:
            status, body = apply(None)
        else:
            status, body, _ = self.svc.ledger.idempotent(key, apply, now)
        _seen(self.svc)[body["id"]] = now
        self.svc.kick()
        row = self.svc.ledger.get(body["id"])
        assert row is not None
        self.send(self.session_json(row), status)


class SessionHandler(_SessionBase):
    async def get(self, wid: str) -> None:
        """``?wait=S``: long-poll, answer as soon as the state changes (at most S seconds,
        S <= 30), so a spawn starts within one cycle of being granted."""
        c = await self.caller()
        row = self.session_or_404(wid)
        c.require_see_workload(row.user)
        try:
            wait = min(30.0, max(0.0, float(self.get_query_argument("wait", "0"))))
        except ValueError:
            raise ApiError(400, "wait: expected seconds", "wait") from None
        if wait:
            first, deadline = row.state, self.svc.clock() + wait
            while row.state == first and self.svc.clock() < deadline:
                await asyncio.sleep(0.01)
                row = self.session_or_404(wid)
        self.send(self.session_json(row))

    async def delete(self, wid: str) -> None:
        c = await self.caller()
        row = self.session_or_404(wid)
        c.require_see_workload(row.user)
        reason = self.get_query_argument("reason", "stop")
        if reason not in _REASONS:
            raise ApiError(400, f"reason: one of {', '.join(sorted(_REASONS))}", "reason")
        state, closed_by = _REASONS[reason]
        if row.state == "pending":
            state, closed_by = "cancelled", "cancel"
        if row.state in ("pending", "running"):
            svc = self.svc

            def work() -> None:
                with svc.loop.lock:
                    try:
                        svc.ledger.stop(wid, now=svc.clock(), state=state, closed_by=closed_by,
                                        reason=f"{reason} (by {c.name})", actor=c.name)
                    except LedgerError as e:
                        if e.status != 409:
                            raise

            await asyncio.get_running_loop().run_in_executor(svc.worker, work)
            self.svc.kick()
        self.send(self.session_json(self.svc.ledger.get(wid)))  # type: ignore[arg-type]


class HeartbeatHandler(_SessionBase):
    async def post(self, wid: str) -> None:
        c = await self.caller()
        row = self.session_or_404(wid)
        c.require_see_workload(row.user)
        if row.state == "running":
            self.svc.ledger.checkpoint(self.svc.clock(), [wid])
        self.send(self.session_json(row))


class IdleHandler(_SessionBase):
    async def post(self, wid: str) -> None:
        c = await self.caller()
        row = self.session_or_404(wid)
        c.require_see_workload(row.user)
        body = self.body() or {}
        if not isinstance(body, dict):
            raise ApiError(400, "body: expected a JSON object", "body")
        idle_s = body.get("idle_s", 0)
        if isinstance(idle_s, bool) or not isinstance(idle_s, int | float) or idle_s < 0:
            raise ApiError(400, "idle_s: expected seconds (a number >= 0)", "idle_s")
        source = str(body.get("source", "kernel activity"))[:100]
        if row.state != "running":
            raise ApiError(409, f"session {wid} is {row.state}")
        now = self.svc.clock()
        with self.svc.ledger.tx() as s:
            w = s.get(WorkloadRow, wid)
            if w is not None and (w.protected_until is None or w.protected_until > now):
                w.protected_until = now  # idle past the limit: no longer protected
            self.svc.ledger.record_decision(
                now=now, kind="idle", workload=wid, actor=c.name,
                reason=f"idle for {idle_s / 60:.0f} min ({source}); now preemptible",
                detail={"idle_s": idle_s, "source": source}, s=s)
        self.svc.log.warning("session %s of %s (%s) idle for %.0f s (%s): reported to the user "
                             "and admins; now preemptible", wid, row.user, row.project, idle_s,
                             source)
        self.svc.kick()
        self.send(self.session_json(self.svc.ledger.get(wid)))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- stale sessions
def stale_after() -> float:
    """Seconds without a word from the hub (long-poll while queued, heartbeat while running)
    after which a session is ended: ``$GPUBUDGET_SESSION_STALE_S``, default 300."""
    try:
        return max(1.0, float(os.environ.get("GPUBUDGET_SESSION_STALE_S", "300")))
    except ValueError:
        return 300.0


def _seen(svc: Any) -> dict[str, float]:
    seen = getattr(svc, "_session_seen", None)
    if seen is None:
        seen = svc._session_seen = {}
    return seen


def reap_stale(svc: Any, now: float, started: float, limit: float) -> list[str]:
    """End hub sessions nobody vouches for any more: a queued spawn the hub stopped waiting for
    (e.g. the hub restarted meanwhile) is cancelled; a running one whose heartbeats stopped is
    closed at its last checkpoint (only time the hub vouched for is charged). Time since this
    service started counts as seen, so a service restart never ends sessions by itself."""
    seen = _seen(svc)
    ended = []
    for row in svc.ledger.workloads(states=("pending", "running"), backend=SESSION_BACKEND):
        last = max(seen.get(row.id, 0.0), started, row.submitted_at)
        if now - last < limit:
            continue
        with svc.loop.lock:
            try:
                if row.state == "pending":
                    svc.ledger.stop(row.id, now=now, state="cancelled", closed_by="cancel",
                                    reason="the hub stopped waiting for this session",
                                    actor="gpubudget")
                else:
                    svc.ledger.stop(row.id, now=None, state="failed", closed_by="lost",
                                    reason=f"no heartbeat from the hub for {now - last:.0f} s",
                                    actor="gpubudget")
            except LedgerError:
                continue
        seen.pop(row.id, None)
        ended.append(row.id)
        svc.log.warning("session %s of %s ended: no word from the hub for %.0f s", row.id,
                        row.user, now - last)
    return ended


async def _reaper(svc: Any) -> None:
    started, limit = svc.clock(), stale_after()
    aloop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(min(30.0, limit / 2))
        try:
            if await aloop.run_in_executor(svc.worker, reap_stale, svc, svc.clock(), started,
                                           limit):
                svc.kick()
        except Exception:  # noqa: BLE001 - keep reaping
            svc.log.exception("stale-session reaper failed")


def _start_reaper(svc: Any) -> None:
    try:
        aloop = asyncio.get_running_loop()
    except RuntimeError:  # routes built outside the event loop (tests of the app object)
        return
    if getattr(svc, "_session_reaper", None) is None:
        svc._session_reaper = aloop.create_task(_reaper(svc))


def session_routes(api: str, svc: GpuBudgetService) -> list:
    _start_reaper(svc)
    kw = {"svc": svc}
    wid = r"([A-Za-z0-9][A-Za-z0-9_.@+-]{0,199})"
    return [
        (api + "/sessions/offer", OfferHandler, kw),
        (api + "/sessions", SessionsHandler, kw),
        (api + f"/sessions/{wid}", SessionHandler, kw),
        (api + f"/sessions/{wid}/heartbeat", HeartbeatHandler, kw),
        (api + f"/sessions/{wid}/idle", IdleHandler, kw),
    ]


def openapi_paths() -> dict:
    """OpenAPI path items of the session endpoints, for ``openapi.openapi_document`` to merge
    (``paths.update(openapi_paths())``)."""
    from .openapi import DURATION, IDEM, NAME, STATE_Q, WORKLOAD, _op, _path_param, _resp

    session = {**WORKLOAD, "properties": {
        **WORKLOAD["properties"],
        "preempt_requested": {"type": "string", "nullable": True,
                              "description": "Why the scheduler wants this session stopped"},
        "idle_reported": {"type": "number", "nullable": True,
                          "description": "When it was reported idle (protection ended)"},
        "blocked_by": {"type": "array", "items": {"type": "string"},
                       "description": "Preempted sessions still holding the granted slice"},
        "inventory": {"type": "string", "enum": ["declared", "nvml"]}}}
    body = {"type": "object", "required": ["user", "project"], "additionalProperties": False,
            "properties": {"user": NAME, "project": NAME,
                           "gpus": {"type": "integer", "minimum": 0, "maximum": 1024},
                           "slice": {"type": "string", "description": "cpu, gpu:N, "
                                     "mig:<profile> or <profile>, mps:<milli>[:<MiB>]"},
                           "gpu_model": {"type": "string"}, "min_runtime": DURATION,
                           "name": {"type": "string", "maxLength": 200}}}
    sid = [_path_param("id")]
    nf = {"404": "No such session"}
    user_q = {"name": "user", "in": "query", "required": False, "schema": NAME,
              "description": "Act for this user (admins)"}
    return {
        "/sessions/offer": {"get": _op(
            "Projects, slice choices and quotes for a spawn form", _resp("Offer"),
            params=[user_q, {"name": "min_runtime", "in": "query", "required": False,
                             "schema": {"type": "string"}}])},
        "/sessions": {
            "get": _op("Interactive sessions", _resp("Sessions"), params=[user_q, STATE_Q]),
            "post": _op("Queue an interactive session (BudgetSpawner)", _resp("Session",
                        session), body=body, params=[IDEM], ok_code="201")},
        "/sessions/{id}": {
            "get": _op("One session; ?wait=S long-polls for a state change",
                       _resp("Session", session), params=[*sid, {
                           "name": "wait", "in": "query", "required": False,
                           "schema": {"type": "number", "minimum": 0, "maximum": 30}}],
                       extra=nf),
            "delete": _op("End a session and its charge", _resp("Session", session),
                          params=[*sid, {"name": "reason", "in": "query", "required": False,
                                         "schema": {"type": "string", "enum": sorted(_REASONS)}}],
                          extra=nf)},
        "/sessions/{id}/heartbeat": {"post": _op("The server is alive: checkpoint the charge",
                                                 _resp("Session", session), params=sid,
                                                 extra=nf)},
        "/sessions/{id}/idle": {"post": _op(
            "Report the session idle: notice, protection ends", _resp("Session", session),
            params=sid, body={"type": "object", "properties": {
                "idle_s": {"type": "number", "minimum": 0}, "source": {"type": "string"}}},
            extra={**nf, "409": "Not running"})},
    }
