"""While the server runs: heartbeats (they checkpoint the charge and carry the devices' GPU
utilisation when NVML can tell), stopping the server when the scheduler preempted the session —
after its kernels are saved (``restore.preempt``) — users' snapshot and restore requests, and
idle detection (GPU utilisation via NVML, else the hub's record of kernel activity), which
reports the session idle or hibernates it (``BudgetSpawner.idle_action``), and supervision of
the MPS control daemon an MPS share holds (``mps.supervise``)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from . import mps, restore
from .client import ServiceError
from .idle import gpu_busy, gpu_utilisation
from .words import hours

if TYPE_CHECKING:
    from .spawner import BudgetSpawner


async def watch(sp: BudgetSpawner) -> None:
    while sp.session_id and sp.child is not None:
        await asyncio.sleep(sp.heartbeat_interval)
        await mps.supervise(sp)
        util = gpu_utilisation(_devices(sp)) if sp.use_nvml else None
        try:
            sess = await sp.api("POST", f"/sessions/{sp.session_id}/heartbeat",
                                {"gpu_utilisation": util} if util is not None else None)
        except ServiceError as e:
            sp.log.warning("gpubudget: heartbeat for %s failed: %s", sp.session_id, e)
            continue
        sp._session = sess
        if sess.get("state") == "running" and sess.get("preempt_requested"):
            await restore.preempt(sp, sess)
            return  # the hub's next poll (or the service's restart of it) cleans up
        if sess.get("state") != "running":
            sp.log.warning("gpubudget: stopping %s's server (session %s): session is %s",
                           sp.user.name, sp.session_id, sess.get("state"))
            sp._stop_reason = "preempt"
            try:
                await sp._stop_child(now=False)
            finally:
                await sp._end_quietly("preempt")
            return  # the hub's next poll sees the server gone and cleans up
        if sess.get("snapshot_requests"):
            await restore.carry_out(sp, sess["snapshot_requests"])
        try:
            if await check_idle(sp):
                return  # hibernated
        except Exception:  # noqa: BLE001 - idle detection must not kill the watcher
            sp.log.exception("gpubudget: idle check failed")


def _devices(sp: BudgetSpawner) -> list[str]:
    ids = sp.child.environment.get("CUDA_VISIBLE_DEVICES", "") if sp.child is not None else ""
    return [d for d in ids.split(",") if d]


async def idle_seconds(sp: BudgetSpawner) -> tuple[float, str] | None:
    """Seconds the session has been idle, and how that was measured."""
    ids = sp.child.environment.get("CUDA_VISIBLE_DEVICES", "") if sp.child is not None else ""
    if sp.use_nvml and ids:
        busy = gpu_busy(ids.split(","), sp.gpu_idle_utilisation)
        if busy is not None:
            if busy:
                sp._gpu_busy_at = time.time()
            since = sp._gpu_busy_at or sp._session.get("started_at") or time.time()
            return time.time() - since, "GPU utilisation (NVML)"
    last = getattr(sp.orm_spawner, "last_activity", None)
    if last is None:
        return None
    if last.tzinfo is None:
        last = last.replace(tzinfo=UTC)
    idle = (datetime.now(UTC) - last).total_seconds()
    started = sp._session.get("started_at")
    if started:  # a session is not idle for longer than it has been running
        idle = min(idle, time.time() - started)
    return idle, "kernel activity"


async def check_idle(sp: BudgetSpawner) -> bool:
    """Report or hibernate an idle session; True when it was hibernated (stopped)."""
    if sp.idle_limit <= 0 or sp._idle_reported or not sp.session_id:
        return False
    got = await idle_seconds(sp)
    if got is None or got[0] < sp.idle_limit:
        return False
    idle_s, source = got
    sp._idle_reported = True
    if sp.idle_action == "hibernate" and await restore.hibernate(sp, idle_s, source):
        return True
    sp.log.warning("gpubudget: %s's session %s idle for %s (%s): reported; now preemptible",
                   sp.user.name, sp.session_id, hours(idle_s), source)
    try:
        await sp.api("POST", f"/sessions/{sp.session_id}/idle",
                     {"idle_s": idle_s, "source": source})
    except ServiceError as e:
        sp.log.warning("gpubudget: idle report failed: %s", e)
    return False
