"""Waiting in the queue: long-polling the service until the core grants the session a slice,
and the progress events JupyterHub's spawn-pending page shows meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from tornado import web

from .client import ServiceError
from .placement import describe
from .words import ask, hours, when

if TYPE_CHECKING:
    from .spawner import BudgetSpawner


async def wait_for_grant(sp: BudgetSpawner, sess: dict, deadline: float) -> dict:
    """Long-poll until the session leaves the queue; withdraw it (nothing charged) after the
    deadline. Returns the running session."""
    while sess["state"] == "pending":
        if time.monotonic() > deadline:
            await sp._end("timeout")
            raise web.HTTPError(
                503, f"Still queued after {hours(sp.max_queue_wait)} (position "
                     f"{sess.get('queue_position')}); the request was withdrawn and "
                     f"nothing was charged. Try a smaller slice or later.")
        wait = max(0.0, min(sp.queue_poll_interval, deadline - time.monotonic()))
        try:
            sess = await sp.api("GET", f"/sessions/{sp.session_id}?wait={wait:.2f}")
        except ServiceError as e:
            if e.status < 500:
                raise
            # the service is restarting: keep the place in the queue, try again
            sp.log.warning("gpubudget: %s; still waiting", e.message)
            await asyncio.sleep(min(2.0, sp.queue_poll_interval))
            continue
        sp._set_session(sess)
    if sess["state"] != "running":
        raise web.HTTPError(500, f"session {sp.session_id} ended while queued: "
                                 f"{sess['state']} {sess.get('reason', '')}".strip())
    return sess


async def _changed(sp: BudgetSpawner, timeout: float = 5) -> None:
    sp._changed.clear()
    try:
        await asyncio.wait_for(sp._changed.wait(), timeout)
    except TimeoutError:
        pass


async def progress(sp: BudgetSpawner) -> AsyncIterator[dict]:
    """JupyterHub progress events: queue position and predicted start while queued, then the
    grant, then the backend spawner's own events."""
    sp._progress_watchers += 1
    try:
        async for ev in _progress(sp):
            yield ev
    finally:
        sp._progress_watchers -= 1


async def _progress(sp: BudgetSpawner) -> AsyncIterator[dict]:
    last = None
    n = 0
    while sp._phase == "queued":
        s = sp._session
        if s:
            pos = s.get("queue_position")
            msg = (f"Queued in project {s.get('project')} for {ask(s.get('request'))}: "
                   f"position {pos if pos is not None else '?'} in the queue, predicted "
                   f"start {when(s.get('predicted_start'))}.")
            if sp._resuming:
                msg = resuming_words(sp._resuming) + " " + msg
            if msg != last:
                n += 1
                last = msg
                yield {"progress": min(40, 5 + n), "message": msg,
                       "gpubudget": {"queue_position": pos,
                                     "predicted_start": s.get("predicted_start"),
                                     "session": s.get("id")}}
        await _changed(sp)
    if sp._phase in ("starting", "restoring", "restored", "running"):
        s = sp._session
        prot = ""
        if s.get("protected_until"):
            prot = f"; protected for {hours(max(0, s['protected_until'] - time.time()))}"
        elif not s.get("backed"):
            prot = "; unbacked (not protected, preempted first)"
        yield {"progress": 50, "message": f"Granted {describe(sp.placement)}{prot}."}
        yield {"progress": 60, "message": "Starting the server..."}
        if sp.child is not None and not sp._resuming:
            async for ev in sp.child.progress():
                yield ev
        async for ev in restoring(sp):
            yield ev


def resuming_words(r: dict) -> str:
    why = {"preempted": "preempted", "restore asked by its user": "restored on request",
           "resumed by its user": "hibernated"}.get(r.get("reason") or "", "saved")
    return f"Resuming your session ({why}; its kernels were saved in snapshot " \
           f"{r.get('snapshot')})."


async def restoring(sp: BudgetSpawner) -> AsyncIterator[dict]:
    """While the new server restores the kernels: the browser waits here, then reconnects
    to them."""
    while sp._phase in ("starting", "restoring") and sp._resuming:
        if sp._phase == "restoring":
            yield {"progress": 80, "message": "Restoring your kernels..."}
            break
        await _changed(sp, 1)
    while sp._phase == "restoring":
        await _changed(sp, 1)
    st = sp._restore or {}
    if st.get("state") == "done":
        rep = st.get("report") or {}
        yield {"progress": 95, "message": f"Restored: {rep.get('summary', 'done')}",
               "gpubudget": {"restored": rep.get("summary"), "snapshot": rep.get("snapshot")}}
    elif st.get("state") == "failed":
        yield {"progress": 95, "message": f"Your kernels could not be restored: "
                                          f"{st.get('error')}"}
    sp._restore_told.set()
