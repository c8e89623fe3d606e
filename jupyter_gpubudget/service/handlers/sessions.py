"""Interactive sessions: what BudgetSpawner (running inside JupyterHub) asks of the service.

A session is a workload of kind ``interactive`` with ``backend="hub"``: the service queues and
schedules it and keeps its charge; JupyterHub's spawner starts and stops the server itself.
The endpoints are documented in docs/hub.md and the OpenAPI document.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from jupyter_gpubudget.core.offer import request_for, slice_choices
from jupyter_gpubudget.ledger import Ledger, LedgerError
from jupyter_gpubudget.ledger.bookings import bookings
from jupyter_gpubudget.ledger.models import WorkloadRow
from jupyter_gpubudget.ledger.snapshots import resume_chain

from ..auth import SCOPE_READ, SCOPE_SUBMIT, Caller, Denied, needs_scope
from ..base import ApiError, BaseHandler
from ..delivery import is_notice, notice_of
from ..preempt_warning import RELEASE_KIND, notice_seconds, stop_at
from ..reaper import SESSION_BACKEND
from ..resume import (
    pop_resume_fields,
    requeue_session,
    resume_target,
    snapshot_fields,
    usable_set_or_400,
)
from ..state import request_from_dict, request_to_dict
from ..validate import (
    check_offered,
    duration,
    parse_session,
    parse_slice,
    quote_slice,
    request_from_choice,
)
from ..views import finite, workload_json
from .reservations import booking_json

#: ``DELETE /sessions/{id}?reason=`` -> (new state, how the charge was closed)
END_REASONS = {"stop": ("done", "stop"), "cull": ("done", "cull"),
               "preempt": ("preempted", "preempt"), "failed": ("failed", "exit"),
               "timeout": ("cancelled", "cancel"), "hibernate": ("done", "hibernate")}


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
        out["charged_gpu_hours"] = sum(
            c.milli / 1000 * max(0.0, (now if c.end is None else c.end) - c.start) / 3600
            for c in self.svc.ledger.charges(workload=row.id)) if row.started_at else 0.0
        out["preempt_requested"] = None
        out["preempt_deadline"] = None
        out["preempt_stop_at"] = None
        out["idle_reported"] = None
        if row.state == "running":
            ds = self.svc.ledger.decisions(workloads=[row.id], limit=20)
            for d in ds:
                if d.at < (row.started_at or 0):
                    break
                if d.kind == "preempt-requested" and out["preempt_requested"] is None:
                    out["preempt_requested"] = d.reason or "preempted"
                    # the server is stopped at the latest when the grace period is over
                    grace = self.svc.policy().stop_grace
                    out["preempt_deadline"] = d.at + grace
                    # the lab's notice first (service/preempt_warning.py)
                    out["preempt_stop_at"] = stop_at(
                        d.at, notice_seconds(self.svc.preempt_notice_time, grace), ds)
                if d.kind == "idle" and out["idle_reported"] is None:
                    out["idle_reported"] = d.at
        out.update(snapshot_fields(self.svc, row))
        if row.state == "pending":
            out["free_now"] = self.free_now(row, now)
        out["inventory"] = self.svc.inventory.source
        return out

    def free_now(self, row: WorkloadRow, now: float) -> list[dict]:
        """The other GPU slices that would start at once for this queued session (the queue
        page's hint): ``[{"key", "label", "kind", "fraction"}]``, largest first — from the
        last cycle's scheduler (core/offer.py: ``Quoter.free_now``)."""
        quoter = self.svc.loop.view.quoter
        own = request_from_dict(row.request)
        if own.kind == "cpu" or quoter is None:  # CPU-only work does not wait for a GPU
            return []
        choices = [ch for ch in slice_choices(self.svc.inventory) if ch["kind"] != "cpu"
                   and (not own.gpu_model or request_for(ch["key"]).kind == "mig"
                        or ch.get("gpu_model") in (None, own.gpu_model))]
        keys = set(quoter.free_now(own, [ch["key"] for ch in choices], now))
        free = [ch for ch in choices if ch["key"] in keys]
        free.sort(key=lambda ch: -ch["fraction"])
        return [{k: ch[k] for k in ("key", "label", "kind", "fraction")} for ch in free]


class OfferHandler(_SessionBase):
    """Projects, slice choices and quotes for a spawn form: answered from the last cycle's
    scheduler and forecast (core/offer.py), never by running a cycle per choice."""

    async def get(self) -> None:
        _, user = await self.acting_for(self.get_query_argument("user", None))
        tree = self.tree
        projects = tree.projects_of(user)
        min_runtime = duration(self.get_query_argument("min_runtime", "1h"), "min_runtime")
        choices = slice_choices(self.svc.inventory)
        svc = self.svc
        keys = [c["key"] for c in choices]
        want = self.get_query_argument("slice", None)
        if want is not None:  # one quote (the form's live quote for the current choice)
            if want not in keys:
                raise ApiError(400, f"slice: not offered here (one of {', '.join(keys)})",
                               "slice")
            keys = [want]
        only = self.get_query_argument("project", None)
        if only is not None:
            if only not in projects:
                raise ApiError(403, f"user {user!r} is not a member of project {only!r}",
                               "project")
            projects = [only]
        now = svc.clock()
        quoter = svc.loop.view.quoter
        want_quotes = self.get_query_argument("quotes", "1") not in ("0", "false", "no")
        quotes = {}
        if want_quotes and quoter is not None:  # CPU work: off the event loop
            quotes = await asyncio.get_running_loop().run_in_executor(
                svc.db_pool, quoter.offer, user, projects, keys, min_runtime, now)
        pol = svc.policy()
        booked = await self.db(lambda: [booking_json(r, now) for r in bookings(
            svc.ledger, ending_after=now, projects=projects)])
        self.send({"user": user, "projects": projects, "choices": choices, "bookings": booked,
                   "figures": {p: self.figures(p) for p in projects},
                   "min_runtime": min_runtime, "min_runtime_cap": pol.cap_for("interactive"),
                   "window_s": pol.window, "inventory": svc.inventory.source, "now": now,
                   "quotes_computed_at": quoter.at if quoter is not None else None,
                   "inventory_gpus": svc.inventory.gpu_count, "quotes": quotes,
                   "clusters": self.clusters()})

    def clusters(self) -> list[dict]:
        """The clusters a session may name, with their GPUs and models (one entry, 'default',
        where the service schedules one cluster: the form then offers no choice)."""
        inv = self.svc.inventory
        out = []
        for name in inv.clusters:
            nodes = [n for n in inv.nodes if n.cluster == name]
            models = sorted({g.model for n in nodes for g in n.gpus})
            out.append({"name": name, "gpus": sum(len(n.gpus) for n in nodes),
                        "nodes": len(nodes), "models": models})
        return out

    def figures(self, project: str) -> dict:
        """A project's budget as the last cycle saw it: grant, used, left (GPU-hours in the
        window) and standing (used / grant; null without a grant)."""
        st = self.svc.loop.view.standings.get(project, {})
        grant, used = finite(st.get("grant_hours")), finite(st.get("usage_hours"))
        return {"grant_hours": grant, "usage_hours": used,
                "left_hours": None if grant is None or used is None else grant - used,
                "standing": finite(st.get("standing")),
                "parent": self.tree.get(project).parent}


class QuoteHandler(_SessionBase):
    """One quote — one project, one slice, one minimum runtime — for the spawn form's live
    quote, from the last cycle's scheduler and forecast (about a millisecond)."""

    async def get(self) -> None:
        _, user = await self.acting_for(self.get_query_argument("user", None))
        project = self.get_query_argument("project", "")
        if not project:
            raise ApiError(400, "project: is required", "project")
        key = quote_slice({k: self.get_query_argument(k) for k in self.request.query_arguments})
        req = request_from_choice(key)
        named = self.get_query_argument("cluster", None)
        if named:  # a quote for one cluster (else: wherever it starts sooner)
            req = replace(req, cluster=parse_slice({"cluster": named}).cluster)
        min_runtime = duration(self.get_query_argument("min_runtime", "1h"), "min_runtime")
        tree, svc = self.tree, self.svc
        mine = tree.projects_of(user)
        if project not in mine:
            raise ApiError(403, f"user {user!r} is not a member of project {project!r} "
                                f"(their projects: {', '.join(mine) or 'none'})", "project")
        check_offered(svc.inventory, req)

        quoter = svc.loop.view.quoter
        if quoter is None:
            raise ApiError(503, "no scheduling cycle has run yet; retry", retry_after=2)
        now = svc.clock()
        q = await asyncio.get_running_loop().run_in_executor(
            svc.db_pool, quoter.quote, user, project, key, req, min_runtime, now)
        pol = svc.policy()
        self.send({"user": user, "project": project, "slice": key, "min_runtime": min_runtime,
                   "min_runtime_cap": pol.cap_for("interactive"), "now": now, "quote": q})


class SessionsHandler(_SessionBase):
    async def get(self) -> None:
        c, user = await self.acting_for(self.get_query_argument("user", None))
        states = self.query_states()
        who = None if (c.is_admin and self.get_query_argument("user", None) is None) else user

        def read() -> list[dict]:
            return [self.session_json(r) for r in self.svc.ledger.workloads(
                user=who, states=states, backend=SESSION_BACKEND)]

        self.send({"sessions": await self.db(read)})

    @needs_scope(SCOPE_SUBMIT)
    async def post(self) -> None:
        c = await self.caller()
        body = self.body()
        extra = pop_resume_fields(body)
        sess = parse_session(body)
        sess.update(extra)
        user, project = sess["user"], sess["project"]
        if user != c.name and not c.is_admin:
            raise Denied(f"only gpubudget admins may start a session for another user ({user!r})")
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
                time_limit=None, backend=SESSION_BACKEND, name=sess["name"],
                cluster=sess["request"].cluster,
                max_pending=self.svc.policy().max_pending_per_user, s=s)
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
    @needs_scope(SCOPE_READ)
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

    @needs_scope(SCOPE_SUBMIT)
    async def delete(self, wid: str) -> None:
        """End the session (its server is stopped by the hub): its own user with the submit
        scope, or an admin (the spawner's token); a read-only token gets a 403."""
        c = await self.caller()
        row = await self.session_or_404(wid)
        c.require_change_workload(row.user)
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


