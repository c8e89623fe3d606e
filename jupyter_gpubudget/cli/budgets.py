"""`gpubudget budgets check FILE`: validate a budgets file; errors name the file, line and path."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def cmd_budgets_check(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..core.accounts import load_budgets

    console = Console()
    path = Path(args.file)
    try:
        text = path.read_text()
    except OSError as e:
        console.print(f"[red]cannot read {path}: {e.strerror}[/]")
        return 2
    b = load_budgets(text, str(path))
    projects = b.accounts.projects()
    console.print(f"[green]{path}: OK[/] — {len(b.accounts.accounts)} accounts, "
                  f"{len(projects)} projects, window {b.policy.window / 86400:g} days"
                  + (f", half-life {b.policy.half_life / 86400:g} days" if b.policy.half_life else ""))
    return 0


def add_budgets_parser(sub: Any) -> argparse.ArgumentParser:
    b = sub.add_parser("budgets", help="work with budgets YAML files")
    bsub = b.add_subparsers(dest="budgets_command", required=True)
    c = bsub.add_parser("check", help="validate a budgets file; errors name the path and line")
    c.add_argument("file")
    c.set_defaults(func=cmd_budgets_check)
    return b
