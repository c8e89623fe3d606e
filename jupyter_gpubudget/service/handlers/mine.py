"""A researcher's own figures for the JupyterLab sidebar.

``GET /me/week?tz=``: my GPU-hours this week (Monday 00:00 in ``tz`` until now): charged,
busy (null: unknown, nothing measured), measured and idle, per project I am a member of and
in total — my own line of each project's usage report (``ledger/reports.py``), never another
member's.

``GET /sessions/{id}/utilisation``: my session's live GPU utilisation — the busy fraction of
the latest sample of its GPUs (NVML device utilisation, MIG GPM or per-process utilisation,
``inventory/busy.py``), when it was taken and by what; ``status`` is ``live`` while the latest
sample is recent, ``stale`` past ``max_age_s``, ``unknown`` where nothing ever measured the
session (no NVIDIA driver, a declared inventory) — never shown as 0. ``memory``: the memory
its GPUs use, per slice (bytes used and total; a MIG instance's own, an MPS share's whole
GPU's) from the sampler's latest reading on this machine, or null (unknown) where nothing
reads it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from jupyter_gpubudget.ledger.models import BusyChargeRow
from jupyter_gpubudget.ledger.reports import Scope, report

from ..auth import SCOPE_READ, needs_scope
from ..base import ApiError, BaseHandler
from .accounts import time_zone
from .sessions import SESSION_ID

_FIGS = ("charged_gpu_h", "busy_gpu_h", "measured_gpu_h", "idle_gpu_h", "idle_share")


def week_start(now: float, tz: Any) -> float:
    """Monday 00:00 of ``now``'s week in ``tz``."""
    d = datetime.fromtimestamp(now, tz).date()
    d -= timedelta(days=d.weekday())
    return datetime(d.year, d.month, d.day, tzinfo=tz).timestamp()


def my_week(rep: dict[str, Any], user: str) -> dict[str, Any]:
    """My own line of each project of ``rep`` (a report scoped to ``user``), and their sum
    (busy unknown only where none of my projects measured anything)."""
    projects = []
    charged = measured = busy = 0.0
    for p in rep["projects"]:
        line = next((u for u in p["users"] if u["user"] == user), None)
        figs: dict[str, Any] = {k: (line or {}).get(k) for k in _FIGS}
        figs["charged_gpu_h"] = float(figs["charged_gpu_h"] or 0.0)
        figs["measured_gpu_h"] = float(figs["measured_gpu_h"] or 0.0)
        projects.append({"project": p["project"], **figs})
        charged += figs["charged_gpu_h"]
        measured += figs["measured_gpu_h"]
        busy += float(figs["busy_gpu_h"] or 0.0)
    totals: dict[str, Any] = {"charged_gpu_h": charged, "measured_gpu_h": measured}
    if measured > 0:
        totals.update(busy_gpu_h=busy, idle_gpu_h=max(0.0, measured - busy),
                      idle_share=max(0.0, measured - busy) / measured)
    else:
        totals.update(busy_gpu_h=None, idle_gpu_h=None, idle_share=None)
    return {"projects": projects, "totals": totals}


class MyWeekHandler(BaseHandler):
    @needs_scope(SCOPE_READ)
    async def get(self) -> None:
        c = await self.caller()
        tz_name = self.get_query_argument("tz", None) or "UTC"
        tz = time_zone(tz_name)
        svc, tree = self.svc, self.tree
        projects = sorted(tree.projects_of(c.name))

        def work() -> dict[str, Any]:
            now = svc.clock()
            start = week_start(now, tz)
            with svc.ledger.ro() as s:
                rep = report(s, account="", scope=Scope(projects, c.name), start=start,
                             end=max(now, start + 1), tz=tz, by="user", now=now, grants={},
                             window=svc.policy().window, idle_top=0)
            return {"user": c.name, "tz": tz_name, "from": start, "to": now,
                    "from_local": datetime.fromtimestamp(start, tz).isoformat(),
                    **my_week(rep, c.name), "computed_at": now}

        self.send(await self.db(work))


def utilisation(ledger: Any, wid: str, now: float, max_age: float) -> dict[str, Any]:
    """The latest busy sample of ``wid``'s current (or last) charge interval."""
    with ledger.ro() as s:
        b = BusyChargeRow.__table__.c
        row = s.execute(select(b.last_busy, b.last, b.source, b.measured_ms, b.busy_ms)
                        .where(b.workload == wid).order_by(b.charge.desc()).limit(1)).first()
    if row is None or row[1] is None:
        return {"status": "unknown", "utilisation": None, "at": None, "age_s": None,
                "source": None, "average": None,
                "message": "nothing measures this session's GPUs (no NVIDIA driver on its "
                           "node, or a declared inventory): unknown, not idle"}
    last_busy, last, source, measured, busy = row
    age = max(0.0, now - float(last))
    return {"status": "live" if age <= max_age else "stale",
            "utilisation": None if last_busy is None else float(last_busy),
            "at": float(last), "age_s": age, "source": source,
            "average": (float(busy) / float(measured)) if measured else None,
            "message": "" if age <= max_age else
            f"no sample for {age:.0f} s: the figure is the last one measured"}


def memory(sampler: Any, wid: str, state: str, now: float, max_age: float) -> dict[str, Any]:
    """The latest memory reading of ``wid``'s GPUs (null: unknown), while it runs."""
    got = None if sampler is None or state != "running" else sampler.memory_of(wid)
    if got is None or now - got[0] > max_age:
        return {"memory": None, "memory_at": None}
    at, slices = got
    return {"memory": [{"gpu": str(m["gpu"]) if m["mig_start"] is None
                        else f"{m['gpu']} (MIG instance at slice {m['mig_start']})",
                        "used_bytes": m["used_bytes"], "total_bytes": m["total_bytes"],
                        "shared": m["shared"]} for m in slices],
            "memory_at": at}


class SessionUtilisationHandler(BaseHandler):
    @needs_scope(SCOPE_READ)
    async def get(self, wid: str) -> None:
        c = await self.caller()
        svc = self.svc
        row = await self.db(svc.ledger.get, wid)
        if row is None:
            raise ApiError(404, f"no session {wid!r}")
        c.require_see_workload(row.user)
        max_age = max(90.0, 3 * svc.busy_interval)
        out = await self.db(utilisation, svc.ledger, row.id, svc.clock(), max_age)
        self.send({"session": row.id, "state": row.state, "max_age_s": max_age, **out,
                   **memory(svc.busy_sampler, row.id, row.state, svc.clock(), max_age)})


API_ROUTES = [
    ("/me/week", MyWeekHandler),
    (f"/sessions/{SESSION_ID}/utilisation", SessionUtilisationHandler),
]
