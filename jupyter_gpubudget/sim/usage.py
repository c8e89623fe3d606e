"""The usage report for a simulated period: the same figures and columns as the service's
report over the ledger (``usage_report.py``; ``GET /api/v1/reports``, ``gpubudget report``),
so a budget or policy change can be shown before and after in one format
(``gpubudget simulate --report FILE``), and how evenly each project's GPU-hours went to its
members.

- The period is the simulated one: from the trace's first submission to where the clock
  stopped, in seconds from the trace start (``from``/``to``); a grant is counted pro rata
  for it, as the service counts it for a period.
- Charged GPU-hours are what each workload's slices held; busy GPU-hours come from the
  trace's ``busy`` column (the share of its held time a workload's GPUs computed) where it
  has one, and are unknown (``None``) for the rest: never 0, never invented.
- Waits are each workload's wait before its first start (nearest-rank p50/p90, as the
  service's); preemptions are those the project's work suffered.
- **Member shares** (``member_shares``): inside each project, each member's share of the
  project's delivered GPU-hours beside their fair share — equal among the members who asked
  for GPU time in the period, as the core ranks members inside a project (one more Fair Tree
  level with equal shares, ``core/ranking.py``; the budgets state no member shares, only
  members' limits) — and the difference in percentage points; also the max-min entitled share (a member who asked
  for less than the fair share is entitled to all they asked for, the rest shared among the
  others) and the difference from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.model import HOUR, gpu_fraction
from ..usage_report import Figures, grant_figures, waits_figures

if TYPE_CHECKING:  # the figures read a result; the engine is not needed to read one
    from .engine import SimResult

MS_PER_GPU_H = 1000.0 * HOUR


def _arrived(res: SimResult) -> list[Any]:
    return [r for r in res.records.values() if r.job.submit <= res.end]


def report(res: SimResult, account: str | None = None, idle_top: int = 10) -> dict[str, Any]:
    """The usage report (``by=user``) of the whole budget tree (or the subtree of
    ``account``) over the simulated period."""
    tree = res.accounts
    if account is None:
        account = tree.roots[0] if len(tree.roots) == 1 else "all"
        projects = sorted(tree.projects())
    else:
        if account not in tree.accounts:
            raise ValueError(f"report account: no account {account!r} in the budgets")
        projects = sorted(p for p in tree.projects() if account in tree.path(p))
    start, end = res.start, res.end
    window = res.policy.window
    gpus = res.total_milli / 1000
    eff = tree.effective_grants(gpus * window / HOUR)

    def grant_of(n: str) -> float | None:
        if n not in tree.accounts:
            return sum(eff.get(r, 0.0) for r in tree.roots)
        a = tree.get(n)
        has = a.grant_hours is not None or a.share_pct is not None or not tree.is_project(n)
        return eff.get(n) if has else None

    wanted = set(projects)
    per_user: dict[tuple[str, str], Figures] = {}
    preempted: dict[str, int] = {}
    waits: dict[str, list[tuple[float, int]]] = {}
    idle: list[dict[str, Any]] = []
    for r in _arrived(res):
        j = r.job
        if j.project not in wanted:
            continue
        ms = r.gpu_hours * MS_PER_GPU_H
        measured = ms if j.busy is not None else 0.0
        busy = ms * j.busy if j.busy is not None else 0.0
        per_user.setdefault((j.project, j.user), Figures()).add(ms, measured, busy)
        if r.preemptions:
            preempted[j.project] = preempted.get(j.project, 0) + r.preemptions
        if r.wait is not None:
            waits.setdefault(j.kind, []).append((r.wait, 1))
        if j.kind == "interactive" and j.busy is not None and r.gpu_hours > 0:
            idle.append({"workload": j.id, "name": j.id, "user": j.user, "project": j.project,
                         "idle_gpu_h": r.gpu_hours * (1.0 - j.busy),
                         "measured_gpu_h": r.gpu_hours, "busy_gpu_h": r.gpu_hours * j.busy})
    totals = Figures()
    proj_out = []
    for p in projects:
        pf = Figures()
        lines = []
        for (pp, u), f in sorted(per_user.items()):
            if pp != p:
                continue
            pf.add(f.charged_ms, f.measured_ms, f.busy_ms)
            lines.append({"user": u, **f.json()})
        totals.add(pf.charged_ms, pf.measured_ms, pf.busy_ms)
        proj_out.append({"project": p, **pf.json(),
                         **grant_figures(grant_of(p), start, end, window), "users": lines,
                         "preemptions": preempted.get(p, 0)})
    idle.sort(key=lambda e: (-e["idle_gpu_h"], e["workload"]))
    return {
        "account": account, "from": start, "to": end, "by": "user",
        "from_local": None, "to_local": None,
        "totals": {**totals.json(), **grant_figures(grant_of(account), start, end, window),
                   "preemptions": sum(preempted.values())},
        "projects": proj_out, "waits": waits_figures(waits),
        "idle_sessions": idle[:idle_top], "computed_at": end,
        "clock": "simulated: seconds from the trace start",
        "member_shares": member_shares(res, projects),
    }


def member_shares(res: SimResult, projects: list[str] | None = None) -> dict[str, Any]:
    """Per project with GPU-hours delivered, per member who asked for GPU time in the
    period: delivered GPU-hours and share of the project's, fair share (equal among those
    who asked, as the core ranks members), entitled share (max-min by what each
    asked for), and the differences in percentage points (delivered − fair, delivered −
    entitled); per project the largest of each (absolute)."""
    tree = res.accounts
    if projects is None:
        projects = sorted(tree.projects())
    delivered: dict[str, dict[str, float]] = {}
    demand: dict[str, dict[str, float]] = {}
    for r in _arrived(res):
        j = r.job
        frac = r.milli / 1000 if r.milli else gpu_fraction(j.request)
        want = frac * max(0.0, min(j.duration, res.end - j.submit)) / HOUR
        if want <= 0:
            continue  # CPU-only work asks for no GPU time
        demand.setdefault(j.project, {}).setdefault(j.user, 0.0)
        demand[j.project][j.user] += want
        delivered.setdefault(j.project, {}).setdefault(j.user, 0.0)
        delivered[j.project][j.user] += r.gpu_hours
    out: dict[str, Any] = {}
    for p in projects:
        got = delivered.get(p, {})
        total = sum(got.values())
        if total <= 0:
            continue
        asked = demand[p]
        fair = _fair_shares(sorted(asked))
        entitled = _water_fill({u: asked[u] for u in asked}, fair, total)
        members = {}
        for u in sorted(asked):
            share = got.get(u, 0.0) / total
            members[u] = {"delivered_gpu_h": got.get(u, 0.0), "asked_gpu_h": asked[u],
                          "delivered_share": share, "fair_share": fair[u],
                          "share_error_pts": 100.0 * (share - fair[u]),
                          "entitled_share": entitled[u],
                          "entitled_share_error_pts": 100.0 * (share - entitled[u])}
        out[p] = {"delivered_gpu_h": total, "members": members,
                  "share_error_pts": max(abs(m["share_error_pts"]) for m in members.values()),
                  "entitled_share_error_pts": max(abs(m["entitled_share_error_pts"])
                                                  for m in members.values())}
    return out


def _fair_shares(users: list[str]) -> dict[str, float]:
    """Equal shares among ``users`` (those who asked): the core's member level gives every
    member of a project the same share (``ranking.members_in_turn``)."""
    return {u: 1.0 / len(users) for u in users}


def _water_fill(asked: dict[str, float], fair: dict[str, float], total: float
                ) -> dict[str, float]:
    """Max-min shares of ``total`` by the weights ``fair``: one who asked for less than
    their part gets all they asked for; the rest is shared among the others by weight."""
    active = dict(fair)
    out: dict[str, float] = {}
    left = total
    while active:
        g = sum(active.values())
        if g <= 0:
            out.update(dict.fromkeys(active, 0.0))
            break
        capped = {u for u, w in active.items() if asked.get(u, 0.0) <= left * w / g}
        if not capped:
            out.update({u: left * w / g / total for u, w in active.items()})
            break
        for u in capped:
            out[u] = asked.get(u, 0.0) / total
            left -= asked.get(u, 0.0)
            del active[u]
    return out


def max_member_share_error(shares: dict[str, Any]) -> tuple[float, float]:
    """The largest member share error over the projects (points): from the fair share and
    from the entitled share."""
    return (max((p["share_error_pts"] for p in shares.values()), default=0.0),
            max((p["entitled_share_error_pts"] for p in shares.values()), default=0.0))
