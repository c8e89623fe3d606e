"""`gpubudget budget` — ask for more GPU-hours for a project, see the requests, and (managers)
grant or decline them, through the service's REST API (``/budget-requests``); and (managers)
set or clear a member's limit in a project (``/accounts/{project}/member_limits/{user}``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any
from urllib.parse import quote

from .jobs import ServiceError, _client_args, call


def _print(args: argparse.Namespace, out: Any, text: str) -> None:
    print(json.dumps(out, indent=2) if args.json else text)


def cmd_request(args: argparse.Namespace) -> int:
    try:
        r = call(args, "POST", "/budget-requests", {
            "project": args.project, "gpu_hours": args.gpu_hours, "reason": args.reason})
    except ServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    who = ", ".join(r.get("notified") or []) or "the administrators"
    _print(args, r, f"request {r['id']}: {r['gpu_hours']:g} more GPU-hours per window for "
                    f"{r['project']}, waiting for an answer from {who}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    try:
        out = call(args, "GET", f"/budget-requests?state={args.state}")
    except ServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    lines = [f"{'ID':>5}  {'PROJECT':<16} {'BY':<12} {'GPU-H':>8}  {'STATE':<9} WHY / ANSWER"]
    for r in out["requests"]:
        answer = f" — {r['decided_by']}: {r['note']}" if r["decided_by"] else ""
        lines.append(f"{r['id']:>5}  {r['project']:<16} {r['user']:<12} {r['gpu_hours']:>8g}  "
                     f"{r['state']:<9} {r['reason']}{answer}")
    _print(args, out, "\n".join(lines) if out["requests"] else "no requests")
    return 0


def cmd_decide(args: argparse.Namespace) -> int:
    body = {"reason": args.reason} if args.verb == "decline" else (
        {"note": args.note} if args.note else {})
    try:
        out = call(args, "POST", f"/budget-requests/{args.id}/{args.verb}", body)
    except ServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    r = out["request"]
    text = f"request {r['id']} {r['state']}"
    if "grant" in out:
        text += f": {r['project']}'s grant is now {out['grant']['grant_hours']:g} GPU-hours"
    _print(args, out, text)
    return 0


def cmd_limit(args: argparse.Namespace) -> int:
    path = f"/accounts/{quote(args.project, safe='')}/member_limits/{quote(args.user, safe='')}"
    body: dict[str, Any] = {"gpu_hours": args.gpu_hours, "gpus": args.gpus}
    if args.note:
        body["note"] = args.note
    try:
        out = call(args, "DELETE", path) if args.clear else call(args, "PUT", path, body)
    except ServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    lim = out["limit"]
    parts = ([f"{lim['gpu_hours']:g} GPU-h per window"] if lim and lim["gpu_hours"] is not None
             else []) + ([f"{lim['gpus']:g} GPUs at once"] if lim and lim["gpus"] is not None
                         else [])
    _print(args, out, f"{out['user']} in {out['account']}: " + (
        "limited to " + " and ".join(parts) + " (past it, their work runs unbacked)"
        if parts else "no limit"))
    return 0


def register(sub: Any) -> None:
    b = sub.add_parser("budget", help="ask for more GPU-hours for a project; answer requests")
    bsub = b.add_subparsers(dest="budget_command", required=True)
    r = bsub.add_parser("request", help="ask the project's managers for more GPU-hours")
    r.add_argument("project", help="a project you are a member of")
    r.add_argument("--gpu-hours", type=float, required=True,
                   help="how many more GPU-hours per window")
    r.add_argument("--reason", required=True, help="what they are for")
    _client_args(r)
    r.set_defaults(func=cmd_request)
    ls = bsub.add_parser("requests", help="the requests you may answer, and your own")
    ls.add_argument("--state", default="pending",
                    help="pending (default), granted, declined; comma-separated")
    _client_args(ls)
    ls.set_defaults(func=cmd_list)
    g = bsub.add_parser("grant", help="grant a request (managers): raise the project's grant")
    g.add_argument("id", type=int)
    g.add_argument("--note", default="", help="a note for the member")
    _client_args(g)
    g.set_defaults(func=cmd_decide, verb="grant")
    d = bsub.add_parser("decline", help="decline a request (managers), saying why")
    d.add_argument("id", type=int)
    d.add_argument("--reason", required=True, help="why (the member is told)")
    _client_args(d)
    d.set_defaults(func=cmd_decide, verb="decline")
    lim = bsub.add_parser("limit", help="limit a member's GPU-hours per window and running GPUs "
                          "in a project (managers); past it their work runs unbacked")
    lim.add_argument("project")
    lim.add_argument("user")
    lim.add_argument("--gpu-hours", type=float, default=None, help="GPU-hours per window")
    lim.add_argument("--gpus", type=float, default=None, help="GPUs running at once")
    lim.add_argument("--clear", action="store_true", help="remove the member's limit")
    lim.add_argument("--note", default="", help="why (in the audit log)")
    _client_args(lim)
    lim.set_defaults(func=cmd_limit)
