"""The core's vocabulary: requests, workloads, placements, charges, decisions, policy.

Times are seconds (floats, any epoch); usage and grants are GPU-hours. Fractions of a GPU are
kept as integer *milli-GPUs* (1000 = one whole GPU) so capacity arithmetic is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

HOUR = 3600.0
DAY = 86400.0
MILLI = 1000  # milli-GPUs in one whole GPU

Kind = Literal["interactive", "batch", "debug"]
KINDS: tuple[str, ...] = ("interactive", "batch", "debug")
SliceKind = Literal["gpu", "mig", "mps", "cpu"]


@dataclass(frozen=True, slots=True)
class SliceRequest:
    """What a workload asks the hardware for.

    - ``gpu``: ``gpus`` whole GPUs; more than one is a gang (all or nothing), which may span
      nodes unless ``single_node``.
    - ``mig``: one MIG instance of ``profile`` (e.g. ``"1g.18gb"``).
    - ``mps``: an MPS share of one GPU: ``milli`` thousandths of its SMs, ``gpu_memory_mib``.
    - ``cpu``: no GPU at all (still needs a node).
    """

    kind: SliceKind = "gpu"
    gpus: int = 1
    profile: str | None = None
    milli: int = 0
    gpu_memory_mib: int = 0
    gpu_model: str | None = None  # only GPUs of this model (None: any)
    cpu_milli: int = 0
    memory_mib: int = 0
    single_node: bool = False
    #: hashable identity of the request: equal shapes fit in exactly the same places
    shape: tuple[object, ...] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", (
            self.kind, self.gpus, self.profile, self.milli, self.gpu_memory_mib,
            self.gpu_model, self.cpu_milli, self.memory_mib, self.single_node))

    @staticmethod
    def whole(gpus: int = 1, **kw: Any) -> SliceRequest:
        return SliceRequest(kind="gpu", gpus=gpus, **kw)

    @staticmethod
    def mig(profile: str, **kw: Any) -> SliceRequest:
        return SliceRequest(kind="mig", gpus=1, profile=profile, **kw)

    @staticmethod
    def mps(milli: int, gpu_memory_mib: int = 0, **kw: Any) -> SliceRequest:
        return SliceRequest(kind="mps", gpus=1, milli=milli,
                            gpu_memory_mib=gpu_memory_mib, **kw)

    @staticmethod
    def cpu_only(**kw: Any) -> SliceRequest:
        return SliceRequest(kind="cpu", gpus=0, **kw)


@dataclass(frozen=True, slots=True)
class SliceAlloc:
    """One piece of a placement: a whole GPU, a MIG instance, an MPS share, or CPU only."""

    node: str
    gpu: int = -1  # index on the node; -1 for CPU-only
    kind: SliceKind = "gpu"
    milli: int = MILLI  # charged fraction of the GPU, in milli-GPUs
    mig_start: int = -1  # first memory slot of the MIG instance
    profile: str | None = None
    gpu_memory_mib: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    slices: tuple[SliceAlloc, ...]

    @property
    def milli(self) -> int:
        return sum(s.milli for s in self.slices if s.gpu >= 0)

    @property
    def fraction(self) -> float:
        """GPU-equivalents charged per hour of wall time."""
        return self.milli / MILLI

    @property
    def nodes(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for s in self.slices:
            seen.setdefault(s.node, None)
        return tuple(seen)


@dataclass(slots=True)
class Workload:
    """A notebook session or batch job, pending or running.

    ``min_runtime`` is the declared protected time (the scheduler caps it by policy);
    ``time_limit`` is the declared maximum run time, used to predict the end for backfill.
    """

    id: str
    project: str
    user: str
    request: SliceRequest
    submitted_at: float
    kind: str = "batch"
    min_runtime: float = 0.0
    resumable: bool = False
    time_limit: float | None = None
    snapshot_cost: float = 0.0  # seconds to snapshot it (0 for batch)
    #: share of its snapshots that saved everything (measured; 1.0 when nothing is known):
    #: the service folds what an unreliable snapshot would lose into ``snapshot_cost``
    snapshot_reliability: float = 1.0
    # running state (None while pending)
    started_at: float | None = None
    placement: Placement | None = None
    backed: bool = False
    protected_until: float | None = None
    idle: bool = False  # reported idle past the limit: yields to any backed work
    #: a preempted workload releases its slice at once (a local batch job, stopped before the
    #: next decision is carried out); False: it keeps holding it until its holder reports it
    #: stopped (a notebook session is snapshotted first; remote engines stop asynchronously)
    stops_at_once: bool = True
    #: asked to stop (preemption under way) and still holding its slice: never placed over,
    #: never preempted again; work waiting for its slice waits for it to be released
    stopping: bool = False

    @property
    def running(self) -> bool:
        return self.placement is not None

    def is_protected(self, now: float) -> bool:
        return self.backed and self.protected_until is not None and now < self.protected_until


@dataclass(frozen=True, slots=True)
class ChargeInterval:
    """GPU time charged to a project: ``milli`` GPUs from ``start`` to ``end`` (None: still open)."""

    workload: str
    project: str
    user: str
    milli: int
    start: float
    end: float | None = None


# ---------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class Start:
    workload: str
    placement: Placement
    backed: bool
    protected_until: float | None


@dataclass(frozen=True, slots=True)
class Preempt:
    workload: str
    reason: str
    for_workload: str | None = None


@dataclass(frozen=True, slots=True)
class Drain:
    node: str


@dataclass(frozen=True, slots=True)
class Reserve:
    workload: str
    at: float
    placement: Placement


Decision = Start | Preempt | Drain | Reserve


# ---------------------------------------------------------------- policy


@dataclass(frozen=True, slots=True)
class Policy:
    """Admin policy the core applies. Loaded from the budgets YAML's ``policy:`` section."""

    window: float = 7 * DAY
    half_life: float | None = None  # exponential decay instead of a hard window
    min_runtime_cap: tuple[tuple[str, float], ...] = (
        ("interactive", 8 * HOUR), ("batch", 2 * DAY), ("debug", 1 * HOUR))
    default_runtime: float = 1 * HOUR  # predicted run time when nothing else is known
    max_reservations: int = 8  # blocked gangs that get a reservation per cycle
    backfill: bool = True
    preemption: bool = True
    placement: str = "fgd"  # "fgd": fragmentation-aware (core/fragmentation.py) | "pack"
    # a backed victim's project must stand above the requester's — counted after its
    # protected run — by more than this factor (1 + margin), at the first level where their
    # paths differ; 0 already stops two projects from taking turns preempting each other
    preemption_margin: float = 0.0
    #: seconds a preempted workload that does not stop at once (``Workload.stops_at_once``)
    #: is expected to take to release its slice (a notebook's snapshot grace period)
    stop_grace: float = 120.0

    def cap_for(self, kind: str) -> float:
        for k, cap in self.min_runtime_cap:
            if k == kind:
                return cap
        return 0.0

    def effective_min_runtime(self, w: Workload) -> float:
        return max(0.0, min(w.min_runtime, self.cap_for(w.kind)))


@dataclass(slots=True)
class RuntimeHistory:
    """Observed run times (seconds) per (user, project, kind), newest last; feeds prediction."""

    samples: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    pooled: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, user: str, project: str, kind: str, seconds: float, keep: int = 50) -> None:
        for xs in (self.samples.setdefault((user, project, kind), []),
                   self.pooled.setdefault((project, kind), [])):
            xs.append(seconds)
            if len(xs) > keep:
                del xs[: len(xs) - keep]
