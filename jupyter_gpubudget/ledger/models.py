"""SQLAlchemy 2 models of the ledger. Times are UNIX seconds (float); slices in milli-GPUs."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class AccountRow(Base):
    """An account of the tree, mirrored from the budgets file (the file owns tree and members)."""

    __tablename__ = "accounts"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    parent: Mapped[str | None] = mapped_column(String(200), nullable=True)
    members: Mapped[list] = mapped_column(JSON, default=list)
    managers: Mapped[list] = mapped_column(JSON, default=list)
    is_project: Mapped[bool] = mapped_column(Boolean, default=True)
    updated_at: Mapped[float] = mapped_column(Float)


class GrantRow(Base):
    """One version of an account's grant. The current grant is the highest version."""

    __tablename__ = "grants"
    __table_args__ = (UniqueConstraint("account", "version", name="uq_grant_version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account: Mapped[str] = mapped_column(ForeignKey("accounts.name"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    grant_hours: Mapped[float | None] = mapped_column(Float, nullable=True)
    share_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    changed_by: Mapped[str] = mapped_column(String(200))
    changed_at: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(20))  # "budgets" (file) or "api"
    note: Mapped[str] = mapped_column(Text, default="")


class WorkloadRow(Base):
    """A notebook session or batch job. ``state``: pending, running, done, failed, cancelled,
    preempted (terminal, not resumable), timeout (stopped at its time_limit)."""

    __tablename__ = "workloads"
    __table_args__ = (Index("ix_workloads_state", "state"), Index("ix_workloads_user", "user"),
                      Index("ix_workloads_state_ended", "state", "ended_at"))
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    project: Mapped[str] = mapped_column(String(200))
    user: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(20))
    state: Mapped[str] = mapped_column(String(20))
    request: Mapped[dict] = mapped_column(JSON)
    command: Mapped[list | None] = mapped_column(JSON, nullable=True)
    env: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    min_runtime: Mapped[float] = mapped_column(Float, default=0.0)
    resumable: Mapped[bool] = mapped_column(Boolean, default=False)
    time_limit: Mapped[float | None] = mapped_column(Float, nullable=True)
    backend: Mapped[str] = mapped_column(String(40), default="local")
    backend_ref: Mapped[str | None] = mapped_column(String(200), nullable=True)
    submitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    placement: Mapped[list | None] = mapped_column(JSON, nullable=True)
    backed: Mapped[bool] = mapped_column(Boolean, default=False)
    protected_until: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    reason: Mapped[str] = mapped_column(Text, default="")
    #: seconds between the job's own checkpoints (declared; None: the policy's default) —
    #: what a preemption of it throws away
    checkpoint_interval: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: started on GPUs reserved for a gang from this time (backfill): preempted then if it
    #: still runs, unprotected
    backfill_until: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: the named cluster (docs/service.md, "Several clusters"): the one it asked for while
    #: it waits (None: wherever it starts sooner), the one it started on once it runs
    cluster: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: a task of a job array: the array's id (tasks are ``<array>_<index>``), its index and
    #: how many of the array's tasks may run at once (0: no cap)
    array_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    array_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    array_max: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: the workloads it runs after (ids, space-separated; an array as its tasks) and how:
    #: afterok, afterany, afternotok (core/holds.py)
    after: Mapped[str | None] = mapped_column(Text, nullable=True)
    after_kind: Mapped[str | None] = mapped_column(String(20), nullable=True)
    #: ``start: off-peak``: not started before this instant (the next off-peak window's start)
    not_before: Mapped[float | None] = mapped_column(Float, nullable=True)


