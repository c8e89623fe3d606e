"""`gpubudget snapshot list | create | restore`: snapshots of my notebook sessions.

A snapshot is a *set*: every kernel of a user's server, saved together (CRIU: the whole
process; namespace: the variables and cell history). The server takes and stores them; the
service lists them and carries requests to the server (see docs/snapshot.md). Times are shown
in local time.

- ``list [--session ID] [--all]``: my snapshots, newest first (size, when, how, what was
  saved; ``--all`` includes ones that failed verification).
- ``create [--session ID] [--no-wait]``: ask my running server for a snapshot now (the only
  running session, when there is one); waits for it.
- ``restore SNAPSHOT [--no-wait]``: restore it — into the running server of its session, or by
  starting the server again from it (it then waits in the queue like any spawn); waits and
  prints what came back.
- ``--self``: run inside a user's server (e.g. a Kubernetes preStop hook,
  ``KubePlacement.snapshot_command``): this server saves its kernels now and ends them, as
  before a preemption, through its own server extension (``$JUPYTERHUB_SERVICE_URL``,
  ``$JUPYTERHUB_API_TOKEN``); nothing to do when no kernel runs (BudgetSpawner saved them
  already).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from typing import Any

from .jobs import ServiceError, _client_args, call


def _size(n: int | None) -> str:
    n = int(n or 0)
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} B"


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    t = datetime.fromtimestamp(ts).astimezone()
    today = datetime.now().astimezone().date()
    return t.strftime("%H:%M:%S" if t.date() == today else "%Y-%m-%d %H:%M")


def _saved(s: dict) -> str:
    if s.get("count") is None:
        return "-"
    text = f"{s.get('saved')}/{s.get('count')} kernels"
    unsaved = sorted({k for x in s.get("kernels") or [] for k in (x.get("unsaved") or {})})
    if unsaved:
        text += f"; not saveable: {', '.join(unsaved)}"
    return text


def _print_list(items: list[dict]) -> None:
    if not items:
        print("no snapshots")
        return
    print(f"{'SNAPSHOT':<40} {'WHEN':<17} {'SIZE':>9} {'HOW':<15} {'WHY':<9} {'STATUS':<7} SAVED")
    for s in items:
        status = s.get("status", "")
        print(f"{s['id']:<40} {_when(s.get('created_at')):<17} "
              f"{_size(s.get('stored_bytes')):>9} {s.get('method', ''):<15} "
              f"{s.get('reason') or '':<9} {status:<7} {_saved(s)}"
              + (f"  ({s['problem']})" if s.get("problem") else ""))


def _running_session(args: argparse.Namespace) -> str:
    if args.session:
        return args.session
    mine = call(args, "GET", "/sessions?state=running")["sessions"]
    if len(mine) != 1:
        names = ", ".join(f"{s['id']} ({s['name']})" for s in mine) or "none"
        raise ServiceError(400, {"message": f"--session: which running session? ({names})"})
    return mine[0]["id"]


def _wait_request(args: argparse.Namespace, sid: str, rid: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        out = call(args, "GET", f"/sessions/{sid}/requests/{rid}")
        if out["state"] != "open":
            return out
        if time.monotonic() > deadline:
            raise ServiceError(504, {"message": f"request {rid} still open after "
                                                f"{timeout:.0f} s (it goes on)"})
        time.sleep(1.0)


def cmd_list(args: argparse.Namespace) -> int:
    try:
        if args.session:
            out = call(args, "GET", f"/sessions/{args.session}/snapshots")
        else:
            out = call(args, "GET", "/snapshots")
    except (ServiceError, OSError) as e:
        print(f"gpubudget snapshot list: {e}", file=sys.stderr)
        return 1
    items = [s for s in out["snapshots"] if args.all or s.get("status") == "ok"]
    if args.json:
        print(json.dumps({**out, "snapshots": items}, indent=2))
    else:
        _print_list(items)
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    try:
        sid = _running_session(args)
        req = call(args, "POST", f"/sessions/{sid}/snapshots", {})
        if args.no_wait:
            print(json.dumps(req, indent=2) if args.json else
                  f"asked session {sid} for a snapshot (request {req['request']})")
            return 0
        done = _wait_request(args, sid, req["request"], args.timeout)
    except (ServiceError, OSError) as e:
        print(f"gpubudget snapshot create: {e}", file=sys.stderr)
        return 1
    if done["state"] == "failed":
        print(f"gpubudget snapshot create: the server could not take it: {done['reason']}",
              file=sys.stderr)
        return 1
    snap = call(args, "GET", f"/snapshots/{done['detail']['snapshot']}")
    if args.json:
        print(json.dumps(snap, indent=2))
    else:
        _print_list([snap])
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    try:
        out = call(args, "POST", f"/snapshots/{args.snapshot}/restore", {})
        sid = out["session"]
        if not args.no_wait:
            if out.get("request"):
                done = _wait_request(args, sid, out["request"], args.timeout)
                if done["state"] == "failed":
                    print(f"gpubudget snapshot restore: {done['reason']}", file=sys.stderr)
                    return 1
            deadline = time.monotonic() + args.timeout
            while True:
                s = call(args, "GET", f"/sessions/{sid}")
                if (s.get("restored") or {}).get("asked") == args.snapshot:
                    out = {**out, "restored": s["restored"]}
                    break
                if s["state"] not in ("pending", "running") or time.monotonic() > deadline:
                    print(f"gpubudget snapshot restore: session {sid} is {s['state']} and "
                          "has not reported the restore", file=sys.stderr)
                    return 1
                time.sleep(1.0)
    except (ServiceError, OSError) as e:
        print(f"gpubudget snapshot restore: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out, indent=2))
    elif out.get("restored"):
        r = out["restored"]
        print(f"restored {r.get('snapshot')} into session {sid}: {r.get('summary')}")
    else:
        print(f"session {sid}: {out['how']}")
    return 0


def cmd_self(args: argparse.Namespace) -> int:
    """Save this server's kernels through its own server extension."""
    import os
    import urllib.error
    import urllib.request
    from urllib.parse import urlsplit, urlunsplit

    url = os.environ.get("JUPYTERHUB_SERVICE_URL", "")
    token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
    u = urlsplit(url)
    if not (u.scheme and u.netloc and token):
        print("gpubudget snapshot --self: not inside a JupyterHub server "
              "($JUPYTERHUB_SERVICE_URL and $JUPYTERHUB_API_TOKEN)", file=sys.stderr)
        return 2
    host = u.netloc.replace("0.0.0.0", "127.0.0.1").replace("[::]", "[::1]")
    base = urlunsplit((u.scheme, host, u.path.rstrip("/") + "/gpubudget/api/", "", ""))

    def go(method: str, path: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(base + path, method=method, data=None if body is None
                                     else json.dumps(body).encode())
        req.add_header("Authorization", f"token {token}")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=args.timeout) as r:
            return json.loads(r.read() or b"{}")

    try:
        status = go("GET", "snapshots")
        if not status.get("enabled"):
            print(f"gpubudget snapshot --self: {status.get('problem')}", file=sys.stderr)
            return 1
        if not status.get("kernels"):
            print("no kernels run here: nothing to save")
            return 0
        out = go("POST", "snapshots", {"reason": "preempt", "freeze": True})
    except (urllib.error.URLError, OSError, ValueError) as e:
        print(f"gpubudget snapshot --self: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2) if args.json else
          f"snapshot {out['id']}: {out['saved']} of {out['kernels']} kernels saved")
    return 0 if out["saved"] == out["kernels"] else 1


