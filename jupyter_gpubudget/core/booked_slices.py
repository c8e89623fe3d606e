"""Bookings of MIG instances (core/reservations.py books whole GPUs; this module books
slices): a booking may hold ``count`` instances of one MIG profile (``3 × 1g.10gb``),
chosen when it is booked (:func:`choose_mig`): instances of the GPUs' fixed layouts (or, on
a GPU whose instances are carved freely, places the profile may take), none that another
booking holds in an overlapping window, never more than the nodes have.

In every cycle (:func:`step_mig`, called by :meth:`Bookings.step`):

- before its window, work of others may take a booked instance, but its protection ends at
  the window's start (:meth:`Bookings.protect`);
- inside its window, work of others still on a booked instance (unprotected by then) is
  preempted, the booking's project's pending work of that profile starts on the free
  booked instances (sessions first, then by submission), and what stays free is held for
  the booking for the rest of the cycle (allocated to ``booking:<id>``, which no workload
  is), so that no one else is placed there; the next cycle's model releases it again.

MPS shares are not booked: a share is a fraction of a GPU that its tenants split as they
come, with no instance to name; book the whole GPU (or a MIG instance) instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from . import mig as migtab
from .capacity import Cluster, _problem
from .inventory import Inventory
from .model import Decision, Workload
from .sharing import gpu_models
from .slices import Placement, SliceAlloc

if TYPE_CHECKING:
    from .cycle import CycleState

Start = Callable[[Workload, Placement, bool, float, list[Decision]], None]
Preempt = Callable[[Workload, float, str, "str | None", list[Decision]], None]


class BookingError(ValueError):
    """A booking that cannot be made: ``field`` names what is wrong, the message why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


#: the most GPUs (or instances) one booking may hold, and the longest window (a year):
#: bigger numbers are mistakes, refused with their field rather than carried into the cycle
MAX_GPUS = 100_000
MAX_WINDOW = 366 * 86400.0


class Booked(Protocol):
    """What this module reads of a booking (core/reservations.py: Booking)."""

    @property
    def id(self) -> str: ...
    @property
    def project(self) -> str: ...
    @property
    def mig(self) -> tuple[BookedMig, ...]: ...
    def overlaps(self, start: float, end: float) -> bool: ...

#: the prefix of the allocations that hold a booking's free instances during a cycle
HOLDER = "booking:"


@dataclass(frozen=True, slots=True)
class BookedMig:
    """One booked MIG instance: ``profile`` at memory slot ``start`` of GPU ``gpu`` of
    ``node``; ``mask``: the memory slots it spans; ``milli``: what it is charged (its
    compute slices' share of the GPU)."""

    node: str
    gpu: int
    profile: str
    start: int
    mask: int
    milli: int = 0

    @property
    def key(self) -> str:
        """Its name: ``node:gpu:profile@start``."""
        return f"{self.node}:{self.gpu}:{self.profile}@{self.start}"

    def stored(self) -> dict[str, object]:
        """As the ledger stores it (the mask with it: a profile's name spans different
        slots on different GPU models)."""
        return {"node": self.node, "gpu": self.gpu, "profile": self.profile,
                "start": self.start, "mask": self.mask, "milli": self.milli}


def from_stored(entry: object) -> BookedMig | None:
    """A booked instance as :meth:`BookedMig.stored` wrote it; None for anything else (a
    whole GPU's ``node:gpu``)."""
    if not isinstance(entry, dict):
        return None
    try:
        return BookedMig(str(entry["node"]), int(entry["gpu"]), str(entry["profile"]),
                         int(entry["start"]), int(entry["mask"]), int(entry.get("milli", 0)))
    except (KeyError, TypeError, ValueError):
        return None