class ReleaseHandler(_SessionBase):
    @needs_scope(SCOPE_SUBMIT)
    async def post(self, wid: str) -> None:
        """"Save and release now": the owner lets the preemption of their session go ahead
        now, after the lab saved the notebooks (its kernels are still saved and restored);
        409 when it is not being preempted."""
        c = await self.caller()
        row = await self.session_or_404(wid)
        c.require_change_workload(row.user)
        svc = self.svc

        def work() -> bool:
            fresh = svc.ledger.get(wid)
            if fresh is None or fresh.state != "running":
                return False
            if not any(d.kind == "preempt-requested" and d.at >= (fresh.started_at or 0)
                       for d in svc.ledger.decisions(workloads=[wid], limit=20)):
                return False
            svc.ledger.record_decision(now=svc.clock(), kind=RELEASE_KIND, workload=wid,
                                       actor=c.name, reason="released by its owner")
            return True

        if not await self.db(work):
            raise ApiError(409, "this session is not being preempted: stop the server from "
                                "the hub's control panel to release its GPU")
        await self.send_session(wid)


class HeartbeatHandler(_SessionBase):
    @needs_scope(SCOPE_SUBMIT)
    async def post(self, wid: str) -> None:
        c = await self.caller()
        row = await self.session_or_404(wid)
        c.require_change_workload(row.user)
        body = self.body() or {}
        if not isinstance(body, dict):
            raise ApiError(400, "body: expected a JSON object", "body")
        util = body.get("gpu_utilisation")
        if util is not None and (isinstance(util, bool) or not isinstance(util, int | float)
                                 or not 0 <= util <= 100):
            raise ApiError(400, "gpu_utilisation: expected a percent (0..100)",
                           "gpu_utilisation")
        if row.state == "running":
            await self.db(self.svc.ledger.checkpoint, self.svc.clock(), [wid])
            if util is not None:  # the hub's idle sampler (NVML): exported in /metrics
                self.svc.session_util[wid] = (float(util), self.svc.clock(), row.user,
                                              row.project)
        else:
            self.svc.session_util.pop(wid, None)
        self.send(await self.db(self.session_json, row))


