"""Jobs that run after others, as the service carries them out: each cycle, a dependent job
whose condition can no longer hold is cancelled with the reason, and the others are shown
as waiting ("waiting for train-7 to succeed") rather than as queued for GPUs. Whether a job
may start is the core's to say (core/holds.py); this only writes what follows from it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from jupyter_gpubudget.core.holds import NEVER, READY, dependency, why_never, why_waiting
from jupyter_gpubudget.core.pricing import OffPeak, waiting_text
from jupyter_gpubudget.core.state import ClusterState


def settle(ledger, state: ClusterState, now: float) -> dict[str, str]:  # noqa: ANN001
    """Cancel the pending work of ``state`` whose condition can no longer hold (recorded in
    the decision log with its reason); return what still waits for others, id -> why."""
    waiting: dict[str, str] = {}
    for w in state.pending:
        if not w.after:
            continue
        verdict = dependency(w.after, w.after_kind, state.finished)
        if verdict == NEVER:
            why = why_never(w.after, w.after_kind, state.finished)
            with ledger.tx() as s:
                row = ledger.get(w.id, s=s)
                if row is None or row.state != "pending":
                    continue
                ledger.stop(w.id, now=now, state="cancelled", closed_by="dependency",
                            reason=why, s=s)
                ledger.record_decision(now=now, kind="cancel", workload=w.id, reason=why, s=s)
        elif verdict != READY:
            waiting[w.id] = why_waiting(w.after, w.after_kind, state.finished)
    return waiting


def off_peak_start(off_peak: OffPeak | None, start: str, now: float) -> float | None:
    """When a job that asks ``start`` may start: None (now), or with ``off-peak`` the next
    off-peak window's start (``now`` inside one). Refused (400, naming ``start``) where the
    policy sets no off-peak windows."""
    from jupyter_gpubudget.service.base import ApiError

    if start != "off-peak":
        return None
    at = off_peak.next_start(now) if off_peak is not None else None
    if at is None:
        raise ApiError(400, "start: 'off-peak' asks for an off-peak window, and this "
                            "cluster's policy sets none (policy off_peak)", "start")
    return at if at > now else None


def off_peak_wait(state: ClusterState, now: float) -> tuple[ClusterState, dict[str, str]]:
    """Hold the pending work that asked to start off-peak out of the cycle until its window
    starts; return the state without it and what it waits for, id -> why ("waiting for the
    off-peak window (Wed 20:00 CET)"). ``state`` itself when nothing waits."""
    early = [w for w in state.pending if w.not_before is not None and w.not_before > now]
    if not early:
        return state, {}
    off_peak = state.policy.off_peak
    why = {w.id: waiting_text(off_peak, w.not_before or now) for w in early}
    held = set(why)
    return replace(state, pending=[w for w in state.pending if w.id not in held]), why


def find_cycle(submitted: Mapping[str, Sequence[str]],
               after_of: Callable[[str], Sequence[str]]) -> list[str] | None:
    """A cycle of "runs after" through the jobs of one submission: ``submitted`` maps each
    new job (or a whole array, whose tasks run after the same jobs) to what it runs after;
    ``after_of`` gives an existing job's. Depth first over the submitted jobs and the
    existing graph they reach, each job visited once. The cycle as a path that ends where it
    starts (``[a, b, a]``), or None."""
    grey, black = 1, 2
    color: dict[str, int] = {}

    def edges(n: str) -> Sequence[str]:
        return submitted[n] if n in submitted else after_of(n)

    for root in submitted:
        if root in color:
            continue
        color[root] = grey
        path, stack = [root], [iter(edges(root))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                color[path.pop()] = black
                stack.pop()
                continue
            seen = color.get(nxt)
            if seen == grey:
                return path[path.index(nxt):] + [nxt]
            if seen is None:
                color[nxt] = grey
                path.append(nxt)
                stack.append(iter(edges(nxt)))
    return None


def resolve_after(ledger, user: str, refs: list[str], own_name: str, s) -> list[str]:  # noqa: ANN001
    """The workload ids a new job of ``user`` named ``own_name`` runs after: each of
    ``refs`` is a job's id, an array's id (all its tasks), an array task's id
    (``<array>_<index>``) or the name of one of the user's own jobs (the latest of that name;
    an array: all its tasks); its own name names the new job itself. An unknown one is
    refused (400, naming it; nothing is written), and so is a cycle (a job that runs after
    itself, directly or through others, never runs): :func:`find_cycle` over the new job and
    the jobs it reaches."""
    from sqlalchemy import select

    from jupyter_gpubudget.ledger.models import WorkloadRow
    from jupyter_gpubudget.ledger.store import LedgerError

    own = "\0this job"  # (no job's id: the new job, or array, in the graph)
    out: list[str] = []
    for ref in refs:
        if own_name and ref == own_name:
            out.append(own)
            continue
        row = s.get(WorkloadRow, ref)
        if row is not None:
            out.append(row.id)
            continue
        tasks = list(s.scalars(select(WorkloadRow.id).where(WorkloadRow.array_id == ref)
                               .order_by(WorkloadRow.array_index)))
        if not tasks:
            named = s.scalars(select(WorkloadRow).where(
                WorkloadRow.user == user, WorkloadRow.name == ref)
                .order_by(WorkloadRow.submitted_at.desc(), WorkloadRow.id.desc())).first()
            if named is not None and named.array_id is not None:
                tasks = list(s.scalars(select(WorkloadRow.id).where(
                    WorkloadRow.array_id == named.array_id).order_by(WorkloadRow.array_index)))
            elif named is not None:
                tasks = [named.id]
        if not tasks:
            raise LedgerError(400, f"after: no job or array {ref!r} (give a job's id, an "
                                   "array's id or the name of one of your jobs)", "after")
        out.extend(tasks)
    out = list(dict.fromkeys(out))

    def after_of(wid: str) -> list[str]:
        row = s.get(WorkloadRow, wid)
        return (row.after or "").split() if row is not None else []

    cycle = find_cycle({own: out}, after_of)
    if cycle is not None:
        names = [own_name or "this job" if n == own else n for n in cycle]
        itself = " itself" if len(cycle) == 2 else " itself, through " + ", ".join(names[1:-1])
        raise LedgerError(400, f"after: a job that runs after{itself} never runs (cycle "
                               f"{' -> '.join(names)})", "after")
    return out
