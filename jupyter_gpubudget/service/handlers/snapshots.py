"""Snapshots of interactive sessions: listing them, asking for one or for a restore, and what
the users' servers report (a snapshot taken, one found bad, what a restore brought back, a
loss). The snapshots themselves are taken and stored by the user's server (see
``jupyter_gpubudget.serverext.snapshot``); the ledger keeps one row per snapshot *set* (all
kernels of the server, taken together).

- ``GET  /snapshots[?user=]`` — the caller's snapshots (admins: anyone's, or all).
- ``GET  /snapshots/{id}`` — one.
- ``PUT  /snapshots/{id}`` — a user's server records a snapshot it took (idempotent).
- ``POST /snapshots/{id}/bad`` — a user's server found it does not verify.
- ``POST /snapshots/{id}/restore`` — ask for a restore: into the running server of its session
  (delivered to the server by BudgetSpawner), else by starting the server again from it.
- ``GET  /sessions/{id}/snapshots`` — a session's snapshots (and those of the sessions it
  resumed), retention and quota, open requests.
- ``POST /sessions/{id}/snapshots`` — ask the running server for a snapshot now.
- ``POST /sessions/{id}/restored`` — the server reports what a restore brought back.
- ``POST /sessions/{id}/lost`` — BudgetSpawner reports that no snapshot could be taken in
  time: the session's kernel state is lost (recorded, shown to the user).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from jupyter_gpubudget.ledger import LedgerError
from jupyter_gpubudget.ledger import snapshots as snapledger
from jupyter_gpubudget.ledger.models import SnapshotRow

from ..auth import SCOPE_SUBMIT, Caller, Denied, needs_scope
from ..base import ApiError, BaseHandler
from ..reaper import SESSION_BACKEND
from ..validate import MAX_DB_INT

SET_ID = r"([A-Za-z0-9][A-Za-z0-9._-]{0,47}--[0-9a-f]{11,13}-[0-9a-f]{6})"
_SET_RE = re.compile("^" + SET_ID + "$")
SESSION_ID = r"([A-Za-z0-9][A-Za-z0-9_.@+-]{0,199})"
REASONS = ("user", "preempt", "hibernate")


def _int(body: dict, k: str, lo: int = 0) -> int:
    v = body.get(k, 0)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= MAX_DB_INT:
        raise ApiError(400, f"{k}: expected a whole number from {lo} to {MAX_DB_INT}", k)
    return v


def _num(body: dict, k: str) -> float:
    v = body.get(k)
    # compared before float(): a 400-digit integer does not fit a float (OverflowError)
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1e15:
        raise ApiError(400, f"{k}: expected a number from 0 to 1e15", k)
    return float(v)


def _str(body: dict, k: str, n: int = 2000, required: bool = False) -> str | None:
    v = body.get(k)
    if v is None and not required:
        return None
    if not isinstance(v, str) or len(v) > n:
        raise ApiError(400, f"{k}: expected a string of at most {n} characters", k)
    return v


class _Base(BaseHandler):
    def obj(self) -> dict:
        b = self.body()
        if b is None:
            b = {}
        if not isinstance(b, dict):
            raise ApiError(400, "body: expected a JSON object", "body")
        return b

    async def session_or_404(self, wid: str) -> Any:
        row = await self.db(self.svc.ledger.get, wid)
        if row is None or row.backend != SESSION_BACKEND:
            raise ApiError(404, f"no session {wid!r}")
        return row

    async def own_session(self, c: Caller, wid: str, write: bool = False) -> Any:
        """The session, seen (404 before 403) and, for a change, the caller's own with the
        submit scope (or an admin)."""
        row = await self.session_or_404(wid)
        if write:
            c.require_change_workload(row.user)
        else:
            c.require_see_workload(row.user)
        return row

    async def set_or_404(self, c: Caller, set_id: str) -> tuple[SnapshotRow, Any]:
        def read() -> tuple[SnapshotRow | None, Any]:
            with self.svc.ledger.ro() as s:
                r = s.get(SnapshotRow, set_id)
            return r, (self.svc.ledger.get(r.workload) if r is not None else None)

        row, w = await self.db(read)
        if row is None or w is None:
            raise ApiError(404, f"no snapshot {set_id!r}")
        c.require_see_workload(w.user)
        return row, w


class SnapshotsHandler(_Base):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        user = self.get_query_argument("user", None)
        if user is not None and user != c.name and not c.is_admin:
            raise Denied(f"only gpubudget admins may list another user's snapshots ({user!r})")
        who = None if (c.is_admin and user is None) else (user or c.name)

        def read() -> list[dict]:
            out = []
            for row, w in snapledger.sets_of_user(self.svc.ledger, who):
                out.append({**snapledger.set_json(row), "user": w.user, "server": w.name,
                            "session_state": w.state})
            return out

        self.send({"snapshots": await self.db(read)})


class SnapshotHandler(_Base):
    async def get(self, set_id: str) -> None:
        c = await self.caller()
        row, w = await self.set_or_404(c, set_id)
        self.send({**snapledger.set_json(row), "user": w.user, "server": w.name,
                   "session_state": w.state})

    @needs_scope(SCOPE_SUBMIT)
    async def put(self, set_id: str) -> None:
        """A user's server records a snapshot set it took."""
        c = await self.caller()
        b = self.obj()
        session = _str(b, "session", 200, required=True)
        assert session is not None
        if not set_id.startswith(session + "--"):
            raise ApiError(400, f"session: snapshot {set_id} is not of session {session}",
                           "session")
        w = await self.own_session(c, session, write=True)
        if b.get("project") != w.project:
            raise ApiError(400, f"project: session {session} is charged to {w.project!r}",
                           "project")
        if b.get("reason", "user") not in REASONS:
            raise ApiError(400, f"reason: one of {', '.join(REASONS)}", "reason")
        _num(b, "created_at")
        for k in ("stored_bytes", "raw_bytes"):
            _int(b, k)
        members = b.get("members", [])
        if not isinstance(members, list) or len(members) > 100 or not all(
                isinstance(m, dict) for m in members):
            raise ApiError(400, "members: expected at most 100 objects", "members")
        for i, m in enumerate(members):
            for k in ("sessions", "variables"):
                if not isinstance(m.get(k, []), list):
                    raise ApiError(400, f"members[{i}].{k}: expected a list", f"members[{i}]")
            if not isinstance(m.get("unsaved", {}), dict):
                raise ApiError(400, f"members[{i}].unsaved: expected an object",
                               f"members[{i}]")
        pruned = b.get("pruned", [])
        if not isinstance(pruned, list) or not all(
                isinstance(p, str) and _SET_RE.fullmatch(p) and p.startswith(session + "--")
                for p in pruned):
            raise ApiError(400, "pruned: expected snapshot ids of this session", "pruned")
        request = _str(b, "request", 64)
        summary = {**b, "id": set_id, "session": session, "project": w.project,
                   "request": request}

        def record() -> dict:
            row = snapledger.record_set(self.svc.ledger, summary, self.svc.clock(), c.name)
            return snapledger.set_json(row)

        self.send(await self.db(record))


