"""Snapshots from the spawner's side: asking the user's server (the gpubudget server
extension, ``jupyter_gpubudget.serverext.snapshot``) to save its kernels before a preemption
or a hibernation, carrying out users' snapshot and restore requests, and waiting for a
restore before the browser is let in.

The spawner reaches the server directly, with the server's own token (JupyterHub's default
``server`` role gives it ``access:servers!server``, so it may call its own server).

**Preemption** (:func:`preempt`): the core asked for the session's slice; the service gives a
deadline (the preempt-requested time + ``Policy.stop_grace``). First the lab's notice: until
the session's ``preempt_stop_at`` (the service's ``preempt_notice_time``, or sooner when its
owner chose "Save and release now") JupyterLab shows the warning. Then the server is asked for a
snapshot set with its kernels frozen as they are saved; a kernel it could not save (a
namespace dump waits for a running cell; a store that is full) runs on, and the spawner asks
again every ``snapshot_retry_interval`` seconds — the new set carries the kernels already saved
— until every kernel is saved or the deadline comes. Then the server is stopped, and the
session ends as preempted and is requeued to resume from the set (the service queues it and
asks the hub to spawn it again). Kernels not saved by the deadline are recorded lost (the
ledger, the user's notices); nothing at all saved: the session ends without a requeue. The
server is never stopped before its snapshot is verified or the deadline has passed.

**Hibernation** (:func:`hibernate`): idle past ``idle_limit``: the same snapshot, then the
server is stopped and the session ends (its charge and slice released); the spawner keeps the
snapshot in its state, and when the owner starts the server again it is restored. A
hibernation whose snapshot fails falls back to reporting the session idle.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from .client import ServiceError

if TYPE_CHECKING:
    from .spawner import BudgetSpawner


def options_from_session(sess: dict) -> dict:
    """user_options that ask for what a session asked for (to start it again)."""
    req = sess.get("request") or {}
    out: dict = {"project": sess.get("project")}
    kind = req.get("kind")
    if kind == "gpu":
        out["gpus"] = int(req.get("gpus") or 1)
    elif kind == "mig":
        out["slice"] = f"mig:{req.get('profile')}"
    elif kind == "mps":
        mem = req.get("gpu_memory_mib") or 0
        out["slice"] = f"mps:{req.get('milli')}" + (f":{mem}" if mem else "")
    else:
        out["slice"] = "cpu"
    if sess.get("min_runtime"):
        out["min_runtime"] = f"{int(sess['min_runtime'])}s"
    if req.get("cluster"):  # a cluster it named (not one the core chose for it)
        out["cluster"] = req["cluster"]
    return out


class ServerError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def server_url(sp: BudgetSpawner, started: Any = None) -> str:
    """The user's server base URL (``http://ip:port/user/name/``), from what the backend
    spawner's start returned, or from the hub's record once it runs."""
    base = sp.server.base_url if sp.server is not None else "/"
    if isinstance(started, tuple | list) and len(started) == 2:
        ip, port = started
        return f"http://{ip or '127.0.0.1'}:{port}{base}"
    if isinstance(started, str) and started:
        u = urlparse(started)
        return f"{u.scheme}://{u.netloc}{base}"
    if sp._server_url:
        return sp._server_url
    if sp.server is not None and sp.server.port:
        return sp.server.url
    raise ServerError(503, "the server's address is not known yet")


async def call_server(sp: BudgetSpawner, method: str, path: str, body: Any = None,
                      timeout: float = 60.0, url: str | None = None) -> dict:
    """JSON from the user's server (``gpubudget/api/<path>``) with the server's token."""
    base = url or server_url(sp)
    req = HTTPRequest(base.rstrip("/") + "/gpubudget/api/" + path, method=method,
                      headers={"Authorization": f"token {sp.api_token}",
                               "Content-Type": "application/json"},
                      body=json.dumps(body) if body is not None else
                      ("" if method == "POST" else None),
                      request_timeout=max(1.0, timeout), connect_timeout=10)
    try:
        resp = await AsyncHTTPClient().fetch(req, raise_error=False)
    except Exception as e:  # noqa: BLE001 - refused, reset
        raise ServerError(503, f"the server cannot be reached ({e})") from None
    try:
        data = json.loads(resp.body or b"null")
    except ValueError:
        data = None
    if resp.code == 599:
        raise ServerError(504, f"the server did not answer ({resp.error})")
    if resp.code >= 400:
        msg = data.get("message") if isinstance(data, dict) else None
        raise ServerError(resp.code, msg or f"{resp.code} {resp.reason}")
    return data if isinstance(data, dict) else {}


async def take_set(sp: BudgetSpawner, reason: str, deadline: float,
                   merge: str | None = None) -> dict:
    body: dict = {"reason": reason, "freeze": True, "deadline": deadline}
    if merge:
        body["merge"] = merge
    return await call_server(sp, "POST", "snapshots", body,
                             timeout=max(5.0, deadline - time.time() + 5))


async def _snapshot_until(sp: BudgetSpawner, reason: str, deadline: float
                          ) -> tuple[dict | None, str]:
    """Snapshot sets until every kernel is saved or ``deadline``; the last set and, when
    something is missing, why."""
    last: dict | None = None
    why = ""
    while True:
        try:
            last = await take_set(sp, reason, deadline, merge=last["id"] if last else None)
            missing = [m for m in last.get("members", []) if not m.get("snapshot")]
            if not missing:
                return last, ""
            why = "; ".join(f"{m.get('kernel_name')} ({', '.join(s.get('path', '') for s in m.get('sessions', [])) or 'no notebook'}): {m.get('error')}"  # noqa: E501
                            for m in missing)
        except ServerError as e:
            why = e.message
        left = deadline - time.time()
        if left <= sp.snapshot_retry_interval / 2:
            return last, why
        sp.log.warning("gpubudget: snapshot of %s's server incomplete (%s); trying again "
                       "(%.0f s left)", sp.user.name, why, left)
        await asyncio.sleep(min(sp.snapshot_retry_interval, max(0.0, left - 1)))


def _lost_kernels(s: dict | None) -> list[dict]:
    return [{"kernel": m.get("kernel_name"), "notebooks": [x.get("path") for x in
             m.get("sessions", [])], "error": m.get("error")}
            for m in (s or {}).get("members", []) if not m.get("snapshot")]


async def record(sp: BudgetSpawner, snap: dict) -> None:
    """Record the set at the service too (the server does; this makes the requeue independent
    of the server's own path to the service). Idempotent."""
    try:
        await sp.api("PUT", f"/snapshots/{snap['id']}",
                     {k: v for k, v in snap.items() if k not in ("status", "problem")})
    except ServiceError as e:
        sp.log.warning("gpubudget: recording snapshot %s failed: %s", snap.get("id"), e)


async def _lab_notice(sp: BudgetSpawner, stop_at: float) -> None:
    """The lab's notice before the server stops (the service's ``preempt_stop_at``): JupyterLab
    shows the warning with the time left and "Save and release now"; wait until then, or until
    its owner released it (the session, asked again every second, says so)."""
    sid = sp.session_id
    sp.log.warning("gpubudget: %s's session %s: the lab is told; its server stops in %.0f s",
                   sp.user.name, sid, stop_at - time.time())
    while time.time() < stop_at:
        await asyncio.sleep(min(1.0, max(0.0, stop_at - time.time())))
        try:
            sess = await sp.api("GET", f"/sessions/{sid}")
        except ServiceError as e:  # the notice runs on; the deadline still holds
            sp.log.warning("gpubudget: reading %s during its notice failed: %s", sid, e)
            continue
        if sess.get("state") != "running" or not sess.get("preempt_stop_at"):
            return
        stop_at = min(stop_at, float(sess["preempt_stop_at"]))


async def preempt(sp: BudgetSpawner, sess: dict) -> None:
    """Save, stop, end, requeue (see the module's docstring)."""
    sid = sp.session_id
    deadline = sess.get("preempt_deadline") or (time.time() + 120.0)
    why = sess.get("preempt_requested") or "preempted"
    if sess.get("preempt_stop_at"):
        await _lab_notice(sp, float(sess["preempt_stop_at"]))
    snap, missing = None, ""
    if sp.snapshot_on_preempt:
        sp.log.warning("gpubudget: %s's session %s is preempted (%s): saving its kernels "
                       "(deadline in %.0f s)", sp.user.name, sid, why, deadline - time.time())
        snap, missing = await _snapshot_until(sp, "preempt", deadline)
        if snap is None or missing:
            # the session is not stopped before its grace period ends
            await asyncio.sleep(max(0.0, deadline - time.time()))
    saved = bool(snap) and (snap.get("saved", 0) > 0 or snap.get("kernels", 0) == 0)
    if saved:
        await record(sp, snap)  # type: ignore[arg-type]
    if missing or not sp.snapshot_on_preempt or not saved:
        reason = (f"not saved before the grace period ended: {missing}" if missing else
                  "snapshots on preemption are turned off (BudgetSpawner.snapshot_on_"
                  "preempt)" if not sp.snapshot_on_preempt else "no snapshot was taken")
        try:
            await sp.api("POST", f"/sessions/{sid}/lost",
                         {"reason": reason, "kernels": _lost_kernels(snap)})
        except ServiceError as e:
            sp.log.warning("gpubudget: recording the loss of %s failed: %s", sid, e)
    sp._stop_reason = "preempt"
    # the requeued session is the hub's next spawn: nothing here (a poll that sees the
    # server gone) may end the session before it is requeued below, and a stop by the hub
    # meanwhile waits for this to finish (BudgetSpawner.stop)
    sp._handed_off = saved
    sp._ending = True
    try:
        await sp._stop_child(now=False)
    finally:
        if saved:
            try:
                out = await sp.api("DELETE", f"/sessions/{sid}?reason=preempt&requeue={snap['id']}")
                sp.log.warning("gpubudget: %s's session %s preempted after snapshot %s; "
                               "requeued as %s", sp.user.name, sid, snap["id"],
                               out.get("requeued_as"))
            except ServiceError as e:
                sp._handed_off = False
                sp.log.warning("gpubudget: requeueing %s failed (%s): it ends", sid, e)
                await sp._end_quietly("preempt")
        else:
            await sp._end_quietly("preempt")


async def hibernate(sp: BudgetSpawner, idle_s: float, source: str) -> bool:
    """Save and stop an idle session; False when its snapshot failed (it runs on)."""
    sid = sp.session_id
    deadline = time.time() + sp.hibernate_timeout
    try:
        snap = await take_set(sp, "hibernate", deadline)
    except ServerError as e:
        sp.log.warning("gpubudget: hibernating %s failed: %s; the session runs on", sid,
                       e.message)
        return False
    missing = _lost_kernels(snap)
    if missing:
        # the saved kernels were ended; the rest run on: keep the server, say so
        sp.log.warning("gpubudget: hibernating %s: %d kernels could not be saved (%s); the "
                       "server runs on", sid, len(missing), missing)
        return False
    await record(sp, snap)
    sp._stop_reason = "hibernate"
    sp.hibernated = {"session": sid, "snapshot": snap["id"], "at": time.time(),
                     "idle_s": idle_s, "source": source,
                     "stored_bytes": snap.get("stored_bytes", 0)}
    sp._handed_off = True
    sp._ending = True
    try:
        await sp._stop_child(now=False)
    finally:
        try:
            await sp.api("DELETE", f"/sessions/{sid}?reason=hibernate&snapshot={snap['id']}")
        except ServiceError as e:
            sp.log.warning("gpubudget: ending hibernated session %s failed: %s", sid, e)
            sp._handed_off = False
            await sp._end_quietly("hibernate")
    sp.log.warning("gpubudget: %s's session %s hibernated after %.0f s idle (%s): snapshot "
                   "%s, slice released", sp.user.name, sid, idle_s, source, snap["id"])
    return True


async def carry_out(sp: BudgetSpawner, requests: list[dict]) -> None:
    """Users' snapshot and restore requests, delivered with the session's heartbeat."""
    for r in requests:
        rid = r.get("request")
        if not rid or rid in sp._requests_seen:
            continue
        sp._requests_seen.add(rid)
        asyncio.ensure_future(_one_request(sp, r))


async def _one_request(sp: BudgetSpawner, r: dict) -> None:
    rid, sid = r["request"], sp.session_id
    try:
        if r.get("action") == "snapshot":
            await call_server(sp, "POST", "snapshots", {"reason": "user", "freeze": False,
                                                        "request": rid}, timeout=900)
        elif r.get("action") == "restore":
            await call_server(sp, "POST", "restore", {"snapshot": r.get("snapshot"),
                                                      "request": rid}, timeout=900)
        else:
            raise ServerError(400, f"unknown action {r.get('action')!r}")
    except ServerError as e:
        try:
            await sp.api("POST", f"/sessions/{sid}/requests/{rid}", {"error": e.message})
        except ServiceError:
            pass


async def wait_restored(sp: BudgetSpawner, started: Any) -> dict | None:
    """Wait until the new server has restored its kernels (it does so at start-up); the
    browser is let in only after that. None when the server does not say (it then restores
    on its own; the report still reaches the service)."""
    if getattr(sp, "internal_ssl", False):
        sp.log.warning("gpubudget: with JupyterHub's internal_ssl the spawner does not reach "
                       "the server's restore status: the browser may arrive before the "
                       "kernels are restored")
        return None
    url = server_url(sp, started)
    deadline = time.monotonic() + sp.restore_timeout
    while time.monotonic() < deadline:
        try:
            st = await call_server(sp, "GET", "restore", timeout=10, url=url)
        except ServerError as e:
            if e.status in (404, 403):
                sp.log.warning("gpubudget: the server does not report its restore (%s)",
                               e.message)
                return None
            await asyncio.sleep(0.5)  # not listening yet
            continue
        sp._restore = st
        sp._changed.set()
        if st.get("state") in ("done", "failed", "none"):
            return st
        await asyncio.sleep(0.3)
    sp.log.warning("gpubudget: the server's restore took over %.0f s; letting the browser in",
                   sp.restore_timeout)
    return None