class ChargeRow(Base):
    """GPU time charged: ``milli`` GPUs from ``start`` to ``end`` (NULL while open).

    ``(workload, seq)`` is unique: a workload's n-th interval can be written only once, and an
    interval is closed by ``UPDATE ... WHERE end IS NULL``, so nothing is ever counted twice.
    ``checkpoint`` is the last time the workload was known to be running."""

    __tablename__ = "charge_intervals"
    __table_args__ = (UniqueConstraint("workload", "seq", name="uq_charge_seq"),
                      Index("ix_charge_open", "end"), Index("ix_charge_project", "project"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    workload: Mapped[str] = mapped_column(ForeignKey("workloads.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    project: Mapped[str] = mapped_column(String(200))
    user: Mapped[str] = mapped_column(String(200))
    milli: Mapped[int] = mapped_column(Integer)
    start: Mapped[float] = mapped_column(Float)
    end: Mapped[float | None] = mapped_column(Float, nullable=True)
    checkpoint: Mapped[float] = mapped_column(Float)
    closed_by: Mapped[str] = mapped_column(String(20), default="")


class DeviceClaimRow(Base):
    """A device a charge interval holds: GPU ``gpu`` of ``node`` (the MIG instance at
    ``mig_start``, or ``milli`` of it for an MPS share) from ``start`` to ``end`` (NULL
    while open; closed with its interval). :meth:`Ledger.start` refuses an interval whose
    devices another interval holds at its start beyond the GPU's size — whether still open
    or closed later than that start — so no GPU is charged twice."""

    __tablename__ = "device_claims"
    __table_args__ = (Index("ix_device_claims_device", "node", "gpu", "end"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    charge: Mapped[int] = mapped_column(ForeignKey("charge_intervals.id"), index=True)
    workload: Mapped[str] = mapped_column(String(64))
    node: Mapped[str] = mapped_column(String(200))
    gpu: Mapped[int] = mapped_column(Integer)
    mig_start: Mapped[int] = mapped_column(Integer, default=-1)
    milli: Mapped[int] = mapped_column(Integer)
    start: Mapped[float] = mapped_column(Float)
    end: Mapped[float | None] = mapped_column(Float, nullable=True)


class UsageRollupRow(Base):
    """GPU time charged per project per clock hour, added in the transaction that closes each
    interval: a scheduling cycle reads O(projects × hours in the window) rows, however long
    the history. ``gpu_ms`` is milli-GPU-seconds; ``last_end`` the latest end of what was
    added (the bucket's usage lies before it)."""

    __tablename__ = "usage_rollups"
    __table_args__ = (Index("ix_rollup_hour", "hour"),)
    project: Mapped[str] = mapped_column(String(200), primary_key=True)
    hour: Mapped[float] = mapped_column(Float, primary_key=True)  # UNIX seconds, a multiple of 3600
    gpu_ms: Mapped[float] = mapped_column(Float, default=0.0)
    last_end: Mapped[float] = mapped_column(Float)


class SnapshotRow(Base):
    """A saved state of an interactive session (see ``jupyter_gpubudget.snapshot``).

    ``status``: ``ok`` (verified when taken), ``bad`` (failed verification: never used, kept
    and shown with ``problem``), ``deleted`` (removed by retention, quota or a user, with
    ``problem`` saying which). ``size`` is the bytes it occupies in the store, ``raw_size`` the
    bytes of state it captured; ``detail`` what the dump saw (variables, unsaved objects)."""

    __tablename__ = "snapshots"
    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    workload: Mapped[str] = mapped_column(ForeignKey("workloads.id"), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    method: Mapped[str] = mapped_column(String(20))
    location: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(String(128))
    size: Mapped[int] = mapped_column(BigInteger, default=0)
    verified: Mapped[bool] = mapped_column(Boolean, default=False)
    project: Mapped[str] = mapped_column(String(200), default="", index=True)
    status: Mapped[str] = mapped_column(String(20), default="ok")
    problem: Mapped[str] = mapped_column(Text, default="")
    raw_size: Mapped[int] = mapped_column(BigInteger, default=0)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    detail: Mapped[dict] = mapped_column(JSON, default=dict)
    changed_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class DecisionRow(Base):
    """Audit log: every decision applied and every administrative change."""

    __tablename__ = "decisions"
    #: the day's preemptions and their losses, read every cycle (``Ledger.recent_losses``)
    __table_args__ = (Index("ix_decisions_kind_at", "kind", "at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    cycle: Mapped[int] = mapped_column(Integer, default=0)
    kind: Mapped[str] = mapped_column(String(20))  # start, preempt, drain, reserve, grant, ...
    workload: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    actor: Mapped[str] = mapped_column(String(200), default="scheduler")
    reason: Mapped[str] = mapped_column(Text, default="")
    detail: Mapped[dict] = mapped_column(JSON, default=dict)


class IdempotencyRow(Base):
    """A request applied under a client's idempotency key, and the answer it got."""

    __tablename__ = "idempotency"
    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)
    status: Mapped[int] = mapped_column(Integer)
    response: Mapped[dict] = mapped_column(JSON)
    #: digest of the request it answered: the same key with another request is refused
    fingerprint: Mapped[str] = mapped_column(String(64), default="")


class ServiceStateRow(Base):
    __tablename__ = "service_state"
    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class LeaderRow(Base):
    """The one row (``id`` 1) naming the service replica that leads (``service/leader.py``):
    who holds the lease, where it answers, its fencing ``token`` (incremented on every
    takeover) and when the lease ends — both times from the database's own clock, so that
    replicas' clocks do not matter."""

    __tablename__ = "service_leader"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(String(1000), default="")
    token: Mapped[int] = mapped_column(BigInteger)
    acquired_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    #: the budgets file the replicas agree on (``service/budgets_copy.py``): its SHA-256,
    #: which file on which replica wrote it, and its text (what a standby authorises from)
    budgets_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    budgets_source: Mapped[str | None] = mapped_column(Text, nullable=True)
    budgets_text: Mapped[str | None] = mapped_column(Text, nullable=True)


class NodeHealthRow(Base):
    """A node's health as the service last decided it (see ``ledger/nodes.py``). No row: the
    node is in service. ``healthy`` False: nothing new is placed there and it drains;
    ``drained_at``: when it was first found empty while unhealthy ("ready for repair")."""

    __tablename__ = "node_health"
    node: Mapped[str] = mapped_column(String(200), primary_key=True)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(String(40), default="")  # admin, nvml, command, backend
    changed_by: Mapped[str] = mapped_column(String(200), default="")
    changed_at: Mapped[float] = mapped_column(Float)
    drained_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class BusyChargeRow(Base):
    """What the devices of one charge interval measured (``ledger/busy.py``): of the
    ``measured_ms`` milli-GPU-seconds of the interval a sampler watched, ``busy_ms`` were
    computing (device utilisation, MIG GPM samples or per-process utilisation, scaled by the
    slice). An interval with no row was never measured: its busy time is unknown, not 0."""

    __tablename__ = "busy_charges"
    #: the idlest sessions of a period are read from this index alone
    __table_args__ = (Index("ix_busy_charges_kind_last", "kind", "last", "first", "project",
                            "user", "workload", "measured_ms", "busy_ms"),
                      Index("ix_busy_charges_idle", "kind", "idle_ms", "last", "first",
                            "project", "user", "workload"))
    charge: Mapped[int] = mapped_column(ForeignKey("charge_intervals.id"), primary_key=True)
    workload: Mapped[str] = mapped_column(String(64), index=True)
    project: Mapped[str] = mapped_column(String(200))
    user: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(20), default="")
    measured_ms: Mapped[float] = mapped_column(Float, default=0.0)
    busy_ms: Mapped[float] = mapped_column(Float, default=0.0)
    first: Mapped[float] = mapped_column(Float)
    last: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(20), default="")  # device, gpm, process
    #: the busy fraction of the latest sample (ending at ``last``): the session's live figure
    last_busy: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: ``measured_ms - busy_ms``, kept with them: the idlest sessions of a period are the
    #: first rows of ``ix_busy_charges_idle`` (no sort of the period's rows)
    idle_ms: Mapped[float] = mapped_column(Float, default=0.0)


class BudgetRequestRow(Base):
    """A member's request for more GPU-hours for a project (``ledger/budget_requests.py``):
    ``gpu_hours`` more per window, with a reason; the project's managers grant it (through
    the grant change, whose version is kept) or decline it with a note."""

    __tablename__ = "budget_requests"
    __table_args__ = (Index("ix_budget_requests_state_project", "state", "project"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project: Mapped[str] = mapped_column(String(200))
    user: Mapped[str] = mapped_column(String(200), index=True)
    gpu_hours: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(20), default="pending")  # granted, declined
    created_at: Mapped[float] = mapped_column(Float)
    decided_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    decided_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    note: Mapped[str] = mapped_column(Text, default="")
    grant_version: Mapped[int | None] = mapped_column(Integer, nullable=True)


class UsageHourlyRow(Base):
    """Charged and busy GPU time per project, per user, per clock hour, kept past the usage
    window (``usage_history_days``): what usage reports read. ``charged_ms`` is added when an
    interval closes (as ``usage_rollups``); ``measured_ms``/``busy_ms`` as samples arrive.
    ``hour`` is an integer (UNIX seconds, a multiple of 3600) so that reports bucket it into
    local days and weeks with integer arithmetic in SQL."""

    __tablename__ = "usage_hourly"
    #: the key starts with the time: a period's rows are one range of it; the hours a local
    #: day takes from a neighbouring UTC day are read from the ``hod`` index alone (covering)
    __table_args__ = (Index("ix_usage_hourly_hod", "hod", "hour", "project", "user",
                            "charged_ms", "measured_ms", "busy_ms"),)
    hour: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    project: Mapped[str] = mapped_column(String(200), primary_key=True)
    user: Mapped[str] = mapped_column(String(200), primary_key=True)
    #: the hour of the UTC day (0..23): a report in a zone off UTC reads only the hours its
    #: local days take from a neighbouring UTC day (``ledger/reports.py``)
    hod: Mapped[int] = mapped_column(Integer, default=0)
    charged_ms: Mapped[float] = mapped_column(Float, default=0.0)
    measured_ms: Mapped[float] = mapped_column(Float, default=0.0)
    busy_ms: Mapped[float] = mapped_column(Float, default=0.0)


class UsageDailyRow(Base):
    """:class:`UsageHourlyRow` summed per UTC day (``day``: UNIX seconds // 86400): a year's
    report reads one row per project, user and day, and hours only at its edges."""

    __tablename__ = "usage_daily"
    #: a period's days are read from this index alone (covering: no lookup of each row)
    __table_args__ = (Index("ix_usage_daily_cover", "day", "project", "user", "charged_ms",
                            "measured_ms", "busy_ms", "preemptions"),)
    day: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str] = mapped_column(String(200), primary_key=True)
    user: Mapped[str] = mapped_column(String(200), primary_key=True)
    charged_ms: Mapped[float] = mapped_column(Float, default=0.0)
    measured_ms: Mapped[float] = mapped_column(Float, default=0.0)
    busy_ms: Mapped[float] = mapped_column(Float, default=0.0)
    #: charge intervals of the user's in the project that a preemption closed, by their end
    preemptions: Mapped[int] = mapped_column(Integer, default=0)


class WaitDailyRow(Base):
    """How long work waited before each of its charge intervals (from submission, or from
    the end of the interval a preemption closed), counted per project, UTC day of the start
    and kind, in half-octave buckets: ``w<b>`` counts waits with floor(2 × log2(1 + seconds))
    = b (the last also every longer one). A report's wait percentiles read one row per
    project, day and kind, to within 19 %."""

    __tablename__ = "wait_daily"
    day: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(20), primary_key=True)
    for _b in range(40):  # WAIT_BUCKETS
        locals()[f"w{_b}"] = mapped_column(Integer, default=0)
    del _b


WAIT_BUCKETS = 40


class NoticePrefRow(Base):
    """How a user wants notices delivered outside JupyterLab (``service/delivery.py``): a
    webhook URL that gets each notice as JSON, an e-mail address, or both. No row: notices
    are only shown in JupyterLab."""

    __tablename__ = "notice_prefs"
    user: Mapped[str] = mapped_column(String(200), primary_key=True)
    webhook: Mapped[str | None] = mapped_column(Text, nullable=True)
    email: Mapped[str | None] = mapped_column(String(320), nullable=True)
    changed_at: Mapped[float] = mapped_column(Float)


class BookingRow(Base):
    """An advance reservation (``ledger/bookings.py``, ``core/reservations.py``): whole GPUs
    booked for a project over ``[start_at, end_at)``; ``gpus`` names each booked GPU as
    ``node:index``, chosen when it was booked. ``cancelled_at`` set: it no longer holds them."""

    __tablename__ = "bookings"
    __table_args__ = (Index("ix_bookings_end_at", "end_at"),)
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    project: Mapped[str] = mapped_column(String(200), index=True)
    cluster: Mapped[str | None] = mapped_column(String(100), nullable=True)
    gpu_count: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[list] = mapped_column(JSON, default=list)
    start_at: Mapped[float] = mapped_column(Float)
    end_at: Mapped[float] = mapped_column(Float)
    note: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[float] = mapped_column(Float)
    cancelled_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    cancelled_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
