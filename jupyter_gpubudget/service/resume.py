"""Sessions that come back from a snapshot: requeued after a preemption, resumed after a
hibernation or on request, and the hub calls that bring their servers back.

**Requeue** (preemption): BudgetSpawner, once the user's server has taken a verified snapshot
and stopped, ends the session with ``DELETE /sessions/{A}?reason=preempt&requeue={snapshot}``.
In the same transaction the service queues a new session B — same user, project, request,
minimum runtime and server name, ``resumable`` — with a ``resume`` decision naming A and the
snapshot. A stopped JupyterHub server needs a spawn request to start again, so the service
then asks the hub (its token needs the ``servers`` scope) to stop the old server, if the hub
still lists it, and to start it with ``user_options = {"resume": B}``: BudgetSpawner adopts B
(waits in the queue with progress events, like any spawn), and when the core grants B a slice
— any that fits, possibly on another node — starts the server with ``$GPUBUDGET_RESTORE`` set;
the server restores the kernels before the spawn completes, so the browser reconnects to them.

**Hibernate**: ``DELETE /sessions/{A}?reason=hibernate&snapshot={snapshot}`` ends A (its charge
stops, its slice is free); the service asks the hub to stop the server at once. Nothing is
queued: when the owner opens the server again, BudgetSpawner posts a new session with
``resumes: A`` and restores the snapshot.

**Resume on request**: ``POST /sessions`` with ``resumes`` (a session of the same user that has
ended) and optionally ``restore`` (one of its snapshots; default: its newest usable one).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from jupyter_gpubudget.ledger import snapshots as snapledger
from jupyter_gpubudget.ledger.models import SnapshotRow, WorkloadRow

from .base import ApiError
from .reaper import SESSION_BACKEND

if TYPE_CHECKING:
    from .app import GpuBudgetService

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,199}$")


def pop_resume_fields(body: Any) -> dict:
    """``resumes`` and ``restore`` of a session request, checked and taken out of the body
    (the rest is an ordinary session request)."""
    out: dict[str, str | None] = {"resumes": None, "restore": None}
    if not isinstance(body, dict):
        return out
    for k in ("resumes", "restore"):
        v = body.pop(k, None)
        if v is None:
            continue
        if not isinstance(v, str) or not _ID.fullmatch(v):
            raise ApiError(400, f"{k}: {v!r} is not a session or snapshot id", k)
        out[k] = v
    return out


def _set_row(svc: GpuBudgetService, set_id: str) -> SnapshotRow | None:
    with svc.ledger.ro() as s:
        return s.get(SnapshotRow, set_id)


def usable_set_or_400(svc: GpuBudgetService, set_id: str, wid: str, field: str) -> SnapshotRow:
    """A recorded, usable snapshot set of session ``wid`` (or of one it resumed)."""
    row = _set_row(svc, set_id)
    if row is None or row.workload not in snapledger.resume_chain(svc.ledger, wid):
        raise ApiError(400, f"{field}: no snapshot {set_id!r} of session {wid}", field)
    if row.status != "ok":
        raise ApiError(409, f"{field}: snapshot {set_id} is {row.status}"
                            + (f" ({row.problem})" if row.problem else ""), field)
    return row


def resume_target(svc: GpuBudgetService, sess: dict, user: str) -> dict | None:
    """What a new session resumes: ``{"resumes", "snapshot", "reason"}`` or None."""
    resumes, restore = sess.pop("resumes", None), sess.pop("restore", None)
    if resumes is None and restore is None:
        return None
    if resumes is None:
        row = _set_row(svc, restore)  # type: ignore[arg-type]
        if row is None:
            raise ApiError(400, f"restore: no snapshot {restore!r}", "restore")
        resumes = row.workload
    old = svc.ledger.get(resumes)
    if old is None or old.backend != SESSION_BACKEND or old.user != user:
        raise ApiError(400, f"resumes: no session {resumes!r} of user {user!r}", "resumes")
    if old.state in ("pending", "running"):
        raise ApiError(409, f"resumes: session {resumes} is {old.state}", "resumes")
    if restore is None:
        rows = [r for r in snapledger.sets_of(svc.ledger, snapledger.resume_chain(
            svc.ledger, resumes), statuses=("ok",))]
        if not rows:
            raise ApiError(409, f"resumes: session {resumes} has no usable snapshot",
                           "resumes")
        restore = rows[0].id
    else:
        usable_set_or_400(svc, restore, resumes, "restore")
    return {"resumes": resumes, "snapshot": restore, "reason": "resumed by its user"}


def requeue_session(svc: GpuBudgetService, row: WorkloadRow, set_id: str, actor: str) -> str:
    """Queue the session that resumes preempted ``row`` from ``set_id``; its id. Run under
    the loop's lock, right after ``row`` was stopped."""
    now = svc.clock()
    with svc.ledger.tx() as s:
        new = svc.ledger.submit(
            project=row.project, user=row.user, kind="interactive", now=now,
            request=dict(row.request), command=None, env=None, min_runtime=row.min_runtime,
            resumable=True, time_limit=None, backend=SESSION_BACKEND, name=row.name, s=s)
        svc.ledger.record_decision(
            now=now, kind="requeue", workload=row.id, actor=actor,
            reason=f"preempted after snapshot {set_id}; requeued as {new.id}",
            detail={"as": new.id, "snapshot": set_id}, s=s)
        svc.ledger.record_decision(
            now=now, kind="resume", workload=new.id, actor=actor,
            reason=f"resumes preempted session {row.id} from snapshot {set_id}",
            detail={"resumes": row.id, "snapshot": set_id, "reason": "preempted",
                    "spawn": "service"}, s=s)
        return new.id


