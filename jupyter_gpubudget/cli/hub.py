"""`gpubudget hub`: start the embedded demo hub (JupyterHub + the gpubudget service, local
processes, SQLite, the declared demo inventory, a DEMO-ONLY shared password).

"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def hub_config_path() -> Path:
    return ROOT / "hub_config" / "jupyterhub_config.py"


def hub_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "GPUBUDGET_HUB_DIR": str(Path(args.dir).resolve()),
        "GPUBUDGET_HUB_IP": args.ip,
        "GPUBUDGET_HUB_PORT": str(args.port),
        "GPUBUDGET_BUDGETS": str(Path(args.budgets).resolve()),
        "GPUBUDGET_INVENTORY": str(Path(args.inventory).resolve()),
    })
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def missing_parts() -> list[str]:
    missing = []
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        missing.append("jupyterhub (pip install 'jupyter-gpubudget[hub]')")
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        missing.append("jupyterlab (pip install 'jupyter-gpubudget[hub]')")
    if shutil.which("configurable-http-proxy") is None:
        missing.append("configurable-http-proxy (npm install -g configurable-http-proxy)")
    return missing


def cmd_hub(args: argparse.Namespace) -> int:
    missing = missing_parts()
    if missing:
        print("gpubudget hub: missing " + "; ".join(missing), file=sys.stderr)
        return 2
    env = hub_env(args)
    host = "localhost" if args.ip in ("127.0.0.1", "0.0.0.0", "") else args.ip
    from ..hub.demo_setup import DEMO_PREFIX, SERVICE_USER, demo_home_root, isolation_problem

    Path(env["GPUBUDGET_HUB_DIR"]).mkdir(parents=True, exist_ok=True)
    problem = ("GPUBUDGET_ISOLATION=0" if env.get("GPUBUDGET_ISOLATION") == "0" else
               isolation_problem([ROOT / "jupyter_gpubudget" / "__init__.py",
                                  Path(args.budgets), Path(args.inventory),
                                  Path(env["GPUBUDGET_HUB_DIR"])],
                                 state=Path(env["GPUBUDGET_HUB_DIR"])))
    if problem is None:
        who = (f"  Unix accounts: the service runs as '{SERVICE_USER}'; each user's server and "
               f"jobs as '{DEMO_PREFIX}<user>'\n  (created if missing; a sudoers drop-in lets "
               f"'{SERVICE_USER}' run the job launcher), homes in {demo_home_root()}.\n"
               "  `make clean-demo` removes them (stop the hub first).")
    else:
        who = (f"  ISOLATION IS OFF ({problem}):\n  the service, servers and jobs all run as "
               "your own Unix user. Fine on your own machine, never on a shared one.")
    print(f"""
  gpubudget DEMO hub  ->  http://{host}:{args.port}/

  Log in as alice, bob, carol, dana, erin or frank (researchers) or admin,
  password: gpubudget-demo   (DEMO ONLY: a shared password, no security)
  Inventory: declared ({Path(args.inventory).name}), budgets: {Path(args.budgets).name}
  State (hub DB, ledger, logs): {env['GPUBUDGET_HUB_DIR']}
{who}
  Stop with Ctrl-C.
""", flush=True)
    cmd = [sys.executable, "-m", "jupyterhub", "-f", str(hub_config_path())]
    os.chdir(env["GPUBUDGET_HUB_DIR"])
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached


def add_hub_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("hub", help="start the embedded demo JupyterHub (local processes, "
                              "declared demo inventory, DEMO-ONLY login)")
    p.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--dir", default=".gpubudget-hub",
                   help="state directory: hub DB, ledger, tokens (default .gpubudget-hub)")
    p.add_argument("--budgets", default=str(ROOT / "examples" / "budgets-demo.yaml"),
                   help="budgets YAML (default examples/budgets-demo.yaml)")
    p.add_argument("--inventory", default=str(ROOT / "examples" / "inventory-demo.yaml"),
                   help="declared inventory YAML (default examples/inventory-demo.yaml)")
    p.set_defaults(func=cmd_hub)
    return p
