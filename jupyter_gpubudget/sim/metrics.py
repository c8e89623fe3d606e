"""Figures from a simulation: waits and JCT per kind, share of grant delivered per project and
program, utilisation, preemptions and lost GPU-hours, fragmentation.

Definitions (documented in docs/simulator.md):
- **wait**: first start − submission (seconds); workloads that never started are counted in
  ``never_started`` and left out of the percentiles.
- **JCT**: completion − submission, for completed workloads.
- **delivered**: GPU-hours charged to a project over the run (slice fraction × run time).
- **grant share**: the account's effective grant / the sum of its siblings' (or, for programs,
  the top level's) grants; **delivered share**: its delivered GPU-hours / the same sum among
  siblings. ``delivered_vs_grant`` = delivered share / grant share (1.0 = exactly its grant's
  share; projects with no demand deliver less, and idle capacity goes to whoever wants it).
- **utilisation**: *useful* GPU-hours / (GPU capacity × span): GPU-hours charged, each
  times the progress rate its gang had on the links it got (``sim/interconnect.py``);
  ``held_utilisation``: GPU-hours charged / (GPU capacity × span).
- **stranded**: free GPU capacity on partly used GPUs (shared or MIG), as a fraction of the
  cluster's capacity (mean over samples).
- **contended share**: an account's share of the GPU-hours delivered while work was waiting
  (when budgets decide who runs); **demand share**: its share of the GPU-hours asked for.
- Work submitted after the clock stopped (``--horizon``) is left out of every figure.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.accounts import AccountTree
from ..core.model import HOUR, KINDS, gpu_fraction
from .engine import UNUSED_CAUSES, SimResult
from .usage import max_member_share_error, member_shares


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q, method="linear"))


def compute(res: SimResult) -> dict[str, Any]:
    span = max(res.end - res.start, 1e-9)
    cap_hours = res.total_milli / 1000 * span / HOUR
    # work submitted after the clock stopped (a --horizon) is not part of the figures
    arrived = {k: r for k, r in res.records.items() if r.job.submit <= res.end}
    kinds: dict[str, Any] = {}
    for kind in KINDS:
        recs = [r for r in arrived.values() if r.job.kind == kind]
        if not recs:
            continue
        waits = [r.wait for r in recs if r.wait is not None]
        jcts = [r.jct for r in recs if r.jct is not None]
        kinds[kind] = {
            "count": len(recs),
            "completed": len(jcts),
            "never_started": sum(1 for r in recs if r.first_start is None),
            "dropped": sum(1 for r in recs if r.dropped),
            "wait_p50_s": _pct(waits, 50), "wait_p90_s": _pct(waits, 90),
            "wait_p99_s": _pct(waits, 99),
            "wait_mean_s": float(np.mean(waits)) if waits else None,
            "jct_p50_s": _pct(jcts, 50), "jct_p90_s": _pct(jcts, 90),
            "jct_mean_s": float(np.mean(jcts)) if jcts else None,
            "preemptions": sum(r.preemptions for r in recs),
            "preempted_workloads": sum(1 for r in recs if r.preemptions),
            "lost_gpu_hours": sum(r.lost_gpu_hours for r in recs),
        }
    delivered = sum(res.project_hours.values())
    useful = sum(r.useful_gpu_hours for r in res.records.values())
    preemptions = sum(r.preemptions for r in arrived.values())
    lost = sum(r.lost_gpu_hours for r in arrived.values())
    accounts = account_shares(res.accounts, res.project_hours, arrived, cap_hours,
                              res.contended_hours)
    programs = [a for a in accounts.values() if a["parent"] is None]
    entitled = entitled_shares({n: a for n, a in accounts.items() if a["parent"] is None},
                               window_demand(res.accounts, arrived, res.end))
    out: dict[str, Any] = {
        "trace": res.trace_source,
        "workloads": len(res.records),
        "arrived": len(arrived),
        "span_hours": span / HOUR,
        "gpus": res.total_milli / 1000,
        "events": res.events,
        "cycles": res.cycles,
        "decisions": res.decisions,
        "kinds": kinds,
        "utilisation": useful / cap_hours if cap_hours > 0 else 0.0,
        "held_utilisation": delivered / cap_hours if cap_hours > 0 else 0.0,
        "delivered_gpu_hours": delivered,
        "useful_gpu_hours": useful,
        "preemptions": preemptions,
        "preemptions_per_workload": preemptions / len(arrived) if arrived else 0.0,
        "node_failure_stops": sum(r.failures for r in arrived.values()),
        "lost_gpu_hours": lost,
        "lost_pct_of_delivered": 100.0 * lost / delivered if delivered > 0 else 0.0,
        # how far each program's delivered share is from its grant share (percentage
        # points): over the whole run, and counting only what ran while work waited
        "share_error_pts": max((100.0 * abs(a["delivered_share"] - a["grant_share"])
                                for a in programs), default=0.0),
        # ... and from the share it was entitled to: a program that asked for less than its
        # grant's share got all it asked for, the rest shared by grant (max-min fairness)
        "entitled_share_error_pts": max(
            (100.0 * abs(accounts[n]["delivered_share"] - e) for n, e in entitled.items()),
            default=0.0),
        # ... and the grant error that max-min fairness itself has: what no scheduler that
        # delivers as much can go below when a program asked for less than its grant's
        # part (its demand caps its share)
        "share_error_floor_pts": max(
            (round(100.0 * abs(e - accounts[n]["grant_share"]), 9)
             for n, e in entitled.items()), default=0.0),
        "contended_share_error_pts": max(
            (100.0 * abs(a["contended_share"] - a["grant_share"]) for a in programs),
            default=0.0),
        "stranded_fraction": (float(np.mean([s.stranded_milli / s.total_milli
                                             for s in res.samples])) if res.samples else 0.0),
        "unused": unused_breakdown(res),
        "accounts": accounts,
    }
    # inside each project: each member's share of its GPU-hours against an equal (or the
    # stated) share among the members who asked (sim/usage.py)
    out["member_shares"] = member_shares(res)
    out["member_share_error_pts"], out["member_entitled_share_error_pts"] = (
        max_member_share_error(out["member_shares"]))
    if len(res.cluster_gpus) > 1:
        out["clusters"] = cluster_figures(res, span)
    return out


def cluster_figures(res: SimResult, span: float) -> dict[str, Any]:
    """Several named clusters under one budget tree: per cluster, its GPUs, held utilisation
    (GPU-hours charged there / its capacity × span) and each top-level account's share of what
    was delivered there; the global figures are the report's own."""
    tree = res.accounts
    out: dict[str, Any] = {}
    for name, gpus in sorted(res.cluster_gpus.items()):
        hours = res.cluster_hours.get(name, {})
        total = sum(hours.values())
        shares: dict[str, float] = {}
        for project, h in hours.items():
            top = tree.path(project)[0] if project in tree else project
            shares[top] = shares.get(top, 0.0) + h
        out[name] = {"gpus": gpus, "delivered_gpu_hours": total,
                     "held_utilisation": total / (gpus * span / HOUR) if gpus else 0.0,
                     "program_shares": {k: v / total if total else 0.0
                                        for k, v in sorted(shares.items())}}
    return out


