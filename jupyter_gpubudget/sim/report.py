"""Reporting a simulation: a rich table in the terminal, JSON for machines, PNG plots.

Plots use matplotlib's Agg backend (no display needed): wait-time CDFs per kind, delivered
share vs grant share per account, utilisation and stranded capacity over time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..core.model import KINDS
from . import metrics
from .engine import SimResult


def fmt_secs(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "–"
    if s < 90:
        return f"{s:.0f}s"
    if s < 90 * 60:
        return f"{s / 60:.1f}m"
    if s < 48 * 3600:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def kinds_table(m: dict[str, Any], title: str = "Waits and completion by kind") -> Table:
    t = Table(title=title)
    for col in ("kind", "count", "wait p50", "wait p90", "wait p99", "JCT p50", "JCT p90",
                "preempted", "lost GPU-h", "never started"):
        t.add_column(col, justify="right" if col != "kind" else "left", overflow="fold")
    for kind in KINDS:
        k = m["kinds"].get(kind)
        if not k:
            continue
        t.add_row(kind, str(k["count"]), fmt_secs(k["wait_p50_s"]), fmt_secs(k["wait_p90_s"]),
                  fmt_secs(k["wait_p99_s"]), fmt_secs(k["jct_p50_s"]), fmt_secs(k["jct_p90_s"]),
                  f"{k['preemptions']} ({k['preempted_workloads']})",
                  f"{k['lost_gpu_hours']:.1f}", str(k["never_started"]))
    return t


def accounts_table(m: dict[str, Any], title: str = "Share of grant delivered") -> Table:
    t = Table(title=title)
    for col in ("account", "grant/window", "grant share", "demand share", "delivered GPU-h",
                "delivered share", "share while contended", "delivered ÷ grant",
                "demand GPU-h"):
        t.add_column(col, justify="right" if col != "account" else "left",
                     overflow="fold", no_wrap=col == "account")
    accts = m["accounts"]

    def depth(name: str) -> int:
        d, cur = 0, accts[name]["parent"]
        while cur is not None:
            d, cur = d + 1, accts[cur]["parent"]
        return d

    def walk(parent: str | None) -> None:
        for name, a in accts.items():
            if a["parent"] == parent:
                r = a["delivered_vs_grant"]
                t.add_row("  " * depth(name) + name, f"{a['grant_hours_per_window']:.0f}",
                          _pct(a["grant_share"]), _pct(a.get("demand_share")),
                          f"{a['delivered_gpu_hours']:.1f}", _pct(a["delivered_share"]),
                          _pct(a.get("contended_share")), "–" if r is None else f"{r:.2f}",
                          f"{a['demand_gpu_hours']:.1f}")
                walk(name)

    walk(None)
    return t


def summary_table(m: dict[str, Any], title: str = "Cluster") -> Table:
    t = Table(title=title, show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("trace", str(m["trace"]))
    t.add_row("workloads", str(m["workloads"]))
    t.add_row("GPUs", f"{m['gpus']:g}")
    t.add_row("simulated span", fmt_secs(m["span_hours"] * 3600))
    if m.get("arrived", m["workloads"]) != m["workloads"]:
        t.add_row("arrived before the clock stopped", str(m["arrived"]))
    t.add_row("utilisation", _pct(m["utilisation"]))
    unused = m.get("unused") or {}
    for cause, label in UNUSED_LABELS.items():
        if cause in unused:
            t.add_row(f"  unused: {label}", _pct(unused[cause]))
    t.add_row("stranded GPU (mean)", _pct(m["stranded_fraction"]))
    per = m.get("preemptions_per_workload")
    t.add_row("preemptions", str(m["preemptions"]) + ("" if per is None else
                                                      f" ({per:.3f} per workload)"))
    t.add_row("node-failure stops", str(m["node_failure_stops"]))
    lost_pct = m.get("lost_pct_of_delivered")
    t.add_row("lost GPU-hours", f"{m['lost_gpu_hours']:.1f}" + (
        "" if lost_pct is None else f" ({lost_pct:.2f}% of delivered)"))
    if "share_error_pts" in m:
        t.add_row("programs' share − grant share (max)",
                  f"{m['share_error_pts']:.1f} pt (while contended "
                  f"{m['contended_share_error_pts']:.1f} pt)")
    if "entitled_share_error_pts" in m:
        t.add_row("programs' share − entitled share (max)",
                  f"{m['entitled_share_error_pts']:.1f} pt (a program that asked for less "
                  "than its grant's part is entitled to what it asked for)"
                  + ("" if "share_error_floor_pts" not in m else
                     f"; the fair split's own error from grants: "
                     f"{m['share_error_floor_pts']:.1f} pt"))
    if "member_share_error_pts" in m:
        t.add_row("members' share − fair share inside a project (max)",
                  f"{m['member_share_error_pts']:.1f} pt (from the entitled share "
                  f"{m['member_entitled_share_error_pts']:.1f} pt)")
    t.add_row("events / cycles", f"{m['events']} / {m['cycles']}")
    return t


#: the report's names for the causes of unused capacity (engine.UNUSED_CAUSES)
UNUSED_LABELS = {
    "mig_no_demand": "MIG capacity, no MIG demand",
    "reserved": "held for a gang's reservation",
    "fragmentation": "fragments no waiting request fits",
    "drained": "on drained / failed nodes",
    "empty_queue": "idle, nothing waiting",
    "awaiting_cycle": "waiting for the next cycle",
}


def print_report(m: dict[str, Any], console: Console | None = None) -> None:
    c = console or Console()
    c.print(summary_table(m))
    c.print(kinds_table(m))
    c.print(accounts_table(m))
    if m.get("member_shares"):
        c.print(members_table(m))
    if m.get("clusters"):
        c.print(clusters_table(m))


def members_table(m: dict[str, Any], title: str = "Members' shares inside projects",
                  top: int = 40) -> Table:
    """Per project and member who asked for GPU time: delivered GPU-hours, their share of
    the project's, the fair share (equal among those who asked, or the stated one), the
    difference and the difference from the max-min entitled share; the ``top`` members
    furthest from their fair share."""
    t = Table(title=title)
    for col in ("project", "member", "delivered GPU-h", "share", "fair share",
                "share − fair", "share − entitled"):
        t.add_column(col, justify="left" if col in ("project", "member") else "right")
    rows = [(p, u, e) for p, pe in m["member_shares"].items() for u, e in pe["members"].items()]
    rows.sort(key=lambda x: (-abs(x[2]["share_error_pts"]), x[0], x[1]))
    for p, u, e in sorted(rows[:top], key=lambda x: (x[0], x[1])):
        t.add_row(p, u or "–", f"{e['delivered_gpu_h']:.1f}", _pct(e["delivered_share"]),
                  _pct(e["fair_share"]), f"{e['share_error_pts']:+.1f} pt",
                  f"{e['entitled_share_error_pts']:+.1f} pt")
    if len(rows) > top:
        t.caption = f"the {top} of {len(rows)} members furthest from their fair share"
    return t


def clusters_table(m: dict[str, Any], title: str = "Per cluster (one budget tree)") -> Table:
    """Several named clusters: each one's GPUs, held utilisation and the programs' shares of
    what it delivered, then the global figures (the summary's)."""
    t = Table(title=title)
    programs = sorted({p for c in m["clusters"].values() for p in c["program_shares"]})
    for col in ("cluster", "GPUs", "delivered GPU-h", "held utilisation", *programs):
        t.add_column(col, justify="left" if col == "cluster" else "right")
    for name, c in m["clusters"].items():
        t.add_row(name, f"{c['gpus']:g}", f"{c['delivered_gpu_hours']:.1f}",
                  _pct(c["held_utilisation"]),
                  *(_pct(c["program_shares"].get(p, 0.0)) for p in programs))
    glob = {a: v for a, v in m["accounts"].items() if v["parent"] is None}
    t.add_row("all", f"{m['gpus']:g}", f"{m['delivered_gpu_hours']:.1f}",
              _pct(m["held_utilisation"]),
              *(_pct(glob[p]["delivered_share"]) if p in glob else "–" for p in programs))
    return t


def compare_table(a: dict[str, Any], b: dict[str, Any], name_a: str, name_b: str) -> Table:
    rows = metrics.compare(a, b)
    t = Table(title=f"What-if: {name_a} → {name_b}")
    t.add_column("figure")
    t.add_column(name_a, justify="right")
    t.add_column(name_b, justify="right")
    t.add_column("difference", justify="right")
    for key, r in rows.items():
        va, vb, d = r["a"], r["b"], r["diff"]
        kind = ("time" if key.endswith("_s") else
                "pct" if "share" in key or key in ("utilisation", "stranded_fraction") else "num")
        t.add_row(key, _cell(va, kind), _cell(vb, kind), _cell(d, kind, diff=True))
    return t


def _cell(x: float | int | None, kind: str, diff: bool = False) -> str:
    if x is None:
        return "–"
    if kind == "time":
        return (("+" if x >= 0 else "−") + fmt_secs(abs(x))) if diff else fmt_secs(x)
    if kind == "pct":
        return f"{100 * x:+.1f} pt" if diff else _pct(x)
    if isinstance(x, float):
        return f"{x:+.1f}" if diff else f"{x:.1f}"
    return f"{x:+d}" if diff else str(x)


def write_json(m: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(m, indent=2, sort_keys=True, default=_jsonable) + "\n")


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    return str(x)


def write_plots(res: SimResult, m: dict[str, Any], outdir: str | Path, label: str = ""
                ) -> list[Path]:
    """Three PNGs in ``outdir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    prefix = f"{label}-" if label else ""
    paths = []

    # wait-time CDFs per kind
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, w in metrics.waits_by_kind(res).items():
        y = [(i + 1) / len(w) for i in range(len(w))]
        ax.step([max(x, 1.0) / 60 for x in w], y, where="post", label=f"{kind} (n={len(w)})")
    ax.set_xscale("log")
    ax.set_xlabel("wait before first start (minutes, log)")
    ax.set_ylabel("fraction of workloads")
    ax.set_title("Wait-time CDF by kind")
    ax.grid(True, alpha=0.3)
    ax.legend()
    p = out / f"{prefix}wait_cdf.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    # delivered vs grant share
    accts = m["accounts"]
    names = list(accts)
    fig, ax = plt.subplots(figsize=(max(7, 1.2 * len(names) + 2), 4.5))
    xs = range(len(names))
    bars = (("grant_share", "grant share (among siblings)"), ("demand_share", "demand share"),
            ("delivered_share", "delivered share"),
            ("contended_share", "delivered share while work waited"))
    width = 0.8 / len(bars)
    for k, (key, label) in enumerate(bars):
        ax.bar([x - 0.4 + width * (k + 0.5) for x in xs],
               [100 * accts[n].get(key, 0.0) for n in names], width, label=label)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([("· " if not accts[n]["is_project"] else "") + n for n in names],
                       rotation=30, ha="right")
    ax.set_ylabel("% of siblings' total")
    ax.set_title("Grant, demand and delivered share (· = program)")
    ax.legend(fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)
    p = out / f"{prefix}delivered_vs_grant.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    # utilisation and stranded capacity over time
    t, u, f = metrics.utilisation_series(res)
    fig, ax = plt.subplots(figsize=(8, 4))
    scale, unit = (24.0, "days") if len(t) and t[-1] > 72 else (1.0, "hours")
    ax.plot(t / scale, 100 * u, label="GPU allocated", lw=1)
    ax.plot(t / scale, 100 * f, label="stranded (free on partly used GPUs)", lw=1)
    ax.set_xlabel(f"simulated time ({unit})")
    ax.set_ylabel("% of GPU capacity")
    ax.set_ylim(0, 100)
    ax.set_title("Utilisation over time")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    p = out / f"{prefix}utilisation.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths
