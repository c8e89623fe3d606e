"""Stale sessions: a session nobody vouches for any more (no long-poll while queued, no
heartbeat while running, for ``GpuBudgetService.session_stale_after`` seconds) is ended by the
service — e.g. a spawn queued when the hub restarted would otherwise start and be charged with
no server behind it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from jupyter_gpubudget.ledger import LedgerError

if TYPE_CHECKING:
    from .app import GpuBudgetService

SESSION_BACKEND = "hub"


def reap_stale(svc: GpuBudgetService, now: float, started: float, limit: float) -> list[str]:
    """End hub sessions nobody vouches for any more: a queued spawn the hub stopped waiting for
    is cancelled; a running one whose heartbeats stopped is closed at its last checkpoint (only
    time the hub vouched for is charged). Time since this service started counts as seen, so a
    service restart never ends sessions by itself."""
    seen = svc.session_seen
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


async def reaper(svc: GpuBudgetService) -> None:
    """Runs for the life of the service."""
    started, limit = svc.clock(), svc.session_stale_after
    aloop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(min(30.0, limit / 2))
        try:
            if await aloop.run_in_executor(svc.worker, reap_stale, svc, svc.clock(), started,
                                           limit):
                svc.kick()
        except Exception:  # noqa: BLE001 - keep reaping
            svc.log.exception("stale-session reaper failed")
