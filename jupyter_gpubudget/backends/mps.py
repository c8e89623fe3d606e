"""MPS control daemons as the local backend reaches them (the daemons themselves:
``launcher/mps.py``).

- Jobs run as the service's own user, or the service is root: the service runs the daemons
  itself (:class:`MpsDaemons`).
- Sudo isolation: jobs run as their users' accounts, and only a root daemon can start their
  MPS servers, so the unprivileged service asks the privileged launcher
  (:class:`LauncherMps`: ``mps-acquire`` / ``mps-release`` / ``mps-ensure``).

Both answer the same three calls: ``acquire_all(holder, gpus)`` (GPU -> pipe directory, all or
nothing), ``release(holder)`` and ``ensure_held(holder)``.
"""

from __future__ import annotations

from collections.abc import Callable

from jupyter_gpubudget.launcher.mps import CONTROL, MpsDaemons, MpsUnavailable

__all__ = ["CONTROL", "LauncherMps", "MpsDaemons", "MpsUnavailable"]


class LauncherMps:
    """The daemons run as root by the launcher. ``call(verb, *args)`` runs one launcher verb
    and returns its answer, raising ``RuntimeError('launcher VERB: why')`` on a refusal."""

    def __init__(self, call: Callable[..., dict]) -> None:
        self._call = call

    def acquire_all(self, holder: str, gpus: list[str]) -> dict[str, str]:
        try:
            out = self._call("mps-acquire", holder, *gpus)
        except RuntimeError as e:
            raise MpsUnavailable(str(e).removeprefix("launcher mps-acquire: ")) from None
        pipes = out.get("pipes")
        if not isinstance(pipes, dict) or sorted(pipes) != sorted(gpus):
            self.release(holder)
            raise MpsUnavailable(f"the launcher answered mps-acquire with {out!r}")
        return {str(g): str(d) for g, d in pipes.items()}

    def release(self, holder: str) -> list[str]:
        return list(self._call("mps-release", holder).get("stopped") or [])

    def ensure_held(self, holder: str) -> list[str]:
        try:
            return list(self._call("mps-ensure", holder).get("restarted") or [])
        except RuntimeError as e:
            raise MpsUnavailable(str(e).removeprefix("launcher mps-ensure: ")) from None
