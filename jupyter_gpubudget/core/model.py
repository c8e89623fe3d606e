"""The core's vocabulary: requests, workloads, placements, charges, decisions, policy.

Times are seconds (floats, any epoch); usage and grants are GPU-hours. Fractions of a GPU are
kept as integer *milli-GPUs* (1000 = one whole GPU) so capacity arithmetic is exact. Requests
and placements are defined in slices.py and exported from here too.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Literal

from .pricing import OffPeak
from .slices import INTERCONNECTS as INTERCONNECTS
from .slices import MIG_COMPUTE_SLICES as MIG_COMPUTE_SLICES
from .slices import MILLI as MILLI
from .slices import Placement, SliceRequest
from .slices import SliceAlloc as SliceAlloc
from .slices import SliceKind as SliceKind
from .slices import gpu_fraction as gpu_fraction
from .slices import request_milli as request_milli

HOUR = 3600.0
DAY = 86400.0

Kind = Literal["interactive", "batch", "debug"]
KINDS: tuple[str, ...] = ("interactive", "batch", "debug")


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
    # what a preemption costs (core/preemption.py: preemption_cost): a resumable job keeps
    # its progress up to its last checkpoint, taken every ``checkpoint_interval`` seconds of
    # its run (0: nothing is lost, e.g. a session that is snapshotted; None: the policy's
    # default for its kind), and a restart spends ``restart_overhead`` seconds (None: the
    # policy's) reloading before it makes progress again
    checkpoint_interval: float | None = None
    restart_overhead: float | None = None
    command: str = ""  # command or image name, when the job spec has one (a prediction feature)
    # started on GPUs reserved for a blocked gang from this time (backfill): if it is still
    # running then, unprotected, it is preempted for a gang that needs those GPUs
    backfill_until: float | None = None
    #: a preempted workload releases its slice at once (a local batch job, stopped before the
    #: next decision is carried out); False: it keeps holding it until its holder reports it
    #: stopped (a notebook session is snapshotted first; remote engines stop asynchronously)
    stops_at_once: bool = True
    #: asked to stop (preemption under way) and still holding its slice: never placed over,
    #: never preempted again; work waiting for its slice waits for it to be released
    stopping: bool = False
    #: a task of a job array (the array's id) and how many of its tasks may run at once
    #: (0: no cap): core/holds.py keeps the rest waiting
    array: str | None = None
    array_max: int = 0
    #: work that must finish first, and how (afterok, afterany, afternotok: core/holds.py)
    after: tuple[str, ...] = ()
    after_kind: str = "afterok"
    #: asked to start off-peak (``start: off-peak``): waits, held out of the cycle like a
    #: dependent job, until this instant (the next off-peak window's start at submission)
    not_before: float | None = None

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
    backfill_until: float | None = None  # see Workload.backfill_until


@dataclass(frozen=True, slots=True)
class Preempt:
    workload: str
    reason: str
    for_workload: str | None = None
    #: GPU-hours the preemption throws away (``preemption.preemption_cost``): the live
    #: service logs it, for ``Policy.finish_drain_budget``
    lost: float = field(default=0.0, compare=False)


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
    # blocked gangs that get a reservation per cycle: each holds GPUs idle until it starts
    # (but for backfill), so a few, not every blocked gang (2: bench/policy.py, seeds 1-2)
    max_reservations: int = 2
    # Starts one cycle decides at most (0: no cap), as Slurm's ``sched_max_job_start``: a
    # cycle that decides a thousand Starts has the engine carry them out one after another
    # (the last one long after its decision); capped, the rest stay queued in rank order
    # and the service cycles again at once
    max_starts_per_cycle: int = 0
    backfill: bool = True
    preemption: bool = True
    placement: str = "fgd"  # "fgd": fragmentation-aware (core/fragmentation.py) | "pack"
    # a victim's project must stand above the requester's — counted after its protected run
    # — by more than this factor (1 + margin), at the first level where their paths differ,
    # and only the standing gap beyond it counts as gain: hysteresis, so that two projects
    # near their shares do not take turns preempting each other
    preemption_margin: float = 0.25
    # what a preemption costs when the workload declares nothing (see Workload): resumable
    # batch and debug work checkpoints every 30 min; a session is snapshotted (nothing lost
    # but the snapshot); every restart spends this long reloading
    checkpoint_interval: float = 30 * 60
    restart_overhead: float = 120.0
    # GPU-hours every preemption counts on top of the work it throws away: the disruption
    # of a restart to the people and pipelines behind it, so that cheap victims (a session
    # that is snapshotted in a minute) are not taken for small gains
    preemption_toll: float = 0.25
    # a one-GPU request may take an idle MIG-mode GPU whole, as its full-size instance
    # (7g): MIG capacity nobody asks slices of is not left idle
    whole_gpu_on_mig: bool = True
    # ... and tries such a GPU *before* the GPUs outside MIG mode (off: only when none of
    # those is free): a MIG-mode GPU serves no gang on one node (and a gang across nodes
    # only as full-size instances, ``gang_on_mig``), so one-GPU work leaves the GPUs outside
    # MIG mode to the gangs that need them
    mig_first: bool = True
    # an MPS share that finds no GPU with room may take the smallest MIG instance with at
    # least its compute and GPU memory (before a fresh GPU is opened for it); it is charged
    # as the share it asked for
    mps_on_mig: bool = True
    # ... and takes a free instance of a MIG-mode GPU that already has instances *before* a
    # shared GPU with room: those leftover slices serve nothing but instances and shares,
    # while shares spread over GPUs outside MIG mode keep them from gangs and one-GPU work
    # (seeds 0-20 and 21-41: month utilisation +0.15 points, goals missed 15 -> 13 and
    # 15 -> 12; docs/simulator.md, "MPS shares on partitioned MIG-mode GPUs first")
    mps_mig_first: bool = True
    # a gang no node holds on its GPUs outside MIG mode (one placed across nodes) may take
    # idle MIG-mode GPUs as full-size (7g) instances too, leaving
    # ``gang_on_mig_spare`` of them idle on each MIG-mode node for the slices and one-GPU
    # work that use them.
    # A CUDA process sees one MIG instance, so the backends start one pod (Kubernetes) or
    # bind one task (Slurm) per such instance; its traffic has no NVLink or peer-to-peer
    # path (see docs/simulator.md for what it buys and costs; off: gangs never use them).
    # Only gangs that declared ``interconnect: any`` take them
    gang_on_mig: bool = False
    gang_on_mig_spare: int = 2
    # debug work predicted to run at most this long (seconds) is considered before all other
    # waiting work, by standing among itself: a ten-minute debug run does not queue behind
    # other projects' training (0: no such lane)
    short_lane: float = 30 * 60
    # a short-lane run that finds no room may preempt unprotected batch work whose
    # preemption loses at most this many GPU-hours (toll included), i.e. work that has just
    # saved its progress (0: never)
    short_lane_cost: float = 0.35
    # ... and a short-lane run that has waited ``short_lane_patience`` seconds may take a
    # victim losing up to ``short_lane_late_cost`` GPU-hours: a debug run is not kept
    # waiting for minutes behind training that would lose a little more (0: never more)
    short_lane_patience: float = 180.0
    short_lane_late_cost: float = 1.0
    # whole GPUs that, standing free when a cycle begins, are kept for short work until the
    # next cycle: work predicted to run past ``short_lane`` is not placed there (a gang
    # still may), so a debug run that arrives finds a GPU instead of waiting for long work
    # to end; only once debug work has been seen (0: keep nothing back). When no whole GPU
    # outside MIG mode stands free, an idle MIG-mode GPU is kept instead (a one-GPU run
    # takes it whole, ``whole_gpu_on_mig``): it serves no gang, so the lane no longer takes
    # the next GPU outside MIG mode that comes free from the gangs (docs/simulator.md,
    # "The short lane on an idle MIG-mode GPU")
    short_lane_hold: int = 1
    # a blocked gang still waiting this many seconds after the start first planned for it
    # (its first reservation's time) may preempt unprotected work of accounts standing
    # above its own whatever that work loses: a reservation that keeps slipping because
    # running work outlives its predictions is kept, at a price in preemptions (0: never;
    # off by default, see docs/simulator.md for what it costs)
    gang_overdue_after: float = 0.0
    # resumable batch work that finds no other room may borrow GPUs reserved for a blocked
    # gang even when it is predicted to run past the gang's start, when it gets at least
    # this many seconds on them first: a *lease*. It is told when the GPUs are due (it saves
    # its progress then, see preemption.last_checkpoint) and is preempted for the gang at
    # that time if still running, losing only its restart; the reservation plans with the
    # leased GPUs free at their due time — and so does every backfill: a gang's reservation
    # keeps its time, and backfilled work still running then is reclaimed for it. Reserved
    # GPUs no longer sit idle for lack of work short enough to fit before the gang (0: off,
    # only work predicted to end before it). Off by default: on the synthetic seeds 0-20 it
    # cut the goals missed from 37 to 28 (1 h, drains not finished), but on ITP cluster01
    # it more than triples the preemptions and lengthens waits by half (docs/simulator.md,
    # "Leases")
    backfill_lease: float = 0.0
    # a blocked gang whose reservation is at least ``FINISH_DRAIN_AFTER`` away may preempt
    # the unprotected work still running on the GPUs it reserved (its drain's stragglers)
    # and start now, when the GPU-hours those GPUs would otherwise stand idle until then
    # are at least this many times what the stragglers lose, tolls included: a half-drained
    # reservation for a large gang does not hold GPUs idle for hours for the last few jobs
    # (0: off). Unbounded (``finish_drain_budget`` 0) it preempts too often for the 3-day
    # run's and ITP's churn goals; within the budget, it cuts the goals missed over the
    # seeds 0-20 from 37 to 23 and keeps ITP's preemptions within their goal
    # (docs/simulator.md, "Finishing a drain")
    finish_drain_ratio: float = 4.0
    # drains are finished only while the GPU-hours preemptions (all of them, not only
    # drains') threw away over the trailing day (``LOSS_WINDOW``), with this drain's, stay
    # within this share of the cluster's GPU-hours in a day: a churn budget, so that a busy
    # day's preemptions are not doubled by drains, and a whole-cluster gang's drain, which
    # would preempt dozens of jobs at once, waits (0: no budget). 0.009 since the short lane
    # keeps an idle MIG-mode GPU (goals missed over seeds 0-20 16 -> 15, held-out 21-41
    # 17 -> 15; ITP's preemptions 0.060 -> 0.078 per workload: docs/simulator.md, "A larger
    # loss budget")
    finish_drain_budget: float = 0.009
    #: seconds a preempted workload that does not stop at once (``Workload.stops_at_once``)
    #: is expected to take to release its slice (a notebook's snapshot grace period)
    stop_grace: float = 120.0
    #: workloads (batch jobs, debug runs and sessions together) one user may have waiting
    #: in the queue; a submission past it is refused, saying so (0: no limit). Not the
    #: core's to apply — the service does, at submission — but an admin sets it here
    max_pending_per_user: int = 100
    #: the most whole GPUs one advance reservation booked by a manager (not an admin) may
    #: hold (0: only admins book). Not the core's to apply — the service does
    manager_booking_limit: int = 8
    #: the share of a booking's idle GPU-hours (booked, and held by nothing in its window)
    #: charged to its project when the window ends (0: only what runs is charged). Not the
    #: core's to apply — the service does — but an admin sets it here
    reservation_idle_charge: float = 0.5
    #: whether a manager may raise the grant of an account they are a member of (charge
    #: through ``members:``); off: such a change needs an admin or another manager of its
    #: parent who is not a member. Not the core's to apply — the service does — but an
    #: admin sets it here
    managers_fund_own_projects: bool = False
    #: a gang's interconnect when it declares none, per kind (``INTERCONNECTS``); a kind
    #: not listed: ``nvlink`` where the inventory has NVLink domains, else ``node``
    interconnect: tuple[tuple[str, str], ...] = ()
    #: off-peak pricing (core/pricing.py): windows of the week in which a GPU-hour is
    #: charged at a fraction; None: every hour at full price
    off_peak: OffPeak | None = None

    def interconnect_for(self, kind: str) -> str | None:
        """The interconnect a gang of ``kind`` that declared none gets (None: the
        inventory's default)."""
        for k, level in self.interconnect:
            if k == kind:
                return level
        return None

    def cap_for(self, kind: str) -> float:
        for k, cap in self.min_runtime_cap:
            if k == kind:
                return cap
        return 0.0

    def effective_min_runtime(self, w: Workload) -> float:
        return max(0.0, min(w.min_runtime, self.cap_for(w.kind)))

    def checkpoint_interval_of(self, w: Workload) -> float:
        """Seconds between a workload's checkpoints: declared, else 0 for an interactive
        session (snapshotted on preemption), else the policy default."""
        if w.checkpoint_interval is not None:
            return max(0.0, w.checkpoint_interval)
        return 0.0 if w.kind == "interactive" else self.checkpoint_interval

    def restart_overhead_of(self, w: Workload) -> float:
        """Seconds a restart of ``w`` spends before it makes progress again."""
        return max(0.0, w.restart_overhead if w.restart_overhead is not None
                   else self.restart_overhead)


def shape_label(req: SliceRequest) -> str:
    """A short name of what a request asks for, as a prediction feature: ``gpu:4``,
    ``mps:500``, ``mig:1g.10gb``, ``cpu``."""
    if req.kind == "gpu":
        return f"gpu:{req.gpus}"
    if req.kind == "mps":
        return f"mps:{req.milli}"
    if req.kind == "mig":
        return f"mig:{req.profile}"
    return "cpu"


class _Runs:
    """The last ``keep`` run times of one feature key, also kept sorted for quantiles."""

    __slots__ = ("recent", "ordered", "keep")

    def __init__(self, keep: int) -> None:
        self.recent: list[float] = []
        self.ordered: list[float] = []
        self.keep = keep

    def add(self, seconds: float) -> None:
        self.recent.append(seconds)
        bisect.insort(self.ordered, seconds)
        if len(self.recent) > self.keep:
            old = self.recent.pop(0)
            del self.ordered[bisect.bisect_left(self.ordered, old)]

    def __len__(self) -> int:
        return len(self.ordered)

    def quantile(self, q: float) -> float:
        xs = self.ordered
        return xs[min(len(xs) - 1, int(q * len(xs)))]


@dataclass(slots=True)
class RuntimeHistory:
    """Observed run times (seconds), newest last; feeds prediction (core/backfill.py).

    ``samples`` (per user, project and kind) and ``pooled`` (per project and kind) are what
    today's plain p90 reads; ``runs`` holds the same runs under every feature key of
    :func:`feature_keys` (user, project, kind, requested slice, command) for the predictor."""

    samples: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    pooled: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    runs: dict[tuple[str, ...], _Runs] = field(default_factory=dict)
    keep: int = 50
    version: int = 0  # bumped by every run learnt
    # per kind: bumped by every run of that kind (every feature key names the kind, so a
    # prediction only changes when a run of its own kind is learnt)
    kind_version: dict[str, int] = field(default_factory=dict)

    def add(self, user: str, project: str, kind: str, seconds: float, keep: int = 50,
            *, shape: str = "", command: str = "") -> None:
        for xs in (self.samples.setdefault((user, project, kind), []),
                   self.pooled.setdefault((project, kind), [])):
            xs.append(seconds)
            if len(xs) > keep:
                del xs[: len(xs) - keep]
        self.version += 1
        self.kind_version[kind] = self.kind_version.get(kind, 0) + 1
        for key in feature_keys(user, project, kind, shape, command):
            runs = self.runs.get(key)
            if runs is None:
                runs = self.runs[key] = _Runs(max(keep, self.keep))
            runs.add(seconds)

    def add_run(self, w: Workload, seconds: float) -> None:
        """Learn one finished run of ``w`` under all its features."""
        self.add(w.user, w.project, w.kind, seconds, shape=shape_label(w.request),
                 command=w.command)


def feature_keys(user: str, project: str, kind: str, shape: str = "", command: str = ""
                 ) -> list[tuple[str, ...]]:
    """Every key a run is learnt under: the two refinement chains of :func:`feature_chain`
    (with and without the slice)."""
    keys = feature_chain(user, project, kind, "", command)
    if shape:
        keys += feature_chain(user, project, kind, shape, command)[1:]
    return keys


def feature_chain(user: str, project: str, kind: str, shape: str = "", command: str = ""
                  ) -> list[tuple[str, ...]]:
    """Feature keys from broad to specific, each refining the one before: the kind; (the
    slice;) the project; the user; the command. Without a slice: kind, project, user,
    command."""
    if not shape:
        keys: list[tuple[str, ...]] = [("k", kind), ("p", project, kind),
                                       ("u", user, project, kind)]
        if command:
            keys.append(("uc", user, project, kind, command))
        return keys
    keys = [("k", kind), ("ks", kind, shape), ("ps", project, kind, shape),
            ("us", user, project, kind, shape)]
    if command:
        keys.append(("usc", user, project, kind, shape, command))
    return keys
