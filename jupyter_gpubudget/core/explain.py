"""Why pending work waits, in words an admin understands.

:func:`why_waiting` replays the cycle the scheduler would run at ``now`` (the same code, on a
copy) and gives every workload that would still be pending the first reason that holds:

- ``unknown-project``: its project is not in the budgets file (it is never started);
- ``starts``: it would start in this cycle (the figures shown are a cycle old);
- ``interconnect``: a gang that would fit now on a poorer interconnect than it asked for
  (split across nodes or NVLink domains, or on MIG instances): it waits for GPUs linked as
  it asked (``SliceRequest.interconnect``, docs/core.md "Interconnect");
- ``reserved``: GPUs are held for it from a known time (a gang waiting for running work to
  end, or a slice being freed by preempted work that is still stopping);
- ``reservation``: it would fit now, but only on GPUs held for a waiting gang that it would
  not leave in time (backfill takes only work predicted to end before the gang starts);
- ``unbacked``: its project's grant (or an ancestor's) does not cover it, so it runs only on
  idle capacity and never displaces anything, and no idle capacity fits it;
- ``draining``: the only nodes that could ever hold it are out of service;
- ``capacity``: backed, but nothing that fits it is free, and what holds the capacity is
  protected or stands below its project.

:func:`queue_order` gives the order in which that cycle would consider pending work.

Pure, like the rest of the core: no I/O, and ``state`` is left untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .model import HOUR, MILLI, Preempt, Reserve, SliceRequest, Start, request_milli
from .placement import gang_links, place
from .ranking import rank
from .scheduler import ClusterState, Scheduler


def queue_order(state: ClusterState, now: float) -> list[str]:
    """Pending workload ids in rank order, as the cycle at ``now`` would consider them."""
    s = Scheduler.from_state(state)
    st = s.standings(now)
    return [w.id for _, w in rank(list(s.pending.values()), s.accounts, st, s.demand, s.short)]


REASONS = ("unknown-project", "starts", "reserved", "interconnect", "reservation", "unbacked",
           "draining", "capacity")

#: what each interconnect asks of the GPUs, for the queue page's sentence
LINKS = {"nvlink": "NVLink between its ranks on a node (one NVLink domain; a gang that "
                   "fits one is not split)",
         "node": "its ranks on one node when one node can hold it",
         "any": "whole GPUs"}


@dataclass(frozen=True, slots=True)
class Wait:
    workload: str
    reason: str  # one of REASONS
    message: str  # a sentence for the admin (no clock times: the UI formats those)
    backed: bool
    at: float | None = None  # expected start ("reserved")
    blocker: str | None = None  # the workload whose reservation is in the way


def describe_request(req: SliceRequest) -> str:
    """'2 whole GPUs', 'MIG 1g.10gb', 'an MPS share of 25% of a GPU', 'CPU only'."""
    if req.kind == "gpu":
        return f"{req.gpus} whole GPU{'s' if req.gpus != 1 else ''}" + (
            f" ({req.gpu_model})" if req.gpu_model else "")
    if req.kind == "mig":
        return f"MIG {req.profile}"
    if req.kind == "mps":
        return f"an MPS share of {req.milli / 10:g}% of a GPU"
    return "CPU only"


def _short_account(s: Scheduler, project: str, now: float, req: SliceRequest,
                   min_runtime: float) -> tuple[str, float, float] | None:
    """The first account on the project's path whose grant does not cover the workload:
    (account, GPU-hours used or promised, grant), or None when every level covers it."""
    grants = s.grants()
    st = s._st if s._st is not None else s.standings(now)
    need = request_milli(req) / MILLI * min_runtime / HOUR
    for a in s.accounts.path(project):
        g = grants.get(a, 0.0)
        used = st.usage[a] + s._committed.get(a, 0.0)
        if g <= 0 or used + need > g + 1e-9:
            return a, used, g
    return None


def why_waiting(state: ClusterState, now: float) -> dict[str, Wait]:
    """For every pending workload, why it waits (see the module's docstring)."""
    s = Scheduler.from_state(state)
    decisions = s.cycle(now)
    starting = {d.workload: d.backed for d in decisions if isinstance(d, Start)}
    reserved = {d.workload: d.at for d in decisions if isinstance(d, Reserve)}
    freeing = {d.for_workload for d in decisions if isinstance(d, Preempt) and d.for_workload}
    empty = s.new_cluster()  # every healthy node, nothing running
    out: dict[str, Wait] = {}
    for w in state.pending:
        what = describe_request(w.request)
        if w.id in starting:
            out[w.id] = Wait(w.id, "starts", f"{what} is free for it: it starts in the next "
                                             "scheduling cycle", backed=starting[w.id])
            continue
        if not s.accounts.is_project(w.project):
            out[w.id] = Wait(w.id, "unknown-project", f"project {w.project!r} is not in the "
                             "budgets file: it cannot be charged, so it is never started",
                             backed=False)
            continue
        backed = s.is_backed(w, now)
        mine = s.pending.get(w.id, w)  # with the policy's interconnect for its kind
        if mine.request.kind == "gpu" and mine.request.gpus >= 2 and w.id not in freeing:
            level, _ = gang_links(s.cluster, mine.request)
            loose = replace(mine, request=replace(mine.request, interconnect="any"))
            if level != "any" and s._place(loose, now + s.predict(w)) is not None:
                out[w.id] = Wait(w.id, "interconnect", f"{what} are free, but not with the "
                                 f"{level} interconnect it asked for ({LINKS[level]}): it "
                                 "waits for its interconnect", backed=backed,
                                 at=reserved.get(w.id))
                continue
        if w.id in reserved:
            why = ("preempted work is stopping to free its slice" if w.id in freeing else
                   "the GPUs it needs are held for it as running work ends")
            out[w.id] = Wait(w.id, "reserved", f"{what}: {why}", backed=backed,
                             at=reserved[w.id])
            continue
        end = now + s.predict(w)
        if place(s.cluster, w.request, end) is not None:
            out[w.id] = Wait(w.id, "starts", f"{what} is free for it: it starts in the next "
                                             "scheduling cycle", backed=backed)
            continue
        held = _held_for_reservations(s)
        p = place(s.cluster, w.request, float("-inf")) if held else None
        if p is not None:
            blocker = next((wid for wid, (_, rp) in sorted(s.reservations.items())
                            if {(x.node, x.gpu) for x in rp.slices}
                            & {(x.node, x.gpu) for x in p.slices}), None)
            out[w.id] = Wait(w.id, "reservation", f"{what} is free, but held for a waiting "
                             "gang that starts before this work would end", backed=backed,
                             blocker=blocker)
            continue
        if place(empty, w.request, end) is None:
            out[w.id] = Wait(w.id, "draining", f"the only nodes that can hold {what} are out "
                             "of service (draining or waiting for repair)", backed=backed)
            continue
        if not backed:
            short = _short_account(s, w.project, now, w.request,
                                   s.policy.effective_min_runtime(w))
            acct = (f"account {short[0]!r} has used or promised {short[1]:.1f} of its "
                    f"{short[2]:.1f} GPU-hours" if short else "its grant is used up")
            out[w.id] = Wait(w.id, "unbacked", f"unbacked ({acct}): it runs only on idle "
                             f"capacity and never displaces other work, and no idle {what} "
                             "is free", backed=False)
            continue
        out[w.id] = Wait(w.id, "capacity", f"no {what} free: the work holding the capacity "
                         "is protected or its project stands below this one", backed=True)
    return out


def _held_for_reservations(s: Scheduler) -> bool:
    """Are any GPUs held for a reservation? (Then ``place`` with end = -inf ignores them.)"""
    return bool(s.reservations)