def snapshot_fields(svc: GpuBudgetService, row: WorkloadRow) -> dict:
    """What a session's JSON says about snapshots: its latest snapshot (of it or of the
    sessions it resumed), what a resume restored, a loss, open requests."""
    ledger = svc.ledger
    chain = snapledger.resume_chain(ledger, row.id)
    sets = snapledger.sets_of(ledger, chain, statuses=("ok", "bad"))
    out: dict[str, Any] = {"snapshot": snapledger.set_json(sets[0]) if sets else None,
                           "snapshot_count": len(sets), "resumes": None, "restored": None,
                           "snapshot_lost": None, "hibernated": None,
                           "snapshot_requests": []}
    for d in ledger.decisions(workloads=[row.id], limit=50):
        det = d.detail or {}
        if d.kind == "resume" and out["resumes"] is None:
            out["resumes"] = {"session": det.get("resumes"), "snapshot": det.get("snapshot"),
                              "reason": det.get("reason"), "at": d.at}
        elif d.kind == "restore" and out["restored"] is None:
            out["restored"] = {**{k: det.get(k) for k in (
                "snapshot", "asked", "summary", "kernels", "skipped", "taken_at", "error",
                "seconds")}, "at": d.at}
        elif d.kind == "snapshot_lost" and out["snapshot_lost"] is None:
            out["snapshot_lost"] = {"reason": d.reason, "at": d.at}
        elif d.kind == "hibernate" and out["hibernated"] is None:
            out["hibernated"] = {"snapshot": det.get("snapshot"), "at": d.at}
    if row.state == "running":
        out["snapshot_requests"] = snapledger.open_requests(ledger, row.id,
                                                            row.started_at or 0.0)
    return out


# ---------------------------------------------------------------- the hub's side
def _server_path(user: str, server: str) -> str:
    base = f"/users/{quote(user, safe='')}"
    return f"{base}/servers/{quote(server, safe='')}" if server else f"{base}/server"


async def _hub(svc: GpuBudgetService, method: str, path: str, body: Any = None
               ) -> tuple[int, Any]:
    auth = svc.hub_auth
    req = HTTPRequest(auth.api_url.rstrip("/") + path, method=method,
                      headers={"Authorization": f"token {auth.api_token}",
                               "Content-Type": "application/json"},
                      body=None if body is None and method in ("GET", "DELETE") else
                      json.dumps(body or {}), request_timeout=20,
                      allow_nonstandard_methods=True)
    resp = await AsyncHTTPClient().fetch(req, raise_error=False)
    try:
        data = json.loads(resp.body or b"null")
    except ValueError:
        data = None
    return resp.code, data


