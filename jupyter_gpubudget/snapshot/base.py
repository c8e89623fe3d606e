"""What every snapshot backend speaks: kernels, snapshots, restore reports, availability."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable


class SnapshotError(Exception):
    """A snapshot could not be taken, verified or restored. ``reason`` is short and stable
    (``unavailable``, ``dump_failed``, ``verify_failed``, ``restore_failed``, ``quota``,
    ``pid_in_use``); the message says what happened."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(slots=True)
class KernelRef:
    """A running kernel as the snapshot machinery sees it.

    ``pid`` is the kernel process (the root of the tree CRIU dumps); ``connection_file`` is the
    jupyter_client connection file (a CRIU restore answers on the same ports, so clients reuse
    it). ``session`` is the workload id the snapshot belongs to, ``project`` the project it is
    charged to (for the store's quota). ``uid`` is the account the kernel runs as (the
    privileged CRIU step refuses a process of any other account). ``gpu_devices`` is what the kernel was given
    (``CUDA_VISIBLE_DEVICES`` entries: ``GPU-<uuid>``, ``MIG-<uuid>``, or indices); ``mps`` is
    true when it runs as an MPS client."""

    pid: int
    connection_file: str
    session: str
    project: str = ""
    cwd: str | None = None
    gpu_devices: tuple[str, ...] = ()
    mps: bool = False
    uid: int | None = None


@dataclass(slots=True)
class Availability:
    ok: bool
    reason: str = ""


@dataclass(slots=True)
class Snapshot:
    """A committed, verified snapshot in the store."""

    id: str
    session: str
    project: str
    method: str  # "criu" or "namespace"
    created_at: float
    manifest: str  # path of its manifest
    digest: str  # sha256 of the manifest's content
    raw_bytes: int  # bytes of state captured
    stored_bytes: int  # bytes of the chunks it references, as stored (compressed)
    written_bytes: int  # bytes written to disk for it (chunks already stored are not rewritten)
    seconds: dict[str, float] = field(default_factory=dict)
    summary: dict = field(default_factory=dict)  # what the dump saw (variables, unsaved ...)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True)
class RestoreReport:
    """What came back and how. CRIU restores the whole process: ``everything`` is true and the
    lists are empty. The namespace backend names every variable: ``restored`` (its value),
    ``recomputed`` (name -> how: from its source, by replaying cell n), ``lost`` (name -> why),
    and ``reimported`` modules."""

    snapshot_id: str
    method: str
    kernel: KernelRef
    everything: bool = False
    restored: list[str] = field(default_factory=list)
    recomputed: dict[str, str] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)
    reimported: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """One line for the user."""
        if self.everything:
            return "restored everything (the kernel's processes were restored as they were)"
        parts = [f"restored {len(self.restored)} variables"]
        if self.recomputed:
            parts.append("recomputed " + ", ".join(sorted(self.recomputed)))
        if self.lost:
            parts.append("lost " + ", ".join(sorted(self.lost)))
        return "; ".join(parts)


@runtime_checkable
class Snapshotter(Protocol):
    """One snapshot backend. ``available`` says whether it can capture this kernel now (and why
    not); ``dump`` takes, stores and verifies a snapshot; ``restore`` brings it back: CRIU into
    the same process tree (``target`` must be None), the namespace backend into ``target``, a
    fresh kernel."""

    method: str

    def capabilities(self) -> dict: ...

    def available(self, kernel: KernelRef) -> Availability: ...

    def dump(self, kernel: KernelRef) -> Snapshot: ...

    def restore(self, snapshot: Snapshot, target: KernelRef | None = None) -> RestoreReport: ...


def choose(kernel: KernelRef, backends: list[Snapshotter]) -> tuple[Snapshotter, list[str]]:
    """The first backend that can capture this kernel, and why the ones before it could not
    (to be told to the user). Raises :class:`SnapshotError` when none can."""
    why: list[str] = []
    for b in backends:
        a = b.available(kernel)
        if a.ok:
            return b, why
        why.append(f"{b.method}: {a.reason}")
    raise SnapshotError("unavailable", "no snapshot method works here: " + "; ".join(why))
