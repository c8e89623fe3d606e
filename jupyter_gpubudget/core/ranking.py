"""Standing and the order in which pending work is considered.

standing(account) = usage / grant over the window (∞ for a zero grant with any usage).

Order (Fair Tree, level by level): at every level of the account tree the child with the lower
standing goes first. Within one cycle a project's standing is *projected*: its k-th pending
workload is ranked as if the k-1 before it had already charged their expected demand
(GPU fraction × predicted run time). So one under-used project does not take the whole
cluster in a single cycle; projects interleave in proportion to their grants, like weighted
fair queueing.

Within a project, its members are one more Fair Tree level: each member has an equal share
of the project, so the member who used less of it in the window (their own charges, through
the same window or half-life: usage.py) goes first, projected within the cycle the same way —
a member's k-th pending workload ranks as if their k-1 before it had charged their demand.
One member's hundred queued jobs do not starve a colleague's one notebook; members take
turns in proportion to what they have used. Within a member their work goes by kind — debug
jobs first, then interactive sessions, then batch jobs (:data:`KIND_ORDER`) — each kind in
submission order: a researcher's ten-minute debug run or notebook does not wait behind their
own week of queued training. Across accounts only standing counts (a member's order never
moves their project's key). Ties go to the kind, then the earlier submission, then the
workload id.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .accounts import AccountTree
from .model import Workload

INF = float("inf")
#: the order of a project's own pending work, by kind (unknown kinds go with batch)
KIND_ORDER = {"debug": 0, "interactive": 1, "batch": 2}


def kind_rank(kind: str) -> int:
    return KIND_ORDER.get(kind, 2)


def standing_of(usage: float, grant: float) -> float:
    """usage / grant; an account with no grant stands behind every funded one."""
    return usage / grant if grant > 0 else INF


@dataclass(slots=True)
class Standings:
    """Usage, grant and standing of every account at one moment."""

    usage: dict[str, float]
    grant: dict[str, float]
    standing: dict[str, float]
    path_standing: dict[str, tuple[float, ...]]  # for each project: standing of each level
    #: per (project, user): the member's usage inside the project (GPU-hours in the window)
    member_usage: Mapping[tuple[str, str], float] = field(default_factory=dict)


def compute_standings(tree: AccountTree, project_usage: Mapping[str, float],
                      grants: Mapping[str, float],
                      member_usage: Mapping[tuple[str, str], float] | None = None) -> Standings:
    usage: dict[str, float] = {name: 0.0 for name in tree.accounts}
    for project, u in project_usage.items():
        if project in tree.accounts:
            for acc in tree.path(project):
                usage[acc] += u
    standing = {name: standing_of(usage[name], grants.get(name, 0.0)) for name in tree.accounts}
    paths: dict[str, tuple[float, ...]] = {}
    for p in tree.projects():
        # pair each level's standing with the account name so that equal standings of
        # *different* accounts still order deterministically and identical prefixes compare equal
        paths[p] = tuple(standing[a] for a in tree.path(p))
    return Standings(usage, dict(grants), standing, paths, member_usage or {})


Tie = tuple[int, float, str]  # kind, submission, workload id

#: added to the keys of the short lane (see :func:`rank`) so they sort before every other key
LANE_OFFSET = 1e9


def rank(pending: Sequence[Workload], tree: AccountTree, st: Standings,
         demand: Callable[[Workload], float],
         short: Callable[[Workload], bool] | None = None,
         memo: RankMemo | None = None) -> list[tuple[float, Workload]]:
    """Pending workloads in the order to consider them, each with its root-level key
    (non-decreasing along the list). Workloads of unknown projects are left out.

    ``short`` picks the *short lane*: work that is considered before everything else (the
    scheduler puts debug runs predicted to be short there), ranked by standing among itself
    just like the rest; its keys are lowered by :data:`LANE_OFFSET`.

    ``memo``: the orders of the last call kept (:class:`RankMemo`), so that an account whose
    inputs did not change is not ordered again; the same answer as without it."""
    if memo is not None and memo.tree is not tree:
        memo.clear(tree)
    if short is not None:
        lane = [w for w in pending if short(w)]
        if lane:
            rest = [w for w in pending if not short(w)]
            first = _rank(lane, tree, st, demand, memo, True)
            second = _rank(rest, tree, st, demand, memo, False)
            if memo is not None:
                hit = memo.top
                if hit is not None and hit[0] is first and hit[1] is second:
                    return hit[2]
            out = [(k - LANE_OFFSET, w) for k, w in first] + second
            if memo is not None:
                memo.top = (first, second, out)
            return out
    return _rank(pending, tree, st, demand, memo, False)


Item = tuple[float, Tie, Workload]


class RankMemo:
    """The orders of the last :func:`rank` kept per account (and per lane): an account's
    stream of items is a function of its grant, its usage and its children's streams, a
    project's of its pending work (the same objects, in the same order: a queued workload
    is never changed in place, only replaced), their demands and its members' usage. Where
    all of these equal the last call's, the stream kept is the answer; else it is worked
    out afresh and kept."""

    def __init__(self) -> None:
        self.tree: AccountTree | None = None
        #: per (lane?, account): (its grant, usage and (a project's) work, demands and
        #: members' usage; its children's streams; its stream)
        self.streams: dict[tuple[bool, str],
                           tuple[tuple[object, ...], tuple[list[Item], ...], list[Item]]] = {}
        #: per lane?: (the roots' streams, the answer)
        self.roots: dict[bool, tuple[tuple[list[Item], ...], list[tuple[float, Workload]]]] = {}
        #: the short lane's answer and the rest's, and rank's answer from them
        self.top: tuple[list[tuple[float, Workload]], list[tuple[float, Workload]],
                        list[tuple[float, Workload]]] | None = None
        self.hits = 0  # streams reused (a figure for tests and benchmarks)

    def clear(self, tree: AccountTree | None = None) -> None:
        self.tree = tree
        self.streams.clear()
        self.roots.clear()
        self.top = None


def _rank(pending: Sequence[Workload], tree: AccountTree, st: Standings,
          demand: Callable[[Workload], float], memo: RankMemo | None = None,
          lane: bool = False) -> list[tuple[float, Workload]]:
    by_project: dict[str, list[Workload]] = {}
    need: dict[str, float] = {}
    for w in pending:
        mine = by_project.get(w.project)
        if mine is None:
            if not tree.is_project(w.project):
                continue
            mine = by_project[w.project] = []
        mine.append(w)
        need[w.id] = demand(w)
    tie: dict[str, Tie] = {}  # each workload's tie-break: kind, submission, id
    kinds = KIND_ORDER.get
    members: dict[str, list[tuple[str, float]]] = {}
    if memo is not None:
        for (p, u), v in st.member_usage.items():
            members.setdefault(p, []).append((u, v))
    streams = memo.streams if memo is not None else {}

    def order(name: str) -> list[Item]:
        """The subtree's items in order, each keyed by *this* account's projected standing.
        Children's streams are each in order of their own key, so merging them orders their
        union by (child key, kind, submit time, id), each child's own order kept."""
        acc = tree.accounts[name]
        g = st.grant.get(name, 0.0)
        cum = st.usage.get(name, 0.0)
        sig: tuple[object, ...] = ()
        if acc.children:
            subs = tuple(order(c) for c in acc.children)
            if memo is not None:
                sig = (g, cum)
                kept = streams.get((lane, name))
                if kept is not None and kept[0] == sig and all(
                        a is b for a, b in zip(kept[1], subs, strict=True)):
                    memo.hits += 1
                    return kept[2]
            # a k-way merge keeps each child's own order where keys tie (a sort would put
            # a child's later debug run ahead of its earlier gang when the gang's projected
            # demand is 0: Scheduler.demand)
            merged = [(t[1], t[2]) for t in heapq.merge(*subs)]
        else:
            subs = ()
            items = by_project.get(name, [])
            if memo is not None:
                sig = (g, cum, tuple(map(id, items)), tuple([need[w.id] for w in items]),
                       tuple(members.get(name, ())))
                kept = streams.get((lane, name))
                if kept is not None and kept[0] == sig:
                    memo.hits += 1
                    return kept[2]
            for w in items:
                tie[w.id] = (kinds(w.kind, 2), w.submitted_at, w.id)
            items = members_in_turn(name, items, st.member_usage, need, tie)
            merged = [(tie[w.id], w) for w in items]
        out: list[Item] = []
        if g > 0:
            for t, w in merged:
                out.append((cum / g, t, w))
                cum += need[w.id]
        else:
            out = [(INF, t, w) for t, w in merged]
        if memo is not None:
            streams[(lane, name)] = (sig, subs, out)
        return out

    if memo is None:
        return [(t[0], t[2]) for t in heapq.merge(*(order(r) for r in tree.roots))]
    roots = tuple(order(r) for r in tree.roots)
    hit = memo.roots.get(lane)
    if hit is not None and all(a is b for a, b in zip(hit[0], roots, strict=True)):
        return hit[1]
    ranked = [(t[0], t[2]) for t in heapq.merge(*roots)]
    memo.roots[lane] = (roots, ranked)
    return ranked


def members_in_turn(project: str, items: list[Workload],
                    member_usage: Mapping[tuple[str, str], float],
                    need: Mapping[str, float], tie: Mapping[str, Tie]) -> list[Workload]:
    """A project's pending work in order: members by projected usage inside the project
    (equal shares), each member's own work by kind, then submission, then id (``tie``). (The
    same order as merging each member's stream keyed (projected usage, kind, submission, id):
    one sort by the tie-break, then a stable sort by the member's projected usage.)"""
    items.sort(key=lambda w: tie[w.id])
    if len(items) < 2:
        return items
    cum: dict[str, float] = {}
    keys: list[float] = []
    get = cum.get
    for w in items:
        u = w.user
        c = get(u)
        if c is None:
            c = member_usage.get((project, u), 0.0)
        keys.append(c)
        cum[u] = c + need[w.id]
    if len(cum) == 1:  # one member: their own order
        return items
    order = sorted(range(len(items)), key=keys.__getitem__)
    return [items[i] for i in order]