async def hub_server_step(svc: GpuBudgetService, user: str, server: str,
                          start: dict | None, session: str | None, old: str) -> str:
    """One step towards: the hub no longer runs ``user/server`` for session ``old``, and
    (``start``) spawns it with these user options for ``session``. Returns ``done``,
    ``wait``, ``moved on`` (the server runs something else now: the user started it
    themselves) or ``error: ...``. Only a server of session ``old`` is ever stopped."""
    code, u = await _hub(svc, "GET", f"/users/{quote(user, safe='')}")
    if code in (401, 403):
        return f"error: the service's hub token cannot read {user}'s servers ({code})"
    if code != 200 or not isinstance(u, dict):
        return "wait"
    sv = (u.get("servers") or {}).get(server)
    if sv is not None:
        runs = (sv.get("state") or {}).get("gpubudget_session") or ""
        if start is not None and session and runs == session:
            return "done"  # already spawning the resumed session
        if sv.get("pending") == "stop":
            return "wait"
        if runs and runs != old:
            return "moved on"
        code, body = await _hub(svc, "DELETE", _server_path(user, server))
        if code in (401, 403):
            return (f"error: the service's hub token may not stop servers ({code}: give its "
                    "role the `servers` scope)")
        return "wait" if start is not None else "done"
    if start is None:
        return "done"
    code, body = await _hub(svc, "POST", _server_path(user, server), start)
    if code in (201, 202):
        return "done"
    if code in (401, 403):
        return (f"error: the service's hub token may not start servers ({code}: give its role "
                "the `servers` scope)")
    return "wait"  # e.g. 400 while the old one is still being stopped


def _due(svc: GpuBudgetService) -> list[tuple[str, str, str, dict | None, str, str]]:
    """Hub work to do: (key, user, server, start options or None, session, old session)."""
    out = []
    since = svc.clock() - 3600
    for d in svc.ledger.decisions(kind="resume", limit=200):
        det = d.detail or {}
        if det.get("spawn") != "service" or d.at < since or d.workload in svc.hub_done:
            continue
        row = svc.ledger.get(d.workload or "")
        if row is None or row.state != "pending":
            continue
        user, _, server = row.name.partition("/")
        out.append((row.id, user or row.user, server, {"resume": row.id}, row.id,
                    str(det.get("resumes") or "")))
    for d in svc.ledger.decisions(kind="hibernate", limit=200):
        if d.at < since or f"stop:{d.workload}" in svc.hub_done:
            continue
        row = svc.ledger.get(d.workload or "")
        if row is None:
            continue
        user, _, server = row.name.partition("/")
        out.append((f"stop:{row.id}", user or row.user, server, None, row.id, row.id))
    return out


async def resumer(svc: GpuBudgetService) -> None:
    """Runs for the life of the service: brings requeued sessions' servers back through the
    hub, and makes the hub forget hibernated servers at once."""
    aloop = asyncio.get_running_loop()
    warned: set[str] = set()
    while True:
        try:
            await asyncio.wait_for(svc._resume_event.wait(), 3.0)
        except TimeoutError:
            pass
        svc._resume_event.clear()
        try:
            due = await aloop.run_in_executor(svc.db_pool, _due, svc)
        except Exception:  # noqa: BLE001
            svc.log.exception("resumer: reading the ledger failed")
            continue
        for key, user, server, start, session, old in due:
            try:
                step = await hub_server_step(svc, user, server, start, session, old)
            except Exception as e:  # noqa: BLE001 - the hub may be restarting
                svc.log.info("resumer: hub not reachable for %s (%s)", key, e)
                continue
            if step == "done":
                svc.hub_done.add(key)
                if start is not None:
                    svc.session_seen[session] = svc.clock()
                    svc.log.info("session %s: the hub is starting %s's server %r to resume it",
                                 session, user, server)
            elif step == "moved on":
                svc.hub_done.add(key)
                if start is not None:  # the user started the server again themselves
                    await aloop.run_in_executor(svc.db_pool, _withdraw, svc, session)
            elif step.startswith("error") and key not in warned:
                warned.add(key)
                svc.log.warning("session %s: %s", session, step[7:])
            elif start is not None:
                svc.session_seen[session] = svc.clock()  # waiting on the hub, not stale


def _withdraw(svc: GpuBudgetService, session: str) -> None:
    with svc.loop.lock:
        try:
            svc.ledger.stop(session, now=svc.clock(), state="cancelled", closed_by="cancel",
                            reason="its user started the server again before it resumed",
                            actor="gpubudget")
        except Exception:  # noqa: BLE001 - already ended
            pass
