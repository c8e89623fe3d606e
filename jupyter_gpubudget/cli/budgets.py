"""`gpubudget budgets check FILE`: validate a budgets file; errors name the file, line and path."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def cmd_budgets_check(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..core.accounts import load_budgets
    from ..core.yamlnodes import MAX_BYTES, ConfigError

    console = Console()
    path = Path(args.file)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BYTES:  # never read a huge file into memory
                raise ConfigError(f"the file is {size / 1e6:.1f} MB; at most "
                                  f"{MAX_BYTES / 1e6:.1f} MB is read", source=str(path))
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        console.print(f"[red]cannot read {path}: {e.strerror}[/]")
        return 2
    b = load_budgets(data, str(path))
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
