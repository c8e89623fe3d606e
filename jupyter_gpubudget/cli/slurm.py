"""`gpubudget slurm ...`: admin commands for the Slurm backend.

- ``sync-accounts``: create (and with ``--prune`` remove) Slurm accounts and user associations
  so that slurmdbd mirrors the budgets tree below one account (``SlurmBackend.root_account``).
  Run it as a Slurm operator/admin (or set ``SlurmBackend.admin_command_prefix``) after every
  change of the budgets file's accounts or members; it is idempotent.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def _backend(args: argparse.Namespace):  # noqa: ANN202
    from traitlets.config import Config, PyFileConfigLoader

    from ..backends.slurm import SlurmBackend

    cfg = Config()
    if args.config:
        path = Path(args.config).resolve()
        cfg = PyFileConfigLoader(path.name, str(path.parent)).load_config()
    if args.root_account:
        cfg.SlurmBackend.root_account = args.root_account
    return SlurmBackend(config=cfg)


def cmd_sync_accounts(args: argparse.Namespace) -> int:
    from ..backends.slurm import SlurmError, sync_accounts
    from ..backends.slurm_map import SlurmMapError
    from ..core.accounts import load_budgets

    path = Path(args.budgets)
    try:
        text = path.read_text()
    except OSError as e:
        print(f"error: cannot read {path}: {e.strerror}", file=sys.stderr)
        return 2
    tree = load_budgets(text, str(path)).accounts  # ConfigError -> exit 2 in cli.main
    backend = _backend(args)
    try:
        plan, cmds = sync_accounts(backend, tree, prune=args.prune, dry_run=args.dry_run)
    except (SlurmError, SlurmMapError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not cmds:
        print(f"Slurm accounts below {backend.root_account!r} already match {path}.")
        return 0
    verb = "would run" if args.dry_run else "ran"
    print(f"{verb} {len(cmds)} sacctmgr command(s):")
    for c in cmds:
        print("  sacctmgr " + shlex.join(c))
    return 0


def add_slurm_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("slurm", help="admin commands for the Slurm backend")
    s = p.add_subparsers(dest="slurm_command", required=True)
    a = s.add_parser("sync-accounts", help=(
        "create Slurm accounts and user associations (sacctmgr) from the budgets tree"))
    a.add_argument("--budgets", default="budgets.yaml", help="the budgets YAML")
    a.add_argument("--config", default="", help=(
        "a Python config file with c.SlurmBackend settings (account_map, root_account, "
        "admin_command_prefix, slurm_bin_dir)"))
    a.add_argument("--root-account", default="", help="Slurm account the tree is put under "
                   "(default: SlurmBackend.root_account, 'gpubudget')")
    a.add_argument("--prune", action="store_true", help=(
        "also remove associations and accounts below the root account that the tree no "
        "longer has"))
    a.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    a.set_defaults(func=cmd_sync_accounts)
