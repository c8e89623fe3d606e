"""`gpubudget report ACCOUNT --from --to [--by day|week|user] [--csv FILE] [--plot FILE.png]`:
where an account subtree's GPU-hours went (``GET /api/v1/reports``): a table of charged, busy
and idle GPU-hours per project and user, and a picture of charged vs busy per project over
time. Busy time nothing measured is shown as "unknown"."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from .jobs import ServiceError, _client_args, _default_url, call


def _h(x: float | None) -> str:
    return "unknown" if x is None else f"{x:,.1f}"


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.0f} %"


def _query(args: argparse.Namespace, by: str, fmt: str = "json") -> str:
    q: dict[str, str] = {"account": args.account, "by": by, "tz": args.tz}
    if args.period:
        q["period"] = args.period
        if args.at:
            q["at"] = args.at
    else:
        q["from"], q["to"] = getattr(args, "from"), args.to
    if fmt != "json":
        q["format"] = fmt
    return "/reports?" + urlencode(q)


def _get_text(args: argparse.Namespace, path: str) -> str:
    url = (args.url or _default_url()).rstrip("/") + "/api/v1" + path
    token = args.token or os.environ.get("GPUBUDGET_TOKEN") or os.environ.get(
        "JUPYTERHUB_API_TOKEN")
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.read().decode()
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            raise ServiceError(e.code, json.loads(raw)) from None
        except ValueError:
            raise ServiceError(e.code, raw.decode(errors="replace")) from None


def table(rep: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title=f"{rep['account']}: {rep['from_local'][:16]} to {rep['to_local'][:16]} "
                    f"({rep.get('tz', 'UTC')})")
    lines = [rep["totals"], *rep["projects"], *(u for p in rep["projects"] for u in p["users"])]
    # GPU-hours at their price (off-peak parts at the policy's factor), where they differ
    priced = any(e.get("priced_gpu_h") is not None
                 and abs(e["priced_gpu_h"] - e["charged_gpu_h"]) > 5e-4 for e in lines)
    cols = ["project", "user", "charged GPU-h", *(["at price GPU-h"] if priced else []),
            "measured GPU-h", "busy GPU-h", "idle GPU-h", "idle share", "grant GPU-h",
            "preemptions"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("project", "user") else "right")

    def figs(e: dict[str, Any]) -> list[str]:
        return [_h(e["charged_gpu_h"]), *([_h(e["priced_gpu_h"])] if priced else []),
                _h(e["measured_gpu_h"]), _h(e["busy_gpu_h"]), _h(e["idle_gpu_h"]),
                _pct(e["idle_share"])]

    for p in rep["projects"]:
        g = p.get("grant_gpu_h")
        t.add_row(p["project"], "", *figs(p), "" if g is None else _h(g),
                  str(p.get("preemptions", 0)))
        for u in p["users"]:
            t.add_row("", u["user"], *figs(u), "", "")
    tot = rep["totals"]
    g = tot.get("grant_gpu_h")
    t.add_row("total", "", *figs(tot), "" if g is None else _h(g),
              str(tot.get("preemptions", 0)), style="bold")
    return t


def plot(rep: dict[str, Any], path: Path) -> None:
    """Charged (solid) and busy (dashed, where measured) GPU-hours per project per period."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    periods = rep.get("periods") or []
    projects = [p["project"] for p in rep["projects"]]
    fig, ax = plt.subplots(figsize=(10, 5))
    xs = [datetime.fromisoformat(per["start_local"]) for per in periods]
    for i, name in enumerate(projects):
        color = f"C{i % 10}"
        charged, busy = [], []
        for per in periods:
            e = next((x for x in per["projects"] if x["project"] == name), None)
            charged.append(e["charged_gpu_h"] if e else 0.0)
            busy.append(e["busy_gpu_h"] if e and e["busy_gpu_h"] is not None else float("nan"))
        ax.plot(xs, charged, color=color, marker="o", label=f"{name} charged")
        ax.plot(xs, busy, color=color, linestyle="--", marker="x", label=f"{name} busy")
    ax.set_ylabel(f"GPU-hours per {rep.get('by', 'day')}")
    ax.set_title(f"{rep['account']}: charged vs busy GPU-hours ({rep.get('tz', 'UTC')}; "
                 "busy missing where nothing measured)")
    ax.grid(alpha=0.3)
    if projects:
        ax.legend(fontsize="small", ncol=2)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cmd_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    if not args.period and not (getattr(args, "from") and args.to):
        print("gpubudget report: give --from and --to (dates), or --period day|week|month",
              file=sys.stderr)
        return 2
    try:
        rep = call(args, "GET", _query(args, args.by))
        series = rep
        if args.plot and args.by == "user":
            series = call(args, "GET", _query(args, "day"))
        if args.csv:
            Path(args.csv).write_text(_get_text(args, _query(args, args.by, "csv")),
                                      encoding="utf-8")
    except (ServiceError, OSError) as e:
        print(f"gpubudget report: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        Console(width=max(100, Console().width)).print(table(rep))
        waits = rep.get("waits") or {}
        for kind, w in waits.items():
            p50, p90 = w.get("p50_s"), w.get("p90_s")
            print(f"waits ({kind}, {w['count']} started): p50 "
                  f"{'-' if p50 is None else f'{p50 / 60:.1f} min'}, p90 "
                  f"{'-' if p90 is None else f'{p90 / 60:.1f} min'}")
        for s in rep.get("idle_sessions") or []:
            print(f"idle session {s['name'] or s['workload']} ({s['user']}, {s['project']}): "
                  f"{s['idle_gpu_h']:.1f} GPU-h idle of {s['measured_gpu_h']:.1f} measured")
    if args.plot:
        plot(series, Path(args.plot))
        print(f"wrote {args.plot}")
    if args.csv:
        print(f"wrote {args.csv}")
    return 0


def add_report_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("report", help="where an account's GPU-hours went: charged, busy, idle "
                       "per project and user over a period")
    p.add_argument("account", help="an account of the budgets file (and everything below it)")
    p.add_argument("--from", dest="from", default=None,
                   help="first day (2025-03-01) or date and time, in --tz")
    p.add_argument("--to", default=None, help="last day (included) or date and time, in --tz")
    p.add_argument("--period", choices=("day", "week", "month"), default=None,
                   help="instead of --from/--to: the day, week or month holding --at")
    p.add_argument("--at", default=None, help="a date within --period (default: today)")
    p.add_argument("--by", choices=("day", "week", "user"), default="user",
                   help="figures per local day, week (Monday) or user (default)")
    p.add_argument("--tz", default="UTC",
                   help="IANA time zone of the dates and periods, e.g. Europe/Berlin "
                        "(default: UTC)")
    p.add_argument("--csv", default=None, metavar="FILE", help="also write the report as CSV")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="also draw charged vs busy GPU-hours per project over time")
    _client_args(p)
    p.set_defaults(func=cmd_report)
    return p
