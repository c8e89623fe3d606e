"""Every call of the snapshot machinery that needs root goes through this one module.

CRIU dumps and restores need root's help; nothing else here does (the namespace backend runs
as the user inside their server). For a caller that is not root the privileged side runs CRIU
itself as the caller's own account with one capability (:mod:`.criu`), never as root. A
:class:`Privileged` runs the verbs of :mod:`jupyter_gpubudget.snapshot.privileged`
(``criu-check``, ``criu-dump``, ``criu-finish``, ``criu-restore``):

- in this process when it is root and ``command_prefix`` is empty (tests, a root service);
- else as ``[*command_prefix, python, "-I", "-m", VERB_MODULE, verb, --flags...]``, e.g. with
  ``command_prefix = ["sudo", "-n"]`` and a sudoers line allowing exactly that command.

When the CRIU verbs move into the project's privileged launcher (``python -m
jupyter_gpubudget.launcher VERB ...``), :data:`VERB_MODULE` and :meth:`Privileged.argv` are
the only things to change. The privileged side checks every argument itself (it trusts
nothing of its caller) and answers one JSON object.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from traitlets import Float, List, Unicode, default
from traitlets.config import LoggingConfigurable

#: the module whose verbs run as root
VERB_MODULE = "jupyter_gpubudget.snapshot.privileged"
VERBS = ("criu-check", "criu-dump", "criu-finish", "criu-restore")


class PrivilegedError(Exception):
    """A privileged verb refused or failed. ``reason`` is the verb's own (``no_criu``,
    ``bad_input``, ``not_a_kernel``, ``gpu_state``, ``pid_in_use``, ``dump_failed``,
    ``restore_failed``) or ``launcher`` when the command itself could not run."""

    def __init__(self, reason: str, message: str, log: str = "") -> None:
        super().__init__(message)
        self.reason, self.message, self.log = reason, message, log


class Privileged(LoggingConfigurable):
    """How this process reaches root for CRIU (never by running the hub or the service as
    root)."""

    command_prefix = List(Unicode(), help=(
        "Command prefix that runs the privileged snapshot verbs as root, e.g. ['sudo', '-n'] "
        "with a sudoers line allowing `<python> -I -m jupyter_gpubudget.snapshot.privileged *` "
        "(see docs/snapshot.md). Empty: call them in this process, which must then be root. "
        "Default: empty when this process is root, else ['sudo', '-n'].")).tag(config=True)
    python = Unicode(help="The Python that runs the privileged module (default: this "
                     "process's own interpreter).").tag(config=True)
    timeout = Float(660.0, help="Seconds a privileged call may take before it is abandoned."
                    ).tag(config=True)

    @default("command_prefix")
    def _prefix(self) -> list[str]:
        return [] if os.geteuid() == 0 else ["sudo", "-n"]

    @default("python")
    def _python(self) -> str:
        return sys.executable

    @property
    def in_process(self) -> bool:
        return not self.command_prefix and os.geteuid() == 0

    def problem(self) -> str | None:
        """Why privileged calls cannot work at all (None: they may)."""
        if not self.command_prefix and os.geteuid() != 0:
            return ("CRIU needs root: set Privileged.command_prefix (e.g. ['sudo', '-n']) or "
                    "run as root")
        return None

    def argv(self, verb: str, args: dict) -> list[str]:
        """The command line of one privileged call."""
        if verb not in VERBS:
            raise ValueError(f"verb: unknown privileged verb {verb!r}")
        # -I: as root, import nothing from the caller's directory or PYTHON* variables
        argv = [*self.command_prefix, self.python, "-I", "-m", VERB_MODULE, verb]
        if verb == "criu-finish":  # a choice, never a switch left out: --kill or --resume
            args = dict(args)
            args["kill" if args.pop("kill", False) else "resume"] = True
        for k, v in args.items():
            flag = "--" + k.replace("_", "-")
            if isinstance(v, bool):
                argv += [flag] if v else []
            elif isinstance(v, tuple):
                argv += [flag, ":".join(map(str, v))]
            elif v is not None:
                argv += [flag, str(v)]
        return argv

    def call(self, verb: str, **args: object) -> dict:
        """Run one verb; its JSON answer, or :class:`PrivilegedError`."""
        problem = self.problem()
        if problem:
            raise PrivilegedError("launcher", problem)
        if self.in_process:
            return self._in_process(verb, args)
        argv = self.argv(verb, {k: v for k, v in args.items() if k != "timeout"})
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout,
                               stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PrivilegedError("launcher", f"the privileged command could not run: {e}") \
                from None
        try:
            out = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise PrivilegedError("launcher", f"the privileged command failed (exit "
                                  f"{p.returncode}): {p.stderr.strip()[-500:]}") from None
        if not isinstance(out, dict):
            raise PrivilegedError("launcher", "the privileged command answered no object")
        if "error" in out:
            raise PrivilegedError(str(out["error"]), str(out.get("message", "")),
                                  str(out.get("log", "")))
        return out

    def _in_process(self, verb: str, args: dict) -> dict:
        from .criu import CriuError, criu_check, criu_dump, criu_finish, criu_restore

        try:
            if verb == "criu-check":
                return criu_check()
            if verb == "criu-dump":
                return criu_dump(**args)  # type: ignore[arg-type]
            if verb == "criu-finish":
                return criu_finish(**args)  # type: ignore[arg-type]
            if verb == "criu-restore":
                seal = args.pop("seal", None)
                return {"pid": criu_restore(seal_hex=seal, **args)}  # type: ignore[arg-type]
        except CriuError as e:
            raise PrivilegedError(e.reason, e.message, e.log) from None
        raise ValueError(f"verb: unknown privileged verb {verb!r}")