def unused_breakdown(res: SimResult) -> dict[str, float]:
    """Mean share of the cluster's GPU capacity left unused, by cause (see
    ``engine.unused_by_cause``), over the samples; they add up to about 1 − utilisation."""
    if not res.samples:
        return dict.fromkeys(UNUSED_CAUSES, 0.0)
    n = len(res.samples)
    return {cause: sum(s.unused.get(cause, 0) / s.total_milli for s in res.samples) / n
            for cause in UNUSED_CAUSES}


def window_demand(tree: AccountTree, records: dict[str, Any], end: float) -> dict[str, float]:
    """GPU-hours each account's work could have used before ``end``: per workload its slice
    × its run time, cut at ``end`` (work submitted late could not use more)."""
    out: dict[str, float] = {}
    for r in records.values():
        j = r.job
        if j.project not in tree.accounts:
            continue
        frac = r.milli / 1000 if r.milli else gpu_fraction(j.request)
        h = frac * max(0.0, min(j.duration, end - j.submit)) / HOUR
        for a in tree.path(j.project):
            out[a] = out.get(a, 0.0) + h
    return out


def entitled_shares(siblings: dict[str, dict[str, Any]], demand: dict[str, float]
                    ) -> dict[str, float]:
    """Each sibling's share of what the siblings were delivered under max-min fairness by
    grant: one that asked for less than its grant's part is entitled to all it asked for,
    and what it leaves is shared among the others by their grants (water-filling)."""
    total = sum(a["delivered_gpu_hours"] for a in siblings.values())
    if total <= 0:
        return {n: a["grant_share"] for n, a in siblings.items()}
    active = {n: a["grant_share"] for n, a in siblings.items()}
    out: dict[str, float] = {}
    left = total
    while active:
        g = sum(active.values())
        if g <= 0:
            out.update({n: 0.0 for n in active})
            break
        capped = {n for n, gs in active.items() if demand.get(n, 0.0) <= left * gs / g}
        if not capped:
            out.update({n: left * gs / g / total for n, gs in active.items()})
            break
        for n in capped:
            out[n] = demand.get(n, 0.0) / total
            left -= demand.get(n, 0.0)
            del active[n]
    return out


