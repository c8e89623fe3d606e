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


def free_words(free: list[dict] | None) -> str:
    """'A MIG 3g.40gb slice is free now ...': the largest slice that would start at once."""
    if not free:
        return ""
    more = " (or a smaller one)" if len(free) > 1 else ""
    name = ask_choice(free[0])
    verb = "are" if name[0].isdigit() else "is"
    text = (f"{name} {verb} free now{more}: leave the queue and choose it on the form to "
            "start at once.")
    return text[0].upper() + text[1:]


def ask_choice(choice: dict) -> str:
    key = str(choice.get("key", ""))
    if key.startswith("mig:"):
        return f"a MIG {key[4:]} slice"
    if key.startswith("mps:"):
        return f"an MPS share of {int(key[4:].split(':')[0]) / 10:g}%"
    if key.startswith("gpu:"):
        n = int(key[4:])
        return "a whole GPU" if n == 1 else f"{n} whole GPUs"
    return str(choice.get("label") or key)


#: a new predicted start is reported when it moved by more than this (seconds)
PREDICTION_STEP = 300.0


async def progress(sp: BudgetSpawner) -> AsyncIterator[dict]:
    """JupyterHub progress events: the queue position and predicted start while queued (one
    event per real change: position, the slices free now, or a predicted start that moved by
    more than 5 minutes), then the grant, then the backend spawner's own events, then — for
    a resumed session — the restore of its kernels.

    The bar is position-based while queued: 5 % on joining, up to 45 % as the work ahead of
    this session is done (``first_position`` is the position it started from), 50 % granted,
    60 % and on: the server starting."""
    sp._progress_watchers += 1
    try:
        async for ev in _progress(sp):
            yield ev
    finally:
        sp._progress_watchers -= 1


async def _progress(sp: BudgetSpawner) -> AsyncIterator[dict]:
    shown: tuple | None = None
    shown_start: float | None = None
    first: int | None = None
    joining = False
    while sp._phase == "queued":
        s = sp._session
        pos = s.get("queue_position") if s else None
        if pos is None:
            if not joining and shown is None:
                joining = True
                yield {"progress": 3, "message": "Joining the queue...",
                       "gpubudget": {"queue_position": None}}
        else:
            first = max(first or pos, pos)
            pred = s.get("predicted_start")
            free = s.get("free_now") or []
            moved = (pred is None) != (shown_start is None) or (
                pred is not None and shown_start is not None
                and abs(pred - shown_start) > PREDICTION_STEP)
            key = (pos, tuple(f.get("key") for f in free))
            if key != (shown or (None,))[:2] or moved:
                shown, shown_start = (*key, pred), pred
                ahead = "first in line" if pos == 1 else f"{pos - 1} ahead of you"
                msg = (f"Queued in project {s.get('project')} for {ask(s.get('request'))}: "
                       f"position {pos} in the queue ({ahead}), predicted start "
                       f"{when(pred)}.")
                if sp._resuming:
                    msg = resuming_words(sp._resuming) + " " + msg
                hint = free_words(free)
                yield {"progress": round(5 + 40 * (first - pos) / first),
                       "message": f"{msg} {hint}".strip(),
                       "gpubudget": {"queue_position": pos, "first_position": first,
                                     "predicted_start": pred,
                                     "predicted_start_kind": s.get("predicted_start_kind"),
                                     "free_now": free, "hint": hint,
                                     "project": s.get("project"),
                                     "request": ask(s.get("request")),
                                     "session": s.get("id"),
                                     "snapshot": (sp._resuming or {}).get("snapshot")}}
        await _changed(sp)
    if sp._phase in ("starting", "restoring", "restored", "running"):
        s = sp._session
        prot = ""
        if s.get("protected_until"):
            prot = f"; protected for {hours(max(0, s['protected_until'] - time.time()))}"
        elif not s.get("backed"):
            prot = "; unbacked (not protected, preempted first)"
        on = f" on cluster {s['cluster']}" if s.get("cluster") not in (None, "", "default") \
            else ""
        yield {"progress": 50, "message": f"Granted {describe(sp.placement)}{on}{prot}.",
               "gpubudget": {"granted": describe(sp.placement),
                             "protected_until": s.get("protected_until")}}
        yield {"progress": 60, "message": "Starting the server..."}
        if sp.child is not None and not sp._resuming:
            async for ev in sp.child.progress():
                if "progress" in ev:  # the bar never goes back
                    ev = {**ev, "progress": max(60, int(ev["progress"]))}
                yield ev
        async for ev in restoring(sp):
            yield ev


def resuming_words(r: dict) -> str:
    """The queue page's words for a session that comes back from a snapshot: that it is a
    resume with its saved kernels, and why it waits (the snapshot's id is in the event's
    ``gpubudget.snapshot``, not in the words)."""
    reason = r.get("reason") or ""
    why = {"preempted": "preempted", "restore asked by its user": "restored on request",
           "resumed by its user": "hibernated"}.get(reason, "saved")
    waits = {"preempted": "It was preempted to free its slice, so it waits for a slice "
                          "again like any request",
             "resumed by its user": "Its slice was released while it hibernated, so it "
                                    "waits for a slice like any request"}.get(
        reason, "It waits for a slice like any request")
    return (f"Resuming your session ({why}): a resume with your saved kernels, not a fresh "
            f"server. {waits}; once it gets one (possibly on another node) the kernels are "
            "restored before the page reconnects.")


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
