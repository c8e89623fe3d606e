"""`gpubudget reservations list | create | cancel`: advance reservations (bookings).

A booking holds whole GPUs for one project over a window: inside it only that project's work
runs there, and its pending work starts on them at once (docs/admin.md, "Reservations").
Admins book for any project, managers for the projects they manage; members see their
projects' bookings. Times are read and shown in local time.

- ``list [--all]``: bookings not yet over (``--all``: every one, cancelled ones too).
- ``create --project P --gpus N --start T --end T [--node NODE ...] [--note TEXT]``: book;
  ``T`` is ``2026-12-07 10:00`` (local time), an ISO time with its offset, or epoch seconds.
- ``cancel ID``: cancel a booking.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from .jobs import ServiceError, _client_args, call


def local_time(text: str) -> float:
    """Epoch seconds of ``text``: epoch seconds, or a date and time (local when it names no
    offset)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        d = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(f"error: not a time: {text!r} (e.g. '2026-12-07 10:00')") from None
    return (d if d.tzinfo else d.astimezone()).timestamp()


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M")


def _print(items: list[dict]) -> None:
    if not items:
        print("no reservations")
        return
    zone = datetime.now().astimezone().strftime("%Z")
    print(f"{'ID':<12} {'PROJECT':<14} {'GPUS':>4}  {'FROM':<16}  {'TO':<16}  {'STATE':<9} "
          f"NODES  (times in {zone})")
    for r in items:
        held = f"{r['gpus']}×{r['mig_profile']}" if r.get("mig_profile") else str(r["gpus"])
        print(f"{r['id']:<12} {r['project']:<14} {held:>4}  {_when(r['start']):<16}  "
              f"{_when(r['end']):<16}  {r['state']:<9} {','.join(r['nodes'])}")


def _run(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    try:
        return call(args, method, path, body)
    except ServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None


def cmd_list(args: argparse.Namespace) -> int:
    out = _run(args, "GET", "/reservations" + ("?all=1" if args.all else ""))
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print(out["reservations"])
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"project": args.project, "gpus": args.gpus,
                            "start": local_time(args.start), "end": local_time(args.end)}
    if args.node:
        body["nodes"] = args.node
    if args.note:
        body["note"] = args.note
    if args.mig_profile:
        body["mig_profile"] = args.mig_profile
    out = _run(args, "POST", "/reservations", body)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        what = (f"{out['gpus']} × MIG {out['mig_profile']}" if out.get("mig_profile")
                else f"{out['gpus']} GPUs")
        print(f"booked {out['id']}: {what} for {out['project']}, "
              f"{_when(out['start'])} – {_when(out['end'])} on {', '.join(out['nodes'])}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    out = _run(args, "DELETE", f"/reservations/{args.id}")
    print(json.dumps(out, indent=2) if args.json else f"cancelled {out['id']}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("reservations", help="advance reservations: list, create, cancel",
                       description=__doc__.split("\n\n")[1])
    p.set_defaults(func=lambda a: (p.print_usage(), 2)[1])
    rs = p.add_subparsers(dest="reservations_command")
    lp = rs.add_parser("list", help="bookings not yet over (local times)")
    lp.add_argument("--all", action="store_true", help="every booking, cancelled ones too")
    _client_args(lp)
    lp.set_defaults(func=cmd_list)
    cp = rs.add_parser("create", help="book whole GPUs (or MIG instances) for a project "
                                      "over a window")
    cp.add_argument("--project", required=True)
    cp.add_argument("--gpus", type=int, required=True,
                    help="how many whole GPUs (with --mig-profile: how many instances)")
    cp.add_argument("--mig-profile", default="",
                    help="book instances of this MIG profile (e.g. 1g.10gb) instead of whole GPUs")
    cp.add_argument("--start", required=True, help="'2026-12-07 10:00' (local), ISO, or epoch")
    cp.add_argument("--end", required=True, help="as --start")
    cp.add_argument("--node", action="append", default=[], help="on this node (repeatable)")
    cp.add_argument("--note", default="")
    _client_args(cp)
    cp.set_defaults(func=cmd_create)
    xp = rs.add_parser("cancel", help="cancel a booking")
    xp.add_argument("id")
    _client_args(xp)
    xp.set_defaults(func=cmd_cancel)
