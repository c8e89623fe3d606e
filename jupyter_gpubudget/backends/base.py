"""The interface the service applies decisions through."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

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
    # the workload's contract, for engines that label what they run (Kubernetes
    # annotations) or need a time limit (Slurm's --time)
    kind: str = "batch"
    min_runtime: float = 0.0
    protected_until: float | None = None
    backed: bool | None = None
    resumable: bool | None = None
    time_limit: float | None = None  # seconds; the backend stops the attempt when it is over
    # on GPUs lent from a gang's reservation (a backfill or a lease, docs/core.md): when they
    # are due back. The job should save its progress by then; it is preempted then if the
    # gang needs them
    due_at: float | None = None


def job_identity_env(launch: Launch) -> dict[str, str]:
    """What every backend tells a job about itself: ``GPUBUDGET_WORKLOAD``, ``_PROJECT``,
    ``_USER``, ``_ATTEMPT`` and :func:`due_env`."""
    return {"GPUBUDGET_WORKLOAD": launch.workload, "GPUBUDGET_PROJECT": launch.project,
            "GPUBUDGET_USER": launch.user, "GPUBUDGET_ATTEMPT": str(launch.attempt),
            **due_env(launch)}


def due_env(launch: Launch) -> dict[str, str]:
    """On GPUs lent from a gang's reservation, ``GPUBUDGET_DUE_AT``: when they are due back
    (RFC 3339, UTC), for the job to save its progress by then; else nothing."""
    if launch.due_at is None:
        return {}
    return {"GPUBUDGET_DUE_AT": datetime.fromtimestamp(launch.due_at, UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ")}


@dataclass(frozen=True)
class BackendStatus:
    """``alive``: still running. Otherwise ``exit_code``/``ended_at`` when known (None: lost)."""

    alive: bool
    exit_code: int | None = None
    ended_at: float | None = None
    launched: bool = True  # False: there is no trace the attempt was ever started
    timed_out: bool = False  # it was stopped because its time_limit was over
    #: the process that waits for it (the local launcher's monitor) is gone: whether it runs
    #: is read from its cgroup, and its exit code cannot be known (``exit_code`` None)
    unsupervised: bool = False


@dataclass(frozen=True)
class LogChunk:
    """Part of an attempt's output: ``data`` starts at byte ``offset`` of a log that is
    ``size`` bytes long now."""

    data: bytes
    offset: int
    size: int


class Backend(LoggingConfigurable):
    """Subclasses implement launch, stop and status."""

    #: called (from any thread) when an attempt ends by itself; the service sets it to
    #: trigger a scheduling cycle
    on_exit = None

    name = "abstract"

    #: ``stop`` returns only once the workload has stopped (the local backend): the core may
    #: then place other work on its slice in the same cycle. Engines that stop asynchronously
    #: (Slurm, Kubernetes) set False: the slice stays held until ``status`` says it is gone.
    synchronous_stop = True

    #: n > 0: ``launch_many`` sends up to n launches at once (an engine reached over the
    #: network): the loop records a cycle's consecutive Starts and launches them n at a
    #: time. 0: each Start is launched as soon as it is recorded, one after another.
    concurrent_launch = 0

    #: the fencing token of the service replica that leads (``service/leader.py``); None
    #: with one service process. A backend that can refuse a stale launch passes it on.
    fence_token: int | None = None

    def fence(self, token: int | None) -> None:
        """This service replica took over with ``token``: from now on, launches by a replica
        with an older token must fail (the local launcher refuses them); a launch already
        under way finishes first. Engines that cannot refuse them keep only the token."""
        self.fence_token = token

    def use_ledger(self, ledger: Any) -> None:
        """The service's ledger, for an engine that carries more than one attempt at a time
        (Slurm's job arrays and dependencies). Only read; by default unused."""

    def launch(self, launch: Launch) -> str:
        """Start the attempt; return a backend reference (pid, job id, pod name)."""
        raise NotImplementedError

    def launch_many(self, launches: list[Launch]) -> list[str | Exception]:
        """Start several attempts (the Starts of one scheduling cycle): for each, in order,
        its reference or the exception that refused it (one failure fails only its own
        attempt). By default one after another; an engine reached over the network (the
        Kubernetes API server) sends them at once."""
        out: list[str | Exception] = []
        for la in launches:
            try:
                out.append(self.launch(la))
            except Exception as e:  # noqa: BLE001 - the loop records it for that attempt
                out.append(e)
        return out

    def stop(self, workload: str, attempt: int) -> BackendStatus:
        """Stop the attempt (gracefully, then forcibly) and return how it ended."""
        raise NotImplementedError

    def status(self, workload: str, attempt: int) -> BackendStatus:
        """Is the attempt still running? Must work after the service restarted."""
        raise NotImplementedError

    def read_log(self, workload: str, attempt: int, offset: int, limit: int) -> LogChunk | None:
        """At most ``limit`` bytes of the attempt's output (stdout and stderr) from byte
        ``offset``; a negative ``offset`` counts from the end (the last ``-offset`` bytes).
        An attempt without output yet gives an empty chunk; None: this backend keeps no
        output it could show (``GET /jobs/{id}/log`` then answers 404 saying so)."""
        return None

    def check_command(self, command: list[str]) -> str | None:
        """None if the backend may run ``command``, else the reason it may not."""
        return None

    def resolve_command(self, command: list[str]) -> list[str]:
        """The command as the backend will run it (the local backend resolves the program to
        an absolute path); raise ``ValueError`` with the reason when it cannot be run."""
        return command

    def check_user(self, user: str) -> str | None:
        """None if ``user``'s jobs can run here (e.g. they have a Unix account), else why not.
        Checked at submission, so a job is refused at once instead of failing at launch."""
        return None

    def orphans(self, running: set[tuple[str, int]]) -> list[tuple[str, int]]:
        """Attempts still alive that the ledger does not consider running, found in the
        engine itself by what every attempt carries (the local launcher's attempt
        directory, the Slurm job name ``<prefix>.<workload>.<attempt>``, the Kubernetes
        labels ``gpubudget/workload`` and ``gpubudget/attempt``), never in this process's
        memory: the replica that launched it may be another one."""
        return []

    def started(self, workload: str, attempt: int) -> tuple[str, float] | None:
        """``(reference, start)`` of an attempt the engine runs, from the engine's own
        records (the local launcher's ``pid`` record, Slurm's job start), or None while it
        has not started or where the engine does not say. A replica that takes over reads it
        for an attempt it finds running with no launch recorded (launched late by the
        replica that led before): its charge starts when the engine started it."""
        return None

    def stop_orphan(self, workload: str, attempt: int) -> None:
        """Stop an orphan (see :meth:`orphans`). It is swept every scheduling cycle, so an
        engine that stops asynchronously only asks here and does not wait; by default the
        same as :meth:`stop`."""
        self.stop(workload, attempt)

    # ------------------------------------------------------------------ the engine's own view
    # Engines that know their nodes (Slurm, Kubernetes) report them here; the local backend
    # leaves the service's inventory source (NVML or the declared file) in charge.

    def use_inventory(self, inventory: Any) -> None:
        """The core ``Inventory`` the service schedules on (NVML, declared, or the engine's
        own), given once it is known: backends that set ``CUDA_VISIBLE_DEVICES`` take the
        device ids from it (``backends/devices.py``)."""
        return None

    def discover_inventory(self) -> Any:
        """The engine's nodes and GPUs as a core ``Inventory``, or None: the service's own
        inventory source (NVML or the declared file) applies."""
        return None

    def node_health(self) -> dict[str, str]:
        """Nodes the engine itself reports unhealthy (DOWN/DRAIN in Slurm, cordoned/NotReady
        in Kubernetes): node name -> reason. Called every cycle; the core drains them."""
        return {}

    def drain_node(self, node: str, reason: str) -> None:
        """Carry the core's ``Drain`` into the engine (``scontrol update state=drain``, a
        cordon). The local backend has nothing to do."""
        return None

    def undrain_node(self, node: str) -> None:
        """Return a drained node to service in the engine."""
        return None

    # ------------------------------------------------------------------ the engine's accounting
    #: seconds between comparisons of closed charge intervals with the engine's own accounting
    #: (Slurm: sacct); 0: the engine keeps none
    usage_check_interval: float = 0.0

    def reconcile_usage(self, intervals: list[tuple[str, int, float, float, str]]) -> list[dict]:
        """Closed intervals (workload, seq, start, end, ledger backend) whose engine-side
        start/end differ from the ledger's: one dict per mismatch (``workload``, ``attempt``,
        ``difference_s``, ``why``, ...). The ledger stays the truth for charging."""
        return []

    def gpu_busy(self, intervals: list[tuple[str, int, float, float, str]]
                 ) -> list[tuple[str, float, float, float, str]]:
        """Busy samples ``(workload, start, end, fraction, source)`` the engine's own
        accounting recorded for these closed intervals (Slurm: sacct's ``gres/gpuutil``),
        for the ledger's busy figures where nothing sampled the work while it ran; by
        default none (unknown)."""
        return []