class SnapshotBadHandler(_Base):
    @needs_scope(SCOPE_SUBMIT)
    async def post(self, set_id: str) -> None:
        c = await self.caller()
        row, w = await self.set_or_404(c, set_id)
        c.require_change_workload(w.user)
        problem = _str(self.obj(), "problem", 2000, required=True)

        def mark() -> dict:
            try:
                snapledger.mark_snapshot_bad(self.svc.ledger, set_id, problem or "",
                                             self.svc.clock())
            except LedgerError:
                pass
            with self.svc.ledger.ro() as s:
                r = s.get(SnapshotRow, set_id)
            return snapledger.set_json(r)

        self.send(await self.db(mark))


def _request(svc: Any, wid: str, actor: str, action: str, snapshot: str | None) -> str:
    rid = secrets.token_hex(6)
    svc.ledger.record_decision(now=svc.clock(), kind="snapshot-request", workload=wid,
                               actor=actor, reason=f"{action} asked by {actor}",
                               detail={"request": rid, "action": action, "snapshot": snapshot})
    return rid


class SnapshotRestoreHandler(_Base):
    @needs_scope(SCOPE_SUBMIT)
    async def post(self, set_id: str) -> None:
        """Ask for a restore: into the server of its session when that runs (or of the
        session resuming it), else by starting the user's server again from it."""
        c = await self.caller()
        row, w = await self.set_or_404(c, set_id)
        c.require_change_workload(w.user)
        if row.status != "ok":
            raise ApiError(409, f"snapshot {set_id} is {row.status}"
                                + (f": {row.problem}" if row.problem else ""))
        svc = self.svc

        def work() -> tuple[int, dict]:
            # the running session that is this server now (the snapshot's, or a later one
            # of the same server name)
            live = [r for r in svc.ledger.workloads(user=w.user, states=("running",),
                                                    backend=SESSION_BACKEND)
                    if r.name == w.name]
            if live:
                rid = _request(svc, live[0].id, c.name, "restore", set_id)
                return 202, {"request": rid, "session": live[0].id,
                             "how": "restored into the running server"}
            queued = [r for r in svc.ledger.workloads(user=w.user, states=("pending",),
                                                      backend=SESSION_BACKEND)
                      if r.name == w.name]
            if queued:
                raise ApiError(409, f"the server {w.name} is queued (session "
                                    f"{queued[0].id}): restore once it runs")
            now = svc.clock()
            with svc.loop.lock:
                new = svc.ledger.submit(
                    project=w.project, user=w.user, kind="interactive", now=now,
                    request=dict(w.request), command=None, env=None,
                    min_runtime=w.min_runtime, resumable=True, time_limit=None,
                    backend=SESSION_BACKEND, name=w.name,
                    max_pending=svc.policy().max_pending_per_user)
                svc.ledger.record_decision(
                    now=now, kind="resume", workload=new.id, actor=c.name,
                    reason=f"restore of snapshot {set_id} asked by {c.name}",
                    detail={"resumes": w.id, "snapshot": set_id,
                            "reason": "restore asked by its user", "spawn": "service"})
            return 202, {"session": new.id, "request": None,
                         "how": "the server is queued and starts from this snapshot"}

        status, body = await self.db(work)
        self.svc.kick()
        self.svc.wake_resumer()
        self.send(body, status)


