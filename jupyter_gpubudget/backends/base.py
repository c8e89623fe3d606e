"""The interface the service applies decisions through."""

from __future__ import annotations

from dataclasses import dataclass, field

from traitlets.config import LoggingConfigurable


@dataclass(frozen=True)
class Launch:
    """Everything a backend needs to start one attempt of a workload."""

    workload: str
    attempt: int  # the charge interval's sequence number: 1, 2, ... after requeues
    user: str
    project: str
    command: list[str]
    placement: list[dict]  # SliceAlloc fields, one dict per slice
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BackendStatus:
    """``alive``: still running. Otherwise ``exit_code``/``ended_at`` when known (None: lost)."""

    alive: bool
    exit_code: int | None = None
    ended_at: float | None = None
    launched: bool = True  # False: there is no trace the attempt was ever started


class Backend(LoggingConfigurable):
    """Subclasses implement launch, stop and status."""

    #: called (from any thread) when an attempt ends by itself; the service sets it to
    #: trigger a scheduling cycle
    on_exit = None

    name = "abstract"

    def launch(self, launch: Launch) -> str:
        """Start the attempt; return a backend reference (pid, job id, pod name)."""
        raise NotImplementedError

    def stop(self, workload: str, attempt: int) -> BackendStatus:
        """Stop the attempt (gracefully, then forcibly) and return how it ended."""
        raise NotImplementedError

    def status(self, workload: str, attempt: int) -> BackendStatus:
        """Is the attempt still running? Must work after the service restarted."""
        raise NotImplementedError

    def check_command(self, command: list[str]) -> str | None:
        """None if the backend may run ``command``, else the reason it may not."""
        return None

    def orphans(self, running: set[tuple[str, int]]) -> list[tuple[str, int]]:
        """Attempts still alive that the ledger does not consider running."""
        return []
