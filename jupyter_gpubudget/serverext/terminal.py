"""The lab's terminals find ``gpubudget`` however their shell starts.

A JupyterLab terminal of a server started by JupyterHub runs a *login* shell (``$SHELL -l``,
jupyter_server_terminals), and a login shell reads ``/etc/profile``, which on Debian, Ubuntu and
most distributions sets ``PATH`` from scratch: the server's environment had the Python
environment's ``bin`` (where ``gpubudget``, ``python`` and ``pip`` of the kernels live) on its
``PATH``, the terminal has not. The README and the sidebar promise the CLI in the terminal, so
this extension rewrites the terminal manager's shell command, once the terminals extension has
made it: a POSIX shell (sh, bash, zsh, dash, ksh) first runs as it would (login profile and
all), then puts that ``bin`` in front of whatever ``PATH`` the profile left (unless it is on it
already) and replaces itself with the same shell, interactive — which reads ``~/.bashrc`` /
``~/.zshrc`` as a login terminal does. Any other shell, or a shell command with options of its
own, is left as it was. ``GpuBudgetLab.terminal_path`` turns this off.
"""

from __future__ import annotations

import os
import sysconfig
from typing import Any

#: shells that take ``-l``, ``-c SCRIPT NAME ARGS...`` and ``-i`` as POSIX sh does
POSIX_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "yash"})
LOGIN_FLAGS = frozenset({"-l", "--login"})

#: run by the shell after its profile: prepend the directories ($1...) that PATH lacks, then
#: become the interactive shell ($0) itself
SCRIPT = ('for d in "$@"; do case ":$PATH:" in *":$d:"*) ;; *) PATH="$d:$PATH" ;; esac; '
          'done; export PATH; exec "$0" -i')


def scripts_dir() -> str:
    """Where this Python environment's commands (``gpubudget``, ``jupyter``) are installed."""
    return sysconfig.get_path("scripts")


def terminal_command(shell_command: list[str], dirs: list[str]) -> list[str]:
    """``shell_command`` made to put ``dirs`` on the terminal's ``PATH`` after the shell's
    profile ran; returned unchanged where that cannot be done safely (see the module)."""
    if not shell_command or not dirs:
        return list(shell_command)
    shell, *args = shell_command
    if os.path.basename(shell) not in POSIX_SHELLS or any(a not in LOGIN_FLAGS for a in args):
        return list(shell_command)
    login = ["-l"] if args else []
    # the first of ``dirs`` ends up first on PATH: prepend them last to first
    return [shell, *login, "-c", SCRIPT, shell, *reversed(dirs)]


def install(serverapp: Any, log: Any) -> list[str] | None:
    """Rewrite the running server's terminal manager's shell command (a server without
    terminals has none: nothing to do). Returns the new command, or None when unchanged."""
    manager = serverapp.web_app.settings.get("terminal_manager")
    old = getattr(manager, "shell_command", None)
    if not isinstance(old, list | tuple):
        return None
    if getattr(manager, "_gpubudget_path", False):  # (already done)
        return None
    new = terminal_command(list(old), [scripts_dir()])
    if new == list(old):
        log.info("gpubudget: terminals keep their shell command %s (not a plain POSIX shell: "
                 "put %s on its PATH yourself to use the gpubudget CLI there)", old,
                 scripts_dir())
        return None
    manager.shell_command = new
    manager._gpubudget_path = True
    log.info("gpubudget: terminals run %s with %s on their PATH", old[0], scripts_dir())
    return new