class IdleHandler(_SessionBase):
    @needs_scope(SCOPE_SUBMIT)
    async def post(self, wid: str) -> None:
        c = await self.caller()
        row = await self.session_or_404(wid)
        c.require_change_workload(row.user)
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
#: how a segment ended, in words, by the kind of the decision that ended it
_ENDED = {"preempt": "preempted", "requeue": "preempted", "hibernate": "hibernated",
          "timeout": "reached its time limit", "cancel": "cancelled"}
#: why, in a few words, by the notice's cause (a drain adds the admins' note)
_WHY = {"needed": "its GPU slice was needed", "drain": "node drained", "idle": "idle",
        "hibernate": "idle", "time_limit": "time limit", "cancel": "cancelled by an administrator"}


def session_history(ledger: Ledger, wid: str, now: float) -> dict:
    """What the user sees as one server across preemptions: the session ``wid`` and the
    ones it resumed, as segments (one per charge interval, oldest first) with where each
    ran, what it cost (slice share × wall time, GPU-hours) and how and why it ended."""
    chain = list(reversed(resume_chain(ledger, wid)))
    segments: list[dict] = []
    for w in chain:
        row = ledger.get(w)
        if row is None:
            continue
        charges = ledger.charges(workload=w)
        decisions = sorted(ledger.decisions(workloads=[w], limit=500), key=lambda d: d.id)
        starts = [d for d in decisions if d.kind == "start"]
        for i, c in enumerate(charges):
            start = next((d for d in starts if d.at == c.start), None)
            if start is None and i < len(starts):
                start = starts[i]
            placement = list((start.detail or {}).get("placement") or []) if start else []
            until = charges[i + 1].start if i + 1 < len(charges) else float("inf")
            ended = why = None
            if c.end is not None:
                ended = "stopped"
                ends = [d for d in decisions if c.start <= d.at <= until
                        and d.kind in _ENDED and is_notice(d, row)]
                if ends:
                    d = ends[-1]
                    n = notice_of(ledger, d, row)
                    ended = _ENDED[d.kind]
                    why = _WHY.get(n.cause) or n.title
                    if n.cause == "drain":
                        notes = ledger.node_notes(sorted({p.get("node") for p in placement
                                                          if p.get("node")}))
                        if notes:
                            why += ": " + "; ".join(notes.values())
                elif row.state == "done" and i == len(charges) - 1:
                    ended = "ended"
            end = now if c.end is None else c.end
            segments.append({
                "workload": w, "start": c.start, "end": c.end, "ended": ended, "why": why,
                "placement": placement,
                "nodes": sorted({p.get("node") for p in placement if p.get("node")}),
                "gpu_hours": c.milli / 1000 * max(0.0, end - c.start) / 3600})
    return {"session": wid, "computed_at": now, "segments": segments,
            "total_gpu_hours": sum(g["gpu_hours"] for g in segments)}


class SessionHistoryHandler(_SessionBase):
    @needs_scope(SCOPE_READ)
    async def get(self, wid: str) -> None:
        """The session's segments across preemptions and restores (``session_history``)."""
        c = await self.caller()
        row = await self.session_or_404(wid)
        c.require_see_workload(row.user)
        self.send(await self.db(session_history, self.svc.ledger, row.id, self.svc.clock()))


API_ROUTES = [
    ("/sessions/offer", OfferHandler),
    ("/sessions/quote", QuoteHandler),
    ("/sessions", SessionsHandler),
    (f"/sessions/{SESSION_ID}", SessionHandler),
    (f"/sessions/{SESSION_ID}/heartbeat", HeartbeatHandler),
    (f"/sessions/{SESSION_ID}/idle", IdleHandler),
    (f"/sessions/{SESSION_ID}/history", SessionHistoryHandler),
    (f"/sessions/{SESSION_ID}/release", ReleaseHandler),
]
