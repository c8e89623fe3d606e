"""Interactive sessions: what BudgetSpawner (running inside JupyterHub) asks of the service.

A session is a workload of kind ``interactive`` with ``backend="hub"``: the service queues and
schedules it and keeps its charge; JupyterHub's spawner starts and stops the server itself.
The endpoints are documented in docs/hub.md and the OpenAPI document.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpubudget.core.offer import estimate_start, not_offered, quote, slice_choices
from jupyter_gpubudget.ledger import LedgerError
from jupyter_gpubudget.ledger.models import WorkloadRow

from ..auth import SCOPE_SUBMIT, Caller, Denied
from ..base import ApiError, BaseHandler
from ..reaper import SESSION_BACKEND
from ..resume import (
    pop_resume_fields,
    requeue_session,
    resume_target,
    snapshot_fields,
    usable_set_or_400,
)
from ..state import request_to_dict
from ..validate import Invalid, duration, parse_session, request_from_choice
from ..views import workload_json

#: ``DELETE /sessions/{id}?reason=`` -> (new state, how the charge was closed)
END_REASONS = {"stop": ("done", "stop"), "cull": ("done", "cull"),
               "preempt": ("preempted", "preempt"), "failed": ("failed", "exit"),
               "timeout": ("cancelled", "cancel"), "hibernate": ("done", "hibernate")}


def check_offered(inventory: Any, req: Any) -> None:
    """400 (naming the field) for a request no hardware here could ever hold."""
    why = not_offered(inventory, req)
    if why is not None:
        raise Invalid(*why)


class _SessionBase(BaseHandler):
    async def acting_for(self, user: str | None) -> tuple[Caller, str]:
        c = await self.caller()
        c.require_read()
        user = user or c.name
        if user != c.name and not c.is_admin:
            raise Denied(f"only gpubudget admins may act for another user ({user!r})")
        return c, user

    async def session_or_404(self, wid: str) -> WorkloadRow:
        row = await self.db(self.svc.ledger.get, wid)
        if row is None or row.backend != SESSION_BACKEND:
            raise ApiError(404, f"no session {wid!r}")
        self.svc.session_seen[wid] = self.svc.clock()
        return row

    async def send_session(self, wid: str, status: int = 200) -> None:
        """Answer with the session as it is now in the ledger."""

        def read() -> dict:
            row = self.svc.ledger.get(wid)
            assert row is not None
            return self.session_json(row)

        self.send(await self.db(read), status)

    def session_json(self, row: WorkloadRow) -> dict:
        now, view = self.svc.clock(), self.svc.loop.view
        out = workload_json(row, view, now)
        out["preempt_requested"] = None
        out["preempt_deadline"] = None
        out["idle_reported"] = None
        if row.state == "running":
            for d in self.svc.ledger.decisions(workloads=[row.id], limit=20):
                if d.at < (row.started_at or 0):
                    break
                if d.kind == "preempt-requested" and out["preempt_requested"] is None:
                    out["preempt_requested"] = d.reason or "preempted"
                    # the server is stopped at the latest when the grace period is over
                    out["preempt_deadline"] = d.at + self.svc.policy().stop_grace
                if d.kind == "idle" and out["idle_reported"] is None:
                    out["idle_reported"] = d.at
        out.update(snapshot_fields(self.svc, row))
        if row.state == "pending" and out["predicted_start"] is None:
            pos = out["queue_position"] or 1
            state, _ = self.svc.loop.build_state(now)
            out["predicted_start"] = estimate_start(state, pos, now)
            out["predicted_start_kind"] = "estimate"
        out["inventory"] = self.svc.inventory.source
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
            state, _ = svc.loop.build_state(now, tree)
            quotes = {p: {ch["key"]: quote(state, user, p, request_from_choice(ch["key"]),
                                           min_runtime, now) for ch in choices}
                      for p in projects}
            return {"now": now, "quotes": quotes}

        q = await self.db(work)
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

        def read() -> list[dict]:
            return [self.session_json(r) for r in self.svc.ledger.workloads(
                user=who, states=states, backend=SESSION_BACKEND)]

        self.send({"sessions": await self.db(read)})

    async def post(self) -> None:
        c = await self.caller()
        body = self.body()
        extra = pop_resume_fields(body)
        sess = parse_session(body)
        sess.update(extra)
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
        resumes = await self.db(resume_target, self.svc, sess, user)

        def apply(s):  # noqa: ANN001, ANN202
            row = self.svc.ledger.submit(
                project=project, user=user, kind="interactive", now=now,
                request=request_to_dict(sess["request"]), command=None, env=None,
                min_runtime=sess["min_runtime"], resumable=resumes is not None,
                time_limit=None, backend=SESSION_BACKEND, name=sess["name"], s=s)
            if resumes is not None:
                self.svc.ledger.record_decision(
                    now=now, kind="resume", workload=row.id, actor=c.name,
                    reason=f"resumes session {resumes['resumes']} from snapshot "
                           f"{resumes['snapshot']}", detail={**resumes, "spawn": "hub"}, s=s)
            return 201, {"id": row.id}

        key = self.idem_key(c)
        if key is None:
            status, body = await self.db(apply, None)
        else:
            status, body = await self.db(self.idempotent, key, apply, now)
        self.svc.session_seen[body["id"]] = now
        self.svc.kick()
        await self.send_session(body["id"], status)


class SessionHandler(_SessionBase):
    async def get(self, wid: str) -> None:
        """``?wait=S``: long-poll, answer as soon as the state changes (at most S seconds,
        S <= 30), so a spawn starts within one cycle of being granted."""
        c = await self.caller()
        row = await self.session_or_404(wid)
        c.require_see_workload(row.user)
        try:
            wait = min(30.0, max(0.0, float(self.get_query_argument("wait", "0"))))
        except ValueError:
            raise ApiError(400, "wait: expected seconds", "wait") from None
        if wait and row.state in ("pending", "running"):
            # woken by the ledger's own writes (a cycle, a stop), never by polling it; a
            # finished session cannot change, so it is answered at once
            first, deadline = row.state, self.svc.clock() + wait
            while row.state == first:
                left = deadline - self.svc.clock()
                if left <= 0 or not await self.svc.wait_for_change(left):
                    break
                row = await self.session_or_404(wid)
        self.send(await self.db(self.session_json, row))

    async def delete(self, wid: str) -> None:
        c = await self.caller()
        row = await self.session_or_404(wid)
        c.require_see_workload(row.user)
        reason = self.get_query_argument("reason", "stop")
        if reason not in END_REASONS:
            raise ApiError(400, f"reason: one of {', '.join(sorted(END_REASONS))}", "reason")
        state, closed_by = END_REASONS[reason]
        if row.state == "pending":
            state, closed_by = "cancelled", "cancel"
        requeue = self.get_query_argument("requeue", None)
        keep = self.get_query_argument("snapshot", None)
        if requeue is not None and (reason != "preempt" or row.state != "running"):
            raise ApiError(400, "requeue: only a running session that is preempted is "
                                "requeued", "requeue")
        if keep is not None and reason != "hibernate":
            raise ApiError(400, "snapshot: only with reason=hibernate", "snapshot")
        svc = self.svc
        for name, sid in (("requeue", requeue), ("snapshot", keep)):
            if sid is not None:
                await self.db(usable_set_or_400, svc, sid, wid, name)
        requeued_as = None
        if row.state in ("pending", "running"):

            def work() -> str | None:
                with svc.loop.lock:
                    try:
                        svc.ledger.stop(wid, now=svc.clock(), state=state, closed_by=closed_by,
                                        reason=f"{reason} (by {c.name})", actor=c.name)
                    except LedgerError as e:
                        if e.status != 409:
                            raise
                        return None
                    if keep is not None:
                        svc.ledger.record_decision(
                            now=svc.clock(), kind="hibernate", workload=wid, actor=c.name,
                            reason=f"idle: snapshot {keep} taken, slice released",
                            detail={"snapshot": keep})
                    if requeue is not None:
                        return requeue_session(svc, row, requeue, c.name)
                    return None

            requeued_as = await self.db(work)
            self.svc.kick()
            if requeued_as or keep:
                self.svc.wake_resumer()

        def read() -> dict:
            fresh = svc.ledger.get(wid)
            assert fresh is not None
            out = self.session_json(fresh)
            out["requeued_as"] = requeued_as
            return out

        self.send(await self.db(read))


class HeartbeatHandler(_SessionBase):
    async def post(self, wid: str) -> None:
        c = await self.caller()
        row = await self.session_or_404(wid)
        c.require_see_workload(row.user)
        if row.state == "running":
            await self.db(self.svc.ledger.checkpoint, self.svc.clock(), [wid])
        self.send(await self.db(self.session_json, row))


class IdleHandler(_SessionBase):
    async def post(self, wid: str) -> None:
        c = await self.caller()
        row = await self.session_or_404(wid)
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

        def record() -> None:
            with self.svc.ledger.tx() as s:
                w = s.get(WorkloadRow, wid)
                if w is not None and (w.protected_until is None or w.protected_until > now):
                    w.protected_until = now  # idle past the limit: no longer protected
                self.svc.ledger.record_decision(
                    now=now, kind="idle", workload=wid, actor=c.name,
                    reason=f"idle for {idle_s / 60:.0f} min ({source}); now preemptible",
                    detail={"idle_s": idle_s, "source": source}, s=s)

        await self.db(record)
        self.svc.log.warning("session %s of %s (%s) idle for %.0f s (%s): reported to the user "
                             "and admins; now preemptible", wid, row.user, row.project, idle_s,
                             source)
        self.svc.kick()
        await self.send_session(wid)


SESSION_ID = r"([A-Za-z0-9][A-Za-z0-9_.@+-]{0,199})"
API_ROUTES = [
    ("/sessions/offer", OfferHandler),
    ("/sessions", SessionsHandler),
    (f"/sessions/{SESSION_ID}", SessionHandler),
    (f"/sessions/{SESSION_ID}/heartbeat", HeartbeatHandler),
    (f"/sessions/{SESSION_ID}/idle", IdleHandler),
]
