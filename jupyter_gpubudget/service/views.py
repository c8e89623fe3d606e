"""JSON shapes of the REST API (kept in one place; openapi.py documents the same fields)."""

from __future__ import annotations

import math

from jupyter_gpubudget.ledger.models import GrantRow, WorkloadRow

from .loop import View
from .preempt_warning import forecast_json
from .timefmt import companions, local_iso

WORKLOAD_TIMES = ("submitted_at", "started_at", "ended_at", "protected_until",
                  "predicted_start")


def finite(x: float | None) -> float | None:
    """JSON has no infinity: a standing with no grant is reported as null."""
    return x if x is not None and math.isfinite(x) else None


def workload_json(r: WorkloadRow, view: View, now: float, tz=None) -> dict:  # noqa: ANN001
    """A workload; every time also as ``<field>_local`` / ``<field>_text`` (timefmt)."""
    protected_left = None
    if r.state == "running" and r.backed and r.protected_until is not None:
        protected_left = max(0.0, r.protected_until - now)
    return companions({
        "id": r.id, "name": r.name, "project": r.project, "user": r.user, "kind": r.kind,
        "state": r.state, "request": r.request, "placement": r.placement,
        "submitted_at": r.submitted_at, "started_at": r.started_at, "ended_at": r.ended_at,
        "backed": r.backed, "protected_until": r.protected_until,
        "protected_left_s": protected_left,
        "queue_position": view.position(r.id) if r.state == "pending" and r.id not in
        view.held else None,
        # a job that runs after others waits for them, not for GPUs
        "waiting_for": view.held.get(r.id) if r.state == "pending" else None,
        "array_id": getattr(r, "array_id", None), "array_index": getattr(r, "array_index", None),
        "after": (getattr(r, "after", None) or "").split() or None,
        "after_kind": getattr(r, "after_kind", None),
        "start_after": getattr(r, "not_before", None),  # start: off-peak
        "predicted_start": view.reservations.get(r.id) if r.state == "pending" else None,
        "min_runtime": r.min_runtime, "resumable": r.resumable, "time_limit": r.time_limit,
        "preemptions": r.preemptions, "exit_code": r.exit_code, "reason": r.reason,
        "backend": r.backend, "cluster": getattr(r, "cluster", None),
        "preemption_forecast": forecast_json(view.preemption_forecast.get(r.id), r.state,
                                             now, tz),
    }, WORKLOAD_TIMES, now, tz)


def array_json(aid: str, tasks: list, view: View, now: float, tz=None) -> dict:  # noqa: ANN001
    """A job array as one row: its tasks' counts per state, and the tasks themselves."""
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.state] = counts.get(t.state, 0) + 1
    first = tasks[0]
    return {"id": aid, "array": True, "name": first.name, "project": first.project,
            "user": first.user, "kind": first.kind, "max_running": first.array_max or None,
            "submitted_at": first.submitted_at, "counts": counts,
            "state": next((s for s in ("running", "pending") if counts.get(s)),
                          max(counts, key=lambda k: counts[k])),
            "tasks": [workload_json(t, view, now, tz) for t in tasks]}


def grant_json(g: GrantRow | None) -> dict | None:
    if g is None:
        return None
    # a version never changes: only the absolute companion (no "5 s ago" that would)
    return {"version": g.version, "grant_hours": g.grant_hours, "share_pct": g.share_pct,
            "changed_by": g.changed_by, "changed_at": g.changed_at, "source": g.source,
            "note": g.note, "changed_at_local": local_iso(g.changed_at)}
