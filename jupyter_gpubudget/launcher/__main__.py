"""``python -I -m jupyter_gpubudget.launcher (--config FILE | --jobs-root DIR) VERB [ARG ...]``

Answers one JSON line on stdout: the verb's result, or ``{"error": "..."}`` with exit status 2
for a refusal (nothing was done). The arguments are read strictly in this order, so a sudoers
line that pins ``--config FILE`` followed by ``*`` cannot be overridden by later arguments.
``--jobs-root`` (no config file) is refused when the launcher was started by sudo.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any, BinaryIO

from . import jobs, mig, mps, notify
from .config import LauncherConfig, LauncherError, load_config, make_config

#: verb -> function(config, args, stdin) -> dict; one module per group of verbs
VERBS: dict[str, Callable[[LauncherConfig, list[str], BinaryIO], dict[str, Any]]] = {
    "launch": jobs.launch,
    "signal": jobs.signal_job,
    "checkpoint": jobs.checkpoint_job,
    "checkpoint-end": jobs.checkpoint_end,
    "notify": notify.notify_job,
    "fence": jobs.fence,
    "mps-acquire": mps.mps_acquire,
    "mps-release": mps.mps_release,
    "mps-ensure": mps.mps_ensure,
    "mig-create": mig.mig_create,
    "mig-destroy": mig.mig_destroy,
}

USAGE = ("usage: python -I -m jupyter_gpubudget.launcher (--config FILE | --jobs-root DIR "
         "[--path PATH] [--cgroup-root DIR] [--no-contain]) "
         f"VERB [ARG ...]; verbs: {', '.join(sorted(VERBS))}")


def run(argv: list[str], stdin: BinaryIO) -> tuple[int, dict]:
    if len(argv) < 3 or argv[0] not in ("--config", "--jobs-root"):
        return 2, {"error": USAGE}
    how, where, rest = argv[0], argv[1], argv[2:]
    opts: dict = {}  # only without a config file: the jobs' PATH, their cgroups
    while how == "--jobs-root" and len(rest) >= 2 and rest[0] in ("--path", "--cgroup-root",
                                                                  "--no-contain"):
        if rest[0] == "--no-contain":
            opts["contain"], rest = False, rest[1:]
        elif len(rest) >= 3:
            opts[rest[0][2:].replace("-", "_")], rest = rest[1], rest[2:]
        else:
            break
    if not rest:
        return 2, {"error": USAGE}
    verb, args = rest[0], rest[1:]
    try:
        if how == "--config":
            cfg = load_config(where)
        else:
            if "SUDO_UID" in os.environ and os.geteuid() == 0:
                raise LauncherError("--jobs-root: under sudo the launcher takes its settings "
                                    "only from a config file (--config)")
            if not os.path.isabs(where):
                raise LauncherError("--jobs-root: give an absolute path")
            cfg = make_config(where, opts)
        fn = VERBS.get(verb)
        if fn is None:
            raise LauncherError(f"unknown verb {verb!r}; verbs: {', '.join(sorted(VERBS))}")
        return 0, fn(cfg, args, stdin)
    except LauncherError as e:
        return 2, {"error": str(e)}
    except OSError as e:
        return 1, {"error": f"{type(e).__name__}: {e}"}


def main() -> None:
    os.umask(0o077)
    code, out = run(sys.argv[1:], sys.stdin.buffer)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
