"""The vocabulary of slices: what a workload asks the hardware for (:class:`SliceRequest`),
what it is given (:class:`Placement` of :class:`SliceAlloc` pieces), and the one definition of
a request's GPU fraction (:func:`request_milli`). model.py builds workloads and decisions on
it and exports every name here too.

Fractions of a GPU are kept as integer *milli-GPUs* (1000 = one whole GPU) so capacity
arithmetic is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

MILLI = 1000  # milli-GPUs in one whole GPU
MIG_COMPUTE_SLICES = 7  # compute slices of a MIG-enabled GPU

SliceKind = Literal["gpu", "mig", "mps", "cpu"]
#: what a gang needs between its ranks, from the most links to the fewest (docs/core.md,
#: "Interconnect"): ``nvlink`` — the ranks on a node share one NVLink domain, and a gang
#: that fits one domain is never split; ``node`` — whole GPUs, and a gang that fits one node
#: is never split across nodes; ``any`` — also across nodes as it comes and, with
#: ``Policy.gang_on_mig``, on MIG instances (no NVLink or peer-to-peer path at all)
INTERCONNECTS: tuple[str, ...] = ("nvlink", "node", "any")


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
    #: a gang's interconnect (``INTERCONNECTS``); None: the policy's default for its kind,
    #: else ``nvlink`` where the inventory has NVLink domains, else ``node``. Only gangs
    #: (two or more whole GPUs) read it
    interconnect: str | None = None
    #: the named cluster it must run in (``NodeSpec.cluster``); None: wherever it starts
    #: sooner. A gang never spans clusters either way
    cluster: str | None = None
    #: hashable identity of the request: equal shapes fit in exactly the same places
    shape: tuple[object, ...] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", (
            self.kind, self.gpus, self.profile, self.milli, self.gpu_memory_mib,
            self.gpu_model, self.cpu_milli, self.memory_mib, self.single_node,
            self.interconnect, self.cluster))

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


def request_milli(req: SliceRequest) -> int:
    """GPU-thousandths a request is charged once placed: whole GPUs 1000 each, an MPS share
    its milli, a MIG instance its compute slices out of 7 (``3g.40gb``: 429), CPU-only 0.
    The one definition of "GPU fraction of a request"; the scheduler, the simulator and the
    service all use it."""
    if req.kind == "gpu":
        return max(req.gpus, 0) * MILLI
    if req.kind == "mps":
        return req.milli
    if req.kind == "mig":
        head = (req.profile or "").split("g", 1)[0]
        compute = int(head) if head.isdigit() else 0
        return round(compute * MILLI / MIG_COMPUTE_SLICES)
    return 0


def gpu_fraction(req: SliceRequest) -> float:
    """GPU-equivalents a request is charged per hour of wall time (``request_milli / 1000``)."""
    return request_milli(req) / MILLI


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
