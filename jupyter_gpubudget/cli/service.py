"""`gpubudget service`: run the hub service (usually started by JupyterHub). Every option
after the sub-command goes to the service (traitlets options: ``--budgets=...``,
``--Class.trait=...``)."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_service(args: argparse.Namespace) -> int:
    from jupyter_gpubudget.service.app import main

    main(args.service_args)
    return 0


def add_service_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("service", help="run the gpubudget hub service (usually started by "
                       "JupyterHub); options: --budgets, --inventory, --db, --port, ...",
                       add_help=False)
    p.add_argument("service_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_service)
    return p


def parse(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``ap.parse_args``, except that ``service`` passes every option on to the service."""
    args, extra = ap.parse_known_args(argv)
    if getattr(args, "func", None) is cmd_service:
        args.service_args = extra + list(args.service_args)
    elif extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    return args
