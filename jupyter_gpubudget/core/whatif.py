"""What a grant change would do, before it is saved; and each account's share of its parent.

:func:`grant_preview` computes standings (and which pending work is backed) with the tree as
it is and with one account's grant changed (``AccountTree.with_grant``), on the same usage;
:func:`standings` the same figures for the tree as it is.
:func:`sibling_shares` says, for every account, which share of its parent's grant it is
entitled to (its grant among its siblings' — the fair-share weight) and which share of the
GPU-hours its siblings used it got (delivered share).

Pure: no I/O; ``state`` is left untouched.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .accounts import AccountTree
from .ranking import INF
from .scheduler import ClusterState, Scheduler


def standings(state: ClusterState, now: float) -> dict[str, dict[str, float]]:
    """Usage (GPU-hours in the window), grant and standing of every account."""
    return _figures(state, now)[1]


def _finite(x: float) -> float | None:
    return None if x == INF or x != x else x


def _figures(state: ClusterState, now: float) -> tuple[Scheduler, dict[str, dict[str, float]]]:
    s = Scheduler.from_state(state)
    st = s.standings(now)
    return s, {a: {"usage_hours": st.usage[a], "grant_hours": st.grant.get(a, 0.0),
                   "standing": st.standing[a]} for a in s.accounts.accounts}


def grant_preview(state: ClusterState, now: float, account: str, grant_hours: float | None,
                  share_pct: float | None) -> dict[str, Any]:
    """Before and after for every account whose effective grant, standing or entitled share
    of its parent (``share_*``, see :func:`sibling_shares`) changes, and the account itself;
    and the pending workloads whose backing changes."""
    tree = state.accounts
    if account not in tree:
        raise KeyError(account)
    after_tree = tree.with_grant(account, grant_hours, share_pct)
    s0, f0 = _figures(state, now)
    s1, f1 = _figures(replace(state, accounts=after_tree), now)
    sh0, sh1 = sibling_shares(tree, f0), sibling_shares(after_tree, f1)
    changed: dict[str, dict[str, Any]] = {}
    for a in tree.accounts:
        b, c = f0[a], f1[a]
        if a == account or abs(b["grant_hours"] - c["grant_hours"]) > 1e-9 or (
                _finite(b["standing"]) != _finite(c["standing"])) or (
                sh0[a]["grant_share"] != sh1[a]["grant_share"]):
            changed[a] = {"usage_hours": b["usage_hours"],
                          "grant_before": b["grant_hours"], "grant_after": c["grant_hours"],
                          "standing_before": _finite(b["standing"]),
                          "standing_after": _finite(c["standing"]),
                          "share_before": sh0[a]["grant_share"],
                          "share_after": sh1[a]["grant_share"]}
    backing = []
    for w in sorted(state.pending, key=lambda w: (w.submitted_at, w.id)):
        if not tree.is_project(w.project):
            continue
        b0, b1 = s0.is_backed(w, now), s1.is_backed(w, now)
        if b0 != b1:
            backing.append({"workload": w.id, "project": w.project, "user": w.user,
                            "backed_before": b0, "backed_after": b1})
    acc = tree.get(account)
    return {"account": account, "grant_hours": grant_hours, "share_pct": share_pct,
            "before": {"grant_hours": acc.grant_hours, "share_pct": acc.share_pct},
            "accounts": changed, "backing": backing}


def sibling_shares(tree: AccountTree, figures: dict[str, dict[str, float]]
                   ) -> dict[str, dict[str, float | None]]:
    """For every account: ``grant_share`` (its effective grant over its siblings' together,
    itself included) and ``delivered_share`` (its usage over theirs; None when none of them
    used anything). Top-level accounts are each other's siblings."""
    groups: dict[str | None, list[str]] = {}
    for name, a in tree.accounts.items():
        groups.setdefault(a.parent, []).append(name)
    out: dict[str, dict[str, float | None]] = {}
    for sibs in groups.values():
        g = sum(figures.get(x, {}).get("grant_hours", 0.0) for x in sibs)
        u = sum(figures.get(x, {}).get("usage_hours", 0.0) for x in sibs)
        for x in sibs:
            fx = figures.get(x, {})
            out[x] = {"grant_share": fx.get("grant_hours", 0.0) / g if g > 0 else None,
                      "delivered_share": fx.get("usage_hours", 0.0) / u if u > 0 else None}
    return out