def account_shares(tree: AccountTree, project_hours: dict[str, float],
                   records: dict[str, Any], cap_hours: float,
                   contended_hours: dict[str, float] | None = None) -> dict[str, Any]:
    """Per account (projects and programs): grant, delivered GPU-hours, their shares among
    siblings, demand (GPU-hours asked for) and its share, and what was delivered while work
    waited (the cluster contended: where budgets decide) and its share."""
    grants = tree.effective_grants(cap_hours)
    delivered: dict[str, float] = {a: 0.0 for a in tree.accounts}
    contended: dict[str, float] = {a: 0.0 for a in tree.accounts}
    demand: dict[str, float] = {a: 0.0 for a in tree.accounts}
    for p, h in project_hours.items():
        if p in tree.accounts:
            for a in tree.path(p):
                delivered[a] += h
    for p, h in (contended_hours or {}).items():
        if p in tree.accounts:
            for a in tree.path(p):
                contended[a] += h
    for r in records.values():
        j = r.job
        if j.project in tree.accounts:
            frac = r.milli / 1000 if r.milli else gpu_fraction(j.request)
            for a in tree.path(j.project):
                demand[a] += frac * j.duration / HOUR
    out = {}
    for name, acc in tree.accounts.items():
        sibs = (tree.accounts[acc.parent].children if acc.parent else tree.roots)
        g_sum = sum(grants.get(s, 0.0) for s in sibs)
        d_sum = sum(delivered.get(s, 0.0) for s in sibs)
        c_sum = sum(contended.get(s, 0.0) for s in sibs)
        n_sum = sum(demand.get(s, 0.0) for s in sibs)
        gs = grants.get(name, 0.0) / g_sum if g_sum > 0 else 0.0
        ds = delivered[name] / d_sum if d_sum > 0 else 0.0
        out[name] = {
            "parent": acc.parent, "is_project": not acc.children,
            "grant_hours_per_window": grants.get(name, 0.0),
            "delivered_gpu_hours": delivered[name], "demand_gpu_hours": demand[name],
            "contended_gpu_hours": contended[name],
            "grant_share": gs, "delivered_share": ds,
            "demand_share": demand[name] / n_sum if n_sum > 0 else 0.0,
            "contended_share": contended[name] / c_sum if c_sum > 0 else 0.0,
            "delivered_vs_grant": ds / gs if gs > 0 else None,
        }
    return out


def utilisation_series(res: SimResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hours since start, used fraction, stranded fraction) at each sample."""
    t = np.array([(s.t - res.start) / HOUR for s in res.samples])
    u = np.array([s.used_milli / s.total_milli for s in res.samples])
    f = np.array([s.stranded_milli / s.total_milli for s in res.samples])
    return t, u, f


def waits_by_kind(res: SimResult) -> dict[str, np.ndarray]:
    out = {}
    for kind in KINDS:
        w = [r.wait for r in res.records.values() if r.job.kind == kind and r.wait is not None]
        if w:
            out[kind] = np.sort(np.asarray(w, dtype=float))
    return out


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Side-by-side differences of two metric dicts (b − a) for the headline figures."""
    rows: dict[str, Any] = {}
    for kind in KINDS:
        ka, kb = a["kinds"].get(kind), b["kinds"].get(kind)
        if not ka or not kb:
            continue
        for key in ("wait_p50_s", "wait_p90_s", "wait_p99_s", "jct_p50_s", "preemptions"):
            va, vb = ka.get(key), kb.get(key)
            rows[f"{kind}.{key}"] = {"a": va, "b": vb,
                                     "diff": None if va is None or vb is None else vb - va}
    for key in ("utilisation", "preemptions", "lost_gpu_hours", "stranded_fraction"):
        rows[key] = {"a": a[key], "b": b[key], "diff": b[key] - a[key]}
    for name in a["accounts"]:
        if name in b["accounts"]:
            va = a["accounts"][name]["delivered_share"]
            vb = b["accounts"][name]["delivered_share"]
            rows[f"{name}.delivered_share"] = {"a": va, "b": vb, "diff": vb - va}
            ca = a["accounts"][name].get("contended_share", 0.0)
            cb = b["accounts"][name].get("contended_share", 0.0)
            rows[f"{name}.contended_share"] = {"a": ca, "b": cb, "diff": cb - ca}
            ga = a["accounts"][name]["grant_share"]
            gb = b["accounts"][name]["grant_share"]
            rows[f"{name}.grant_share"] = {"a": ga, "b": gb, "diff": gb - ga}
    return rows
