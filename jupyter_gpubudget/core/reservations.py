"""Advance reservations ("bookings"): whole GPUs booked for one project over a window
``[start, end)``.

A booking names its GPUs when it is made (:func:`choose_gpus`: no GPU is booked twice for
overlapping windows, never more than the cluster has). In every cycle (:meth:`Bookings.step`):

- before its window, a booked GPU is held back from the booking's start as a gang's
  reserved GPU is (``Gpu.reserved_at``): work of others goes there only when it is predicted
  to end before the window, and its protection never runs into the window
  (:meth:`Bookings.protect` caps it at the start);
- inside its window, only the booking's project uses its GPUs: work of others still on them
  (unprotected by then) is preempted, and the project's pending work on whole GPUs that fits
  what is free of the booking starts there, sessions first, then by submission;
- after its window, the GPUs are ordinary again.

A booking may hold MIG instances instead (core/booked_slices.py: chosen by
:func:`~.booked_slices.choose_mig`, kept and filled by :func:`~.booked_slices.step_mig`).

With no bookings nothing here changes a cycle's decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .booked_slices import (
    MAX_GPUS,
    MAX_WINDOW,
    BookedMig,
    BookingError,
    Preempt,
    Start,
    check_booking,
    choose_mig,
    overlaps,
    step_mig,
)
from .capacity import Cluster, Gpu
from .inventory import Inventory
from .model import Decision, Policy, Workload
from .sharing import gpu_models
from .slices import MILLI, Placement, SliceAlloc

if TYPE_CHECKING:
    from .cycle import CycleState


@dataclass(frozen=True, slots=True)
class Booking:
    """GPUs booked for ``project`` over ``[start, end)`` (epoch seconds); ``gpus`` are the
    booked GPUs as (node, GPU index), chosen when it was booked (:func:`choose_gpus`);
    ``mig`` the booked MIG instances (:func:`~.booked_slices.choose_mig`)."""

    id: str
    project: str
    start: float
    end: float
    gpus: tuple[tuple[str, int], ...]
    mig: tuple[BookedMig, ...] = ()

    def active(self, now: float) -> bool:
        return self.start <= now < self.end

    def overlaps(self, start: float, end: float) -> bool:
        return self.start < end and start < self.end




def choose_gpus(inventory: Inventory, bookings: Iterable[Booking], gpus: int, start: float,
                end: float, *, nodes: Sequence[str] = (), gpu_model: str | None = None,
                cluster: str | None = None) -> tuple[tuple[str, int], ...]:
    """The whole GPUs a new booking of ``gpus`` for ``[start, end)`` takes, on ``nodes`` when
    named (else anywhere), of ``gpu_model`` and in ``cluster`` when named: none that another
    booking holds in an overlapping window, and on as few nodes as possible (one that holds
    them all first, then the nodes with the most free GPUs). Raises :class:`BookingError`."""
    check_booking("gpus", gpus, start, end, inventory, nodes, cluster)
    by_name = {n.name: n for n in inventory.nodes}
    taken: dict[tuple[str, int], Booking] = {}
    for b in bookings:
        if b.overlaps(start, end):
            for key in b.gpus:
                taken[key] = b
    free: list[tuple[str, list[int]]] = []
    for n in inventory.nodes:
        if (nodes and n.name not in nodes) or (cluster is not None and n.cluster != cluster):
            continue
        idx = [g.index for g in n.gpus if not g.mig and (gpu_model is None or g.model == gpu_model)
               and (n.name, g.index) not in taken]
        if idx:
            free.append((n.name, idx))
    have = sum(len(i) for _, i in free)
    if have < gpus:
        if nodes:
            clash = sorted({taken[(n, g.index)].id for n in nodes for g in by_name[n].gpus
                            if (n, g.index) in taken})
            why = f"; booked there in this window: {', '.join(clash)}" if clash else ""
            raise BookingError("nodes", f"nodes: {', '.join(nodes)} have {have} GPUs free "
                               f"for this window, {gpus} asked{why}")
        raise BookingError("gpus", f"gpus: over capacity — {have} GPUs are free for this "
                           f"window, {gpus} asked")
    one = [(name, idx) for name, idx in free if len(idx) >= gpus]
    if one:  # the tightest single node that holds them all
        name, idx = min(one, key=lambda e: len(e[1]))
        return tuple((name, i) for i in idx[:gpus])
    out: list[tuple[str, int]] = []
    for name, idx in sorted(free, key=lambda e: -len(e[1])):
        out.extend((name, i) for i in idx[: gpus - len(out)])
        if len(out) == gpus:
            break
    return tuple(out)




class Bookings:
    """The bookings a cycle knows (from ``ClusterState.bookings``), indexed by GPU."""

    def __init__(self, bookings: Sequence[Booking] = ()) -> None:
        self.all = tuple(sorted(bookings, key=lambda b: (b.start, b.id)))
        self.by_gpu: dict[tuple[str, int], list[Booking]] = {}
        #: booked MIG instances by their GPU, and those GPUs' models (from the cycle's model)
        self.by_mig: dict[tuple[str, int], list[tuple[Booking, BookedMig]]] = {}
        self.models: dict[tuple[str, int], str] = {}
        for b in self.all:
            for key in b.gpus:
                self.by_gpu.setdefault(key, []).append(b)
            for m in b.mig:
                self.by_mig.setdefault((m.node, m.gpu), []).append((b, m))

    def __bool__(self) -> bool:
        return bool(self.all)

    def protect(self, w: Workload, placement: Placement, now: float, policy: Policy) -> float:
        """Backed ``w``'s protection on ``placement`` from ``now``: its own (``now`` + its
        effective min_runtime), but never past the start of another project's booking on one
        of its GPUs (it is preempted then)."""
        protected = now + policy.effective_min_runtime(w)
        if not self.all:
            return protected
        for sl in placement.slices:
            for b in self.by_gpu.get((sl.node, sl.gpu), ()):
                if b.project != w.project and b.end > now and b.start < protected:
                    protected = max(now, b.start)
            for b, m in self.by_mig.get((sl.node, sl.gpu), ()):
                if b.project != w.project and b.end > now and b.start < protected \
                        and overlaps(Placement((sl,)), m, self.models.get((sl.node, sl.gpu))):
                    protected = max(now, b.start)
        return protected

    def step(self, cyc: CycleState, pending: Mapping[str, Workload], start: Start,
             preempt: Preempt, backed: Callable[[Workload, float], bool]) -> None:
        """One cycle's part (after drains, before ranking): hold booked GPUs back from their
        booking's start, preempt work of others on the GPUs of bookings in their window, and
        start the projects' pending work on the free GPUs of their bookings."""
        if not self.all:
            return
        now, cluster, running, out = cyc.now, cyc.cluster, cyc.running, cyc.out
        live = [b for b in self.all if b.end > now]
        for b in live:
            for g in self._gpus(cluster, b):
                g.reserved_at = min(g.reserved_at, b.start)
        active = [b for b in live if b.active(now)]
        if self.by_mig:
            if not self.models:
                for node, gpu in self.by_mig:
                    n = cluster.by_name.get(node)
                    if n is not None and 0 <= gpu < len(n.gpus):
                        self.models[(node, gpu)] = n.gpus[gpu].model
            step_mig([b for b in active if b.mig], cyc, pending, start, preempt, backed)
        for b in active:
            for g in self._gpus(cluster, b):
                for wid in list(g.tenants):
                    v = running.get(wid)
                    if (v is not None and v.project != b.project and not v.stopping
                            and not v.is_protected(now)):
                        preempt(v, now, f"booked: its GPUs are booked for {b.project} "
                                f"({b.id})", None, out)
        open_ = [b for b in active if any(g.free for g in self._gpus(cluster, b))]
        if not open_:
            return
        wanted = {b.project for b in open_}
        mine: dict[str, list[Workload]] = {}
        for w in pending.values():  # one pass over the queue, only when a booking has room
            if w.project in wanted and w.request.kind == "gpu" and w.request.gpus >= 1:
                mine.setdefault(w.project, []).append(w)
        for ws in mine.values():
            ws.sort(key=lambda w: (w.kind != "interactive", w.submitted_at, w.id))
        for b in open_:
            self._fill(b, now, cluster, mine.get(b.project, []), start,
                       lambda w: backed(w, now), out)

    @staticmethod
    def _gpus(cluster: Cluster, b: Booking) -> list[Gpu]:
        out = []
        for node, i in b.gpus:
            n = cluster.by_name.get(node)
            if n is not None and 0 <= i < len(n.gpus):
                out.append(n.gpus[i])
        return out

    def _fill(self, b: Booking, now: float, cluster: Cluster, mine: list[Workload],
              start: Start, backed: Callable[[Workload], bool], out: list[Decision]) -> None:
        """Start ``b``'s project's pending whole-GPU work (``mine``, in order; what starts
        leaves it) on the free GPUs of ``b``."""
        free = [g for g in self._gpus(cluster, b)
                if g.free and g.node.healthy and not g.node.barred]
        for w in list(mine):
            if not free:
                return
            if w.request.gpus > len(free) or w.placement is not None:
                continue
            p = _place_on(free, w)
            if p is None:
                continue
            gpus = [cluster.by_name[s.node].gpus[s.gpu] for s in p.slices]
            held = [g.reserved_at for g in gpus]
            for g in gpus:  # its own booking's GPUs: no backfill deadline on them
                g.reserved_at = float("inf")
            try:
                start(w, p, backed(w), now, out)
            finally:
                for g, at in zip(gpus, held, strict=True):
                    g.reserved_at = at
            mine.remove(w)
            free = [g for g in free if g.free]