class SessionSnapshotsHandler(_Base):
    async def get(self, wid: str) -> None:
        c = await self.caller()
        w = await self.own_session(c, wid)
        svc = self.svc

        def read() -> dict:
            chain = snapledger.resume_chain(svc.ledger, wid)
            rows = snapledger.sets_of(svc.ledger, chain)
            quota = svc.snapshot_quota_of(w.project)
            return {
                "session": wid, "sessions": chain,
                "snapshots": [snapledger.set_json(r) for r in rows],
                "keep_last": svc.snapshot_keep_last,
                "quota_bytes": quota or None,
                "project_bytes": snapledger.project_bytes(svc.ledger, w.project),
                "others_bytes": snapledger.project_bytes(svc.ledger, w.project,
                                                         exclude_user=w.user),
                "requests": snapledger.open_requests(svc.ledger, wid, w.started_at or 0.0)
                if w.state == "running" else [],
            }

        self.send(await self.db(read))

    @needs_scope(SCOPE_SUBMIT)
    async def post(self, wid: str) -> None:
        """Ask the running server for a snapshot now (delivered by BudgetSpawner)."""
        c = await self.caller()
        w = await self.own_session(c, wid, write=True)
        if w.state != "running":
            raise ApiError(409, f"session {wid} is {w.state}: only a running server can take "
                                "a snapshot")
        rid = await self.db(_request, self.svc, wid, c.name, "snapshot", None)
        self.send({"request": rid, "session": wid}, 202)


