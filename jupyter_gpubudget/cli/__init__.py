"""`gpubudget` — the command line, one module per command group: hub, demo, budgets,
simulate, submit/jobs/cancel/logs, snapshot, reservations, report, service, slurm."""

from __future__ import annotations

import argparse
import sys

from ..core.yamlnodes import ConfigError
from . import (
    budget,
    budgets,
    demo,
    hub,
    jobs,
    report,
    reservations,
    service,
    simulate,
    slurm,
    snapshots,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpubudget", description=(
        "Share a GPU cluster by budget, not by priority."))
    sub = p.add_subparsers(dest="command", required=True)
    demo.add_demo_parser(sub)
    budgets.add_budgets_parser(sub)
    budget.register(sub)
    hub.add_hub_parser(sub)
    simulate.add_simulate_parser(sub)
    slurm.add_slurm_parser(sub)
    jobs.register(sub)
    snapshots.register(sub)
    reservations.register(sub)
    report.add_report_parser(sub)
    service.add_service_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = service.parse(build_parser(), argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
