"""Pending work and the order in which it is considered.

A full cycle ranks the whole queue (ranking.py) and :meth:`WorkQueue.rerank` keeps that order;
between cycles each arrival is put where it stands until the next cycle ranks it exactly
(:meth:`WorkQueue.arrival_key`), and a departure leaves its entry behind, recognised as stale
by its sequence number and swept out once stale entries are the majority.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import replace

from .accounts import AccountTree
from .model import Policy, Workload
from .ranking import INF, LANE_OFFSET, Standings

Shape = tuple[object, ...]


def with_interconnect(w: Workload, policy: Policy) -> Workload:
    """``w`` with its gang's interconnect the policy's default for its kind when it
    declared none (``Policy.interconnect``; otherwise placement uses the inventory's)."""
    req = w.request
    if req.kind != "gpu" or req.gpus < 2 or req.interconnect is not None:
        return w
    level = policy.interconnect_for(w.kind)
    if level is None:
        return w
    return replace(w, request=replace(req, interconnect=level))


class WorkQueue:
    """The pending workloads by id, and (rank key, sequence number, id) entries in ascending
    order; an entry is current while its sequence number is the workload's."""

    def __init__(self) -> None:
        self.pending: dict[str, Workload] = {}
        self.order: list[tuple[float, int, str]] = []  # (rank key, seq, id), ascending
        self.seq: dict[str, int] = {}
        self.next_seq = 0
        self.shape_count: dict[Shape, int] = {}  # pending workloads per request shape
        self.mix: dict[Shape, float] = {}  # decayed histogram of request shapes
        # per top-level account, the demand queued under it since the last full cycle
        # (None: to be summed on the next arrival)
        self.root_demand: dict[str, float] | None = {}

    def add(self, w: Workload) -> None:
        """Queue ``w``, not yet in the order (:meth:`put`)."""
        self.pending[w.id] = w
        shape = w.request.shape
        self.shape_count[shape] = self.shape_count.get(shape, 0) + 1
        self.mix[shape] = self.mix.get(shape, 0.0) + 1.0
        self.seq[w.id] = self.next_seq
        self.next_seq += 1

    def add_all(self, ws: Iterable[Workload], running: Container[str], policy: Policy) -> None:
        """Queue each of ``ws`` (``with_interconnect``) in turn at rank ``INF``, as :meth:`add`
        and :meth:`put` would one by one; ValueError for one already queued or ``running``."""
        pending, seq, order, count, mix = (self.pending, self.seq, self.order,
                                           self.shape_count, self.mix)
        n = self.next_seq
        for w in ws:
            wid = w.id
            if wid in pending or wid in running:
                raise ValueError(f"workload {wid} is already known")
            w = with_interconnect(w, policy)
            pending[wid] = w
            shape = w.request.shape
            count[shape] = count.get(shape, 0) + 1
            mix[shape] = mix.get(shape, 0.0) + 1.0
            seq[wid] = n
            order.append((INF, n, wid))
            n += 1
        self.next_seq = n
        order.sort()

    def put(self, wid: str, key: float, bulk: bool = False) -> None:
        """Put queued ``wid`` in the order at rank ``key``; with ``bulk`` at the end (the
        caller sorts once)."""
        if bulk:
            self.order.append((key, self.seq[wid], wid))
        else:
            bisect.insort(self.order, (key, self.seq[wid], wid))

    def remove(self, wid: str) -> Workload:
        """Take ``wid`` out of the queue; its entry in the order goes stale."""
        w = self.pending.pop(wid)
        shape = w.request.shape
        n = self.shape_count[shape] - 1
        if n:
            self.shape_count[shape] = n
        else:
            del self.shape_count[shape]
        self.seq.pop(wid, None)
        if len(self.order) > 64 and len(self.order) > 2 * len(self.pending):
            self.order = [e for e in self.order if self.seq.get(e[2]) == e[1]]
        return w

    def current(self, wid: str, seq: int) -> Workload | None:
        """The pending workload of entry (``seq``, ``wid``), or None for a stale entry."""
        w = self.pending.get(wid)
        return w if w is not None and self.seq.get(wid) == seq else None

    def ids(self) -> list[str]:
        """Pending workload ids in the order they will be considered."""
        return [wid for _, seq, wid in self.order if wid in self.pending and self.seq.get(wid) == seq]

    def rerank(self, ranked: list[tuple[float, Workload]], unranked: list[Workload]) -> None:
        """The order of a full cycle: ``ranked`` by their keys, then ``unranked`` work (of
        unknown projects: stays queued, never started)."""
        seq = self.seq
        self.order = [(key, seq[w.id], w.id) for key, w in ranked]
        self.order.sort()
        self.root_demand = None  # summed on the next arrival, if any
        for w in unranked:
            self.order.append((INF, seq[w.id], w.id))

    def arrival_key(self, w: Workload, accounts: AccountTree, grants: Mapping[str, float],
                    st: Standings | None, short: Callable[[Workload], bool],
                    demand: Callable[[Workload], float]) -> float:
        """Where a new arrival stands until the next full cycle ranks it exactly: behind the
        pending demand already queued under its top-level account (``demand``: its expected
        GPU-hours); short-lane work (``short``) ahead of all other waiting work."""
        if not accounts.is_project(w.project):
            return INF
        if short(w):  # the short lane: ahead of all other waiting work
            root = accounts.path(w.project)[0]
            g = grants.get(root, 0.0)
            used = st.usage.get(root, 0.0) if st else 0.0
            return (used / g if g > 0 else INF) - LANE_OFFSET
        if self.root_demand is None:
            self.root_demand = {}
            for p in self.pending.values():
                if p.id != w.id and accounts.is_project(p.project):
                    r = accounts.path(p.project)[0]
                    self.root_demand[r] = self.root_demand.get(r, 0.0) + demand(p)
        root = accounts.path(w.project)[0]
        g = grants.get(root, 0.0)
        used = (st.usage.get(root, 0.0) if st else 0.0) + self.root_demand.get(root, 0.0)
        self.root_demand[root] = self.root_demand.get(root, 0.0) + demand(w)
        return used / g if g > 0 else INF