class SessionRequestHandler(_Base):
    async def get(self, wid: str, rid: str) -> None:
        """What became of a snapshot or restore request (``state``: open, done, failed)."""
        c = await self.caller()
        await self.own_session(c, wid)
        out = await self.db(snapledger.request_outcome, self.svc.ledger, wid, rid)
        if out is None:
            self.send({"request": rid, "state": "open"})
        else:
            self.send({"request": rid, "state": "failed" if out["kind"].endswith("failed")
                       else "done", **out})

    @needs_scope(SCOPE_SUBMIT)
    async def post(self, wid: str, rid: str) -> None:
        """A server or spawner could not carry a request out: say why."""
        c = await self.caller()
        await self.own_session(c, wid, write=True)
        why = _str(self.obj(), "error", 2000, required=True)
        await self.db(lambda: self.svc.ledger.record_decision(
            now=self.svc.clock(), kind="snapshot-request-failed", workload=wid, actor=c.name,
            reason=why or "", detail={"request": rid}))
        self.send({"request": rid, "state": "failed", "reason": why})


class SessionRestoredHandler(_Base):
    @needs_scope(SCOPE_SUBMIT)
    async def post(self, wid: str) -> None:
        c = await self.caller()
        await self.own_session(c, wid, write=True)
        b = self.obj()
        summary = _str(b, "summary", 4000) or ""
        kernels = b.get("kernels", [])
        if not isinstance(kernels, list) or len(kernels) > 100 or not all(
                isinstance(k, dict) for k in kernels):
            raise ApiError(400, "kernels: expected at most 100 objects", "kernels")
        snap = b.get("snapshot")
        if snap is not None and not (isinstance(snap, str) and _SET_RE.fullmatch(snap)):
            raise ApiError(400, "snapshot: expected a snapshot id", "snapshot")
        keep = ("kernel_name", "notebooks", "method", "everything", "restored", "recomputed",
                "lost", "unsaved", "notes", "error", "reimported")
        detail = {
            "snapshot": snap, "asked": b.get("asked") if isinstance(b.get("asked"), str)
            else None, "summary": summary, "error": _str(b, "error", 2000),
            "kernels": [{k: x.get(k) for k in keep} for x in kernels],
            "skipped": b.get("skipped") if isinstance(b.get("skipped"), list) else [],
            "taken_at": b.get("taken_at") if isinstance(b.get("taken_at"), int | float)
            else None,
            "seconds": b.get("seconds") if isinstance(b.get("seconds"), int | float) else None,
            "request": _str(b, "request", 64)}
        if len(repr(detail)) > 200_000:
            raise ApiError(400, "body: a restore report of at most 200 kB", "body")
        await self.db(lambda: self.svc.ledger.record_decision(
            now=self.svc.clock(), kind="restore", workload=wid, actor=c.name,
            reason=summary[:2000], detail=detail))
        self.send({"session": wid, "restored": detail})


class SessionLostHandler(_Base):
    @needs_scope(SCOPE_SUBMIT)
    async def post(self, wid: str) -> None:
        c = await self.caller()
        w = await self.own_session(c, wid, write=True)
        b = self.obj()
        reason = _str(b, "reason", 2000, required=True) or ""
        kernels = b.get("kernels", [])
        if not isinstance(kernels, list) or len(kernels) > 100:
            raise ApiError(400, "kernels: expected at most 100 entries", "kernels")
        await self.db(snapledger.record_snapshot_loss, self.svc.ledger, wid, reason,
                      self.svc.clock(), {"kernels": kernels, "by": c.name,
                                         "state": w.state})
        self.svc.log.warning("session %s of %s: kernel state lost: %s", wid, w.user, reason)
        self.send({"session": wid, "lost": reason})


API_ROUTES = [
    ("/snapshots", SnapshotsHandler),
    (f"/snapshots/{SET_ID}", SnapshotHandler),
    (f"/snapshots/{SET_ID}/bad", SnapshotBadHandler),
    (f"/snapshots/{SET_ID}/restore", SnapshotRestoreHandler),
    (f"/sessions/{SESSION_ID}/snapshots", SessionSnapshotsHandler),
    (f"/sessions/{SESSION_ID}/requests/([0-9a-f]{{12}})", SessionRequestHandler),
    (f"/sessions/{SESSION_ID}/restored", SessionRestoredHandler),
    (f"/sessions/{SESSION_ID}/lost", SessionLostHandler),
]