def _place_on(free: list[Gpu], w: Workload) -> Placement | None:
    """``w``'s whole GPUs among ``free`` (booked, free GPUs): on one node when it asks for
    one node or fits one, else on as few as possible; None when they do not hold it."""
    req = w.request
    models = gpu_models(req)
    if models is not None:
        free = [g for g in free if g.model in models]
    if req.cluster is not None:
        free = [g for g in free if g.node.cluster == req.cluster]
    by_node: dict[str, list[Gpu]] = {}
    for g in free:
        by_node.setdefault(g.node.name, []).append(g)
    need = req.gpus
    one = [gs for gs in by_node.values() if len(gs) >= need
           and gs[0].node.host_fits(req.cpu_milli, req.memory_mib)]
    if one:
        chosen = [min(one, key=len)[:need]]
    elif req.single_node or sum(len(gs) for gs in by_node.values()) < need:
        return None
    else:
        chosen, left = [], need
        for gs in sorted(by_node.values(), key=lambda gs: -len(gs)):
            if left and gs[0].node.host_fits(req.cpu_milli, req.memory_mib):
                chosen.append(gs[:left])
                left -= len(chosen[-1])
        if left:
            return None
    slices = []
    for gs in chosen:
        for k, g in enumerate(gs):
            cpu, mem = (req.cpu_milli, req.memory_mib) if k == 0 else (0, 0)
            slices.append(SliceAlloc(g.node.name, g.index, "gpu", MILLI, -1, None, 0, cpu, mem))
    return Placement(tuple(slices))


__all__ = ["MAX_GPUS", "MAX_WINDOW", "BookedMig", "Booking", "BookingError", "Bookings",
           "Preempt", "Start", "choose_gpus", "choose_mig"]
