"""`gpubudget` — the command line: hub, demo, budgets, simulate, submit/jobs/cancel, service."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .core.yamlnodes import ConfigError


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(hours=args.hours)
    return 0


def _cmd_budgets_check(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .core.accounts import load_budgets

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpubudget", description=(
        "Share a GPU cluster by budget, not by priority."))
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="schedule a scripted morning on the demo cluster")
    d.add_argument("--hours", type=float, default=6.0, help="simulated hours to show")
    d.set_defaults(func=_cmd_demo)

    b = sub.add_parser("budgets", help="work with budgets YAML files")
    bsub = b.add_subparsers(dest="budgets_command", required=True)
    c = bsub.add_parser("check", help="validate a budgets file; errors name the path and line")
    c.add_argument("file")
    c.set_defaults(func=_cmd_budgets_check)

    from . import cli_hub, cli_service, cli_sim, cli_slurm

    cli_hub.add_hub_parser(sub)
    cli_sim.add_simulate_parser(sub)
    cli_slurm.add_slurm_parser(sub)
    cli_service.register(sub)  # submit, jobs, cancel, service
    return p


def main(argv: list[str] | None = None) -> int:
    from . import cli_service

    args = cli_service.parse(build_parser(), argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