def register(sub: Any) -> None:
    p = sub.add_parser("snapshot", help="snapshots of my notebook sessions: list, create, "
                       "restore", description=__doc__.split("\n\n")[1])
    p.add_argument("--self", dest="self_", action="store_true", help="inside a user's server: "
                   "save its kernels now and end them (a preStop hook)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds (with --self)")
    p.add_argument("--json", action="store_true", help="print the raw JSON answer")
    p.set_defaults(func=lambda a: cmd_self(a) if a.self_ else (p.print_usage(), 2)[1])
    ssub = p.add_subparsers(dest="snapshot_command")
    lp = ssub.add_parser("list", help="my snapshots, newest first (local times)")
    lp.add_argument("--session", help="only this session's (and those it resumed)")
    lp.add_argument("--all", action="store_true", help="include snapshots that failed "
                    "verification")
    _client_args(lp)
    lp.set_defaults(func=cmd_list)
    cp = ssub.add_parser("create", help="snapshot my running server now")
    cp.add_argument("--session", help="the session (default: my only running one)")
    cp.add_argument("--no-wait", action="store_true", help="return once it is asked for")
    cp.add_argument("--timeout", type=float, default=900.0, help="seconds to wait")
    _client_args(cp)
    cp.set_defaults(func=cmd_create)
    rp = ssub.add_parser("restore", help="restore a snapshot (into the running server, or "
                         "by starting it again)")
    rp.add_argument("snapshot", help="snapshot id (gpubudget snapshot list)")
    rp.add_argument("--no-wait", action="store_true", help="return once it is asked for")
    rp.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait")
    _client_args(rp)
    rp.set_defaults(func=cmd_restore)
