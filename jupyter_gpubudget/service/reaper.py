"""Sessions the hub no longer vouches for.

- **Stale**: no word from the hub (no long-poll while queued, no heartbeat while running) for
  ``GpuBudgetService.session_stale_after`` seconds: a queued one is cancelled (nothing
  charged); a running one is closed *now* — its slice was held until this moment, so that time
  is charged (a session that never sends a heartbeat is not free).
- **Reconciled with the hub** when the service starts: JupyterHub stops its managed services
  before the users' servers, so a server stopped during the hub's shutdown could not tell the
  service. Its spawner keeps the stop (time and reason) in its state; the service reads the
  hub's list of servers and settles each session: at the recorded stop, else — no server
  running for it any more — at its last heartbeat.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from jupyter_gpubudget.ledger import LedgerError

if TYPE_CHECKING:
    from .app import GpuBudgetService

SESSION_BACKEND = "hub"


def reap_stale(svc: GpuBudgetService, now: float, started: float, limit: float) -> list[str]:
    """End hub sessions nobody vouches for any more (see the module's docstring). Time since
    this service started counts as seen, so a service restart never ends sessions by itself."""
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
                else:  # the slice was held until now: charged until now
                    svc.ledger.stop(row.id, now=now, state="failed", closed_by="lost",
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


# ---------------------------------------------------------------------------- the hub's view
async def hub_servers(svc: GpuBudgetService) -> list[dict]:
    """Every server the hub knows (running, pending and stopped), with its spawner state
    (the service's token needs list:users, read:servers and admin:server_state)."""
    auth = svc.hub_auth
    out: list[dict] = []
    offset = 0
    while True:
        req = HTTPRequest(f"{auth.api_url.rstrip('/')}/users?include_stopped_servers=1"
                          f"&offset={offset}&limit=200",
                          headers={"Authorization": f"token {auth.api_token}",
                                   "Accept": "application/jupyterhub-pagination+json"},
                          request_timeout=20)
        resp = await AsyncHTTPClient().fetch(req)
        body = json.loads(resp.body)
        users = body["items"] if isinstance(body, dict) else body
        for u in users:
            for name, server in (u.get("servers") or {}).items():
                out.append({"user": u["name"], "server": name, **server})
        nxt = body.get("_pagination", {}).get("next") if isinstance(body, dict) else None
        if not nxt:
            return out
        offset = nxt["offset"]


def settle_with_hub(svc: GpuBudgetService, servers: list[dict], now: float) -> list[str]:
    """Close every hub session with no live server behind it (see the module's docstring)."""
    live, stopped_at = set(), {}
    for sv in servers:
        state: dict[str, Any] = sv.get("state") or {}
        pending_end = state.get("gpubudget_pending_end") or {}
        if pending_end.get("session"):
            stopped_at[pending_end["session"]] = pending_end
        if (sv.get("ready") or sv.get("pending")) and not sv.get("stopped"):
            live.add(state.get("gpubudget_session") or f"name:{sv['user']}/{sv['server']}")
    ended = []
    # queued to resume a preempted session: the service itself asks the hub to spawn them
    resuming = {d.workload for d in svc.ledger.decisions(kind="resume", limit=500)
                if (d.detail or {}).get("spawn") == "service"}
    for row in svc.ledger.workloads(states=("pending", "running"), backend=SESSION_BACKEND):
        if row.id in live or f"name:{row.name}" in live:
            continue
        if row.state == "pending" and row.id in resuming:
            continue
        rec = stopped_at.get(row.id)
        at = None
        if rec is not None:
            try:
                at = min(float(rec.get("at")), now)
            except (TypeError, ValueError):
                at = None
        if row.state == "pending":
            state, closed_by, why = "cancelled", "cancel", "the hub has no spawn for it"
        elif rec is not None and rec.get("reason") == "preempt":
            state, closed_by, why = "preempted", "preempt", "its server was preempted"
        else:
            state, closed_by, why = "done", "stop", "its server stopped while the service was away"
        with svc.loop.lock:
            try:
                svc.ledger.stop(row.id, now=at if row.state == "running" else now,
                                state=state, closed_by=closed_by, actor="gpubudget",
                                reason=f"reconciled with the hub: {why}")
            except LedgerError:
                continue
        ended.append(row.id)
        svc.log.warning("session %s of %s settled with the hub: %s (charged until %s)", row.id,
                        row.user, why, "its recorded stop" if at else "its last heartbeat")
    return ended


async def reconcile_with_hub(svc: GpuBudgetService, tries: int = 10) -> None:
    """Settle sessions against the hub once it answers (the hub may start after us)."""
    aloop = asyncio.get_running_loop()
    for i in range(tries):
        try:
            servers = await hub_servers(svc)
        except HTTPClientError as e:
            if e.code in (401, 403):
                svc.log.warning("sessions not reconciled with the hub: the service's token "
                                "lacks list:users, read:servers or admin:server_state (%s)", e)
                return
            svc.log.info("hub not answering for reconciling sessions (%s); retrying", e)
            await asyncio.sleep(min(30.0, 2.0 * (i + 1)))
            continue
        except Exception as e:  # noqa: BLE001 - the hub may not be up yet
            svc.log.info("hub not reachable for reconciling sessions (%s); retrying", e)
            await asyncio.sleep(min(30.0, 2.0 * (i + 1)))
            continue
        ended = await aloop.run_in_executor(svc.worker, settle_with_hub, svc, servers,
                                            svc.clock())
        if ended:
            svc.kick()
        return
    svc.log.warning("sessions not reconciled with the hub: it did not answer; sessions "
                    "without heartbeats are ended by the stale-session reaper")