def check_booking(field: str, count: object, start: float, end: float, inventory: Inventory,
                  nodes: Sequence[str], cluster: str | None) -> None:
    """What every booking is checked for, whole GPUs or MIG instances: ``count`` (named
    ``field``) a whole number in range, a window that ends after it starts and is at most a
    year long, named nodes and cluster that exist. Raises :class:`BookingError`."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_GPUS:
        raise BookingError(field, f"{field}: a whole number from 1 to {MAX_GPUS}, "
                                  f"got {count!r}")
    if not end > start:
        raise BookingError("end", "end: the window must end after it starts")
    if end - start > MAX_WINDOW:
        raise BookingError("end", "end: a window is at most a year long")
    known = {n.name for n in inventory.nodes}
    for name in nodes:
        if name not in known:
            raise BookingError("nodes", f"nodes: no node {name!r} in the inventory")
    if cluster is not None and not any(n.cluster == cluster for n in inventory.nodes):
        raise BookingError("cluster", f"cluster: no cluster {cluster!r}")


def choose_mig(inventory: Inventory, bookings: Iterable[Booked], profile: str, count: int,
               start: float, end: float, *, nodes: Sequence[str] = (),
               cluster: str | None = None) -> tuple[BookedMig, ...]:
    """``count`` instances of ``profile`` for ``[start, end)`` on MIG GPUs (of ``nodes``
    and in ``cluster`` when named), none that overlaps an instance another booking holds in
    an overlapping window; on as few GPUs as possible. Raises ``BookingError`` (the window
    and the names are checked by :func:`~.reservations.choose_gpus`'s rules)."""
    check_booking("count", count, start, end, inventory, nodes, cluster)
    mig_gpus = [(n, g) for n in inventory.nodes for g in n.gpus if g.mig
                and (not nodes or n.name in nodes) and (cluster is None or n.cluster == cluster)]
    def offered(g: Any) -> set[str]:  # a fixed layout's instances, else the model's table
        return {name for name, _ in g.layout} if g.layout is not None else \
            set(migtab.profiles_for(g.model))

    known = sorted({p for _, g in mig_gpus for p in offered(g)})
    if not any(profile in offered(g) for _, g in mig_gpus):
        where = f" on {', '.join(nodes)}" if nodes else ""
        raise BookingError("profile", f"profile: no MIG GPU{where} offers {profile!r}"
                           + (f" (profiles: {', '.join(known)})" if known else
                              " (no GPU there is in MIG mode)"))
    taken: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for b in bookings:
        if b.overlaps(start, end):
            for m in b.mig:
                taken.setdefault((m.node, m.gpu), []).append((m.mask, b.id))
    free: list[list[BookedMig]] = []  # per GPU, the instances it can give
    clash: set[str] = set()
    for n, g in mig_gpus:
        p = migtab.profiles_for(g.model).get(profile)
        if p is None:
            continue
        held = taken.get((n.name, g.index), [])
        layout = g.layout
        starts = sorted(st for name, st in layout if name == profile) \
            if layout is not None else list(p.starts)
        got: list[BookedMig] = []
        used = 0
        for st in starts:
            slots = ((1 << p.size) - 1) << st
            hit = [bid for mask, bid in held if mask & slots]
            if hit:
                clash.update(hit)
                continue
            if slots & used:
                continue
            if layout is None and sum(x.mask.bit_count() for x in got) + p.size > 8:
                continue
            used |= slots
            got.append(BookedMig(n.name, g.index, profile, st, slots, p.milli))
        if layout is None:  # carved freely: the compute slices bound them too
            got = got[:max(0, migtab.COMPUTE // max(1, p.compute))]
        if got:
            free.append(got)
    have = sum(len(x) for x in free)
    if have < count:
        why = f"; booked there in this window: {', '.join(sorted(clash))}" if clash else ""
        field = "nodes" if nodes else "count"
        raise BookingError(field, f"{field}: {have} {profile} instances are free for this "
                           f"window, {count} asked{why}")
    out: list[BookedMig] = []
    for got in sorted(free, key=lambda x: -len(x)):
        out.extend(got[: count - len(out)])
        if len(out) == count:
            break
    return tuple(out)


def overlaps(placement: Placement, m: BookedMig, model: str | None) -> bool:
    """Whether ``placement`` holds memory slots of booked instance ``m`` on its GPU of
    ``model`` (a whole GPU or an MPS share there takes them all; an unknown model or
    profile counts as all of them)."""
    table = migtab.profiles_for(model) if model is not None else {}
    for s in placement.slices:
        if s.node == m.node and s.gpu == m.gpu:
            p = table.get(s.profile or "") if s.kind == "mig" else None
            if p is None or (((1 << p.size) - 1) << s.mig_start) & m.mask:
                return True
    return False


def step_mig(active: Sequence[Booked], cyc: CycleState, pending: Mapping[str, Workload],
             start: Start, preempt: Preempt, backed: Callable[[Workload, float], bool]
             ) -> None:
    """The MIG part of one cycle for the bookings in their window (``active``): preempt
    others' unprotected work on their instances, start their projects' pending work of the
    booked profiles there, hold what stays free for the rest of the cycle."""
    now, cluster, running, out = cyc.now, cyc.cluster, cyc.running, cyc.out
    for b in active:
        for m in b.mig:
            g = _gpu(cluster, m)
            if g is None:
                continue
            for wid in list(g.tenants):
                v = running.get(wid)
                if (v is not None and v.project != b.project and not v.stopping
                        and not v.is_protected(now) and v.placement is not None
                        and overlaps(v.placement, m, g.model)):
                    preempt(v, now, f"booked: its MIG instance is booked for {b.project} "
                            f"({b.id})", None, out)
    mine: dict[str, list[Workload]] = {}
    wanted = {b.project for b in active}
    for w in pending.values():
        if w.project in wanted and w.request.kind == "mig" and w.placement is None:
            mine.setdefault(w.project, []).append(w)
    for ws in mine.values():
        ws.sort(key=lambda w: (w.kind != "interactive", w.submitted_at, w.id))
    for b in active:
        queue = mine.get(b.project, [])
        for m in b.mig:
            g = _gpu(cluster, m)
            if g is None or not g.node.healthy or g.node.barred:
                continue
            probe = SliceAlloc(m.node, m.gpu, "mig", 0, m.start, m.profile, 0, 0, 0)
            if _problem(g, probe) is not None:
                continue  # taken (by the booking's own work, or someone still stopping)
            pick = next((q for q in queue if q.request.profile == m.profile
                         and _fits(q, g)), None)
            p = migtab.profiles_for(g.model)[m.profile]
            if pick is not None:
                req = pick.request
                start(pick, Placement((SliceAlloc(m.node, m.gpu, "mig", p.milli, m.start,
                                                  m.profile, 0, req.cpu_milli,
                                                  req.memory_mib),)),
                      backed(pick, now), now, out)
                queue.remove(pick)
                continue
            hid = f"{HOLDER}{b.id}:{m.key}"  # (one GPU holds a tenant once: one each)
            if hid not in cluster.allocations:
                cluster.allocate(hid, Placement((SliceAlloc(
                    m.node, m.gpu, "mig", p.milli, m.start, m.profile, 0, 0, 0),)))


def _fits(w: Workload, g: Any) -> bool:
    req = w.request
    models = gpu_models(req)
    if models is not None and g.model not in models:
        return False
    if req.cluster is not None and g.node.cluster != req.cluster:
        return False
    return g.node.host_fits(req.cpu_milli, req.memory_mib)


def _gpu(cluster: Cluster, m: BookedMig):  # noqa: ANN202 - Gpu | None
    n = cluster.by_name.get(m.node)
    if n is None or not 0 <= m.gpu < len(n.gpus) or not n.gpus[m.gpu].mig:
        return None
    return n.gpus[m.gpu]
