"""Workload traces for the simulator: the native CSV, Microsoft ITP (ElasticFlow), Alibaba openb.

Every loader checks every row and raises :class:`TraceError` (a ``ConfigError``) naming the
file, the line and the column of the first bad value; nothing is returned when there is one.

Native CSV (one workload per row; header required; columns in any order)::

    id,submit,duration,gpus,project,user,kind,min_runtime,resumable
    nb-1,0,2h,1,lattice,bob,interactive,30m,false
    job-7,600,86400,8,astro,dave,batch,1h,true

- ``submit``, ``duration``, ``min_runtime``, ``time_limit``: seconds, or a duration such as
  ``90``, ``30m``, ``8h``, ``2d``, ``1h30m``. ``submit`` is from the trace start.
- either ``gpus`` (whole GPUs; 0 = CPU only; more than one is a gang) or ``slice``:
  ``4`` (whole GPUs), ``mig:1g.18gb``, ``mps:250`` or ``mps:250:8192`` (milli-GPU, GPU MiB),
  ``cpu``. Optional ``model`` (``A100-80GB`` or ``A|B``), ``cpu_milli``, ``memory_mib``.
- ``kind``: ``interactive`` | ``batch`` | ``debug`` (default batch); ``resumable``:
  true/false/yes/no/1/0 (default: false for interactive, true otherwise).
- ``interconnect`` (a gang's: ``nvlink``, ``node`` or ``any``; docs/core.md),
  ``checkpoint_interval`` (a duration; 0: nothing is lost when preempted) and ``command``
  (command or image name, a feature of the run-time prediction) are optional.
- ``busy`` (optional): the share of its held GPU time the devices computed, 0 to 1 (as NVML's
  utilisation measures it); the simulator's usage report counts it as busy time. Empty or
  absent: unknown (never 0).
- ``project``/``user`` may be empty or absent: projects are then assigned deterministically
  from the budgets (see :func:`assign_projects`).
- a row of ``kind`` ``reservation`` is a booking, not a workload: whole GPUs (``gpus``, or a
  ``slice`` of whole GPUs) booked for ``project`` (required) from ``submit`` for
  ``duration``, optionally of ``model`` and on ``nodes`` (names separated by spaces or
  ``;``); it goes to :attr:`Trace.bookings` (sim/bookings.py replays it as a booking of the
  ``--reservations`` file). ``nodes`` is for these rows only.

ITP / ElasticFlow: ``job_id, submission_time, duration, num_gpu`` (seconds; 1..64 GPUs).
Alibaba openb pods: ``name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, ...,
creation_time, deletion_time, scheduled_time``; openb nodes: ``sn, cpu_milli, memory_mib, gpu,
model``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from ..core.accounts import AccountTree
from ..core.model import INTERCONNECTS, KINDS, MILLI, SliceRequest
from ..core.yamlnodes import ConfigError, parse_duration
from .bookings import SimBooking


class TraceError(ConfigError):
    """A malformed trace: names the file, the 1-based line and the column."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One workload of a trace, in trace time (seconds from the trace start)."""

    id: str
    submit: float
    duration: float  # seconds of work (on its full request)
    request: SliceRequest
    project: str = ""
    user: str = ""
    kind: str = "batch"
    min_runtime: float = 0.0
    resumable: bool = True
    time_limit: float | None = None
    checkpoint_interval: float | None = None  # declared (None: the simulator's default)
    command: str = ""  # command or image name (a prediction feature)
    busy: float | None = None  # share of its held GPU time computing, 0..1 (None: unknown)


@dataclass(frozen=True, slots=True)
class Trace:
    jobs: tuple[TraceJob, ...]
    source: str
    format: str  # "native" | "itp" | "openb"
    #: the bookings the trace carries (its ``reservation`` rows), windows in trace time
    #: (sim/bookings.py: SimBooking; :meth:`bookings_from_start` makes them the file's)
    bookings: tuple[SimBooking, ...] = ()

    def bookings_from_start(self) -> list[SimBooking]:
        """The trace's bookings with their windows from the trace's start (its first
        submission), as a reservations file gives them."""
        if not self.bookings:
            return []
        t0 = min((j.submit for j in self.jobs), default=0.0)
        return [replace(b, start=b.start - t0, end=b.end - t0) for b in self.bookings]

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def span(self) -> float:
        if not self.jobs:
            return 0.0
        return max(j.submit for j in self.jobs) - min(j.submit for j in self.jobs)

    @property
    def max_gpus(self) -> int:
        return max((j.request.gpus for j in self.jobs if j.request.kind == "gpu"), default=0)


# ---------------------------------------------------------------------- CSV reading


class _Rows:
    """CSV rows as dicts, each with its line number; the header is checked first."""

    def __init__(self, text: str, source: str, required: tuple[str, ...],
                 optional: tuple[str, ...] = (), any_of: tuple[str, ...] = ()) -> None:
        self.source = source
        self._seen: dict[str, dict[str, int]] = {}  # column -> value -> first line
        self.reader = csv.reader(io.StringIO(text, newline=""))
        try:
            header = next(self.reader)
        except StopIteration:
            raise TraceError("the trace is empty (no header line)", "", 1, source) from None
        except csv.Error as e:
            raise TraceError(f"not valid CSV: {e}", "", 1, source) from None
        self.header = [h.strip() for h in header]
        seen: set[str] = set()
        for h in self.header:
            if h in seen:
                raise TraceError(f"duplicate column {h!r}", h, 1, source)
            seen.add(h)
        for col in required:
            if col not in seen:
                raise TraceError(f"missing required column {col!r} (columns: "
                                 f"{', '.join(self.header) or 'none'})", col, 1, source)
        if any_of and not (seen & set(any_of)):
            raise TraceError(f"needs one of the columns {' or '.join(any_of)}",
                             any_of[0], 1, source)
        known = set(required) | set(optional) | set(any_of)
        if optional != ("*",):
            for h in self.header:
                if h not in known:
                    raise TraceError(f"unknown column {h!r} (known: {', '.join(sorted(known))})",
                                     h, 1, source)

    def __iter__(self) -> Iterator[tuple[int, dict[str, str]]]:
        n = len(self.header)
        while True:
            try:
                row = next(self.reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise TraceError(f"not valid CSV: {e}", "", self.reader.line_num,
                                 self.source) from None
            line = self.reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != n:
                raise TraceError(f"expected {n} values, got {len(row)}", "", line, self.source)
            yield line, {h: v.strip() for h, v in zip(self.header, row, strict=True)}

    def error(self, msg: str, col: str, line: int) -> TraceError:
        return TraceError(msg, col, line, self.source)

    def unique(self, value: str, col: str, line: int, what: str) -> str:
        """``value``, which must be non-empty and not used by an earlier row."""
        if not value:
            raise self.error("missing value", col, line)
        first = self._seen.setdefault(col, {}).setdefault(value, line)
        if first != line:
            raise self.error(f"duplicate {what} {value!r} (also on line {first})", col, line)
        return value

    def number(self, row: dict[str, str], col: str, line: int, *, minimum: float = 0.0,
               integer: bool = False, default: float | None = None) -> float:
        raw = row.get(col, "")
        if raw == "":
            if default is not None:
                return default
            raise self.error("missing value", col, line)
        try:
            v = float(raw)
        except ValueError:
            raise self.error(f"expected a number, got {raw!r}", col, line) from None
        if v != v or v in (float("inf"), float("-inf")):
            raise self.error(f"expected a finite number, got {raw!r}", col, line)
        if integer and not v.is_integer():
            raise self.error(f"expected a whole number, got {raw!r}", col, line)
        if v < minimum:
            raise self.error(f"must be ≥ {minimum:g}, got {raw!r}", col, line)
        return v

    def duration(self, row: dict[str, str], col: str, line: int,
                 default: float | None = None) -> float:
        raw = row.get(col, "")
        if raw == "":
            if default is not None:
                return default
            raise self.error("missing value", col, line)
        try:
            v = float(raw)
        except ValueError:
            d = parse_duration(raw)
            if d is None:
                raise self.error(f"expected seconds or a duration such as '30m', '8h', '2d', "
                                 f"got {raw!r}", col, line) from None
            v = d
        if v != v or v < 0 or v == float("inf"):
            raise self.error(f"must be a finite duration ≥ 0, got {raw!r}", col, line)
        return v


def _read(path: str | os.PathLike[str]) -> tuple[str, str]:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8"), str(p)
    except FileNotFoundError:
        raise TraceError("no such trace file", "", None, str(p)) from None
    except UnicodeDecodeError as e:
        raise TraceError(f"not UTF-8 text: {e.reason}", "", None, str(p)) from None


# ---------------------------------------------------------------------- native CSV

NATIVE_REQUIRED = ("submit", "duration")
NATIVE_OPTIONAL = ("id", "project", "user", "kind", "min_runtime", "resumable", "time_limit",
                   "model", "cpu_milli", "memory_mib", "checkpoint_interval", "command",
                   "interconnect", "busy", "nodes")
#: the ``kind`` of a trace row that books GPUs instead of running a workload
RESERVATION = "reservation"
_TRUE = {"true", "yes", "1", "y", "t"}
_FALSE = {"false", "no", "0", "n", "f"}


def parse_slice(text: str) -> SliceRequest:
    """``4`` | ``gpu:4`` | ``mig:1g.18gb`` | ``mps:250`` | ``mps:250:8192`` | ``cpu``."""
    t = text.strip().lower()
    if t in ("cpu", "0", "gpu:0"):
        return SliceRequest.cpu_only()
    if t.startswith("gpu:"):
        t = t[4:]
    if t.isdigit():
        n = int(t)
        return SliceRequest.whole(n) if n > 0 else SliceRequest.cpu_only()
    if t.startswith("mig:"):
        prof = text.strip()[4:]
        if not prof:
            raise ValueError("a MIG slice needs a profile, e.g. 'mig:1g.18gb'")
        return SliceRequest.mig(prof)
    if t.startswith("mps:"):
        parts = t[4:].split(":")
        if len(parts) > 2 or not all(p.isdigit() for p in parts):
            raise ValueError("an MPS slice is 'mps:MILLI' or 'mps:MILLI:GPU_MEMORY_MIB'")
        milli = int(parts[0])
        if not 0 < milli <= MILLI:
            raise ValueError(f"MPS milli-GPU must be 1..{MILLI}, got {milli}")
        mem = int(parts[1]) if len(parts) == 2 else 0
        return SliceRequest.mps(milli, mem)
    raise ValueError("expected whole GPUs ('2'), 'mig:PROFILE', 'mps:MILLI[:MiB]' or 'cpu'")


def parse_native(text: str, source: str = "<trace>") -> Trace:
    rows = _Rows(text, source, NATIVE_REQUIRED, NATIVE_OPTIONAL, ("gpus", "slice"))
    if "gpus" in rows.header and "slice" in rows.header:
        raise TraceError("give either a 'gpus' or a 'slice' column, not both", "slice", 1, source)
    jobs: list[TraceJob] = []
    bookings: list[SimBooking] = []
    for line, row in rows:
        submit = rows.duration(row, "submit", line)
        duration = rows.duration(row, "duration", line)
        if duration <= 0:
            raise rows.error("must be longer than zero", "duration", line)
        if row.get("kind", "") == RESERVATION:
            bookings.append(_booking_row(rows, row, line, submit, duration,
                                         len(jobs) + len(bookings) + 1))
            continue
        if row.get("nodes"):
            raise rows.error("nodes are for reservation rows only", "nodes", line)
        if "gpus" in row:
            n = int(rows.number(row, "gpus", line, integer=True))
            req = SliceRequest.whole(n) if n > 0 else SliceRequest.cpu_only()
        else:
            raw = row["slice"]
            if not raw:
                raise rows.error("missing value", "slice", line)
            try:
                req = parse_slice(raw)
            except ValueError as e:
                raise rows.error(f"{e} (got {raw!r})", "slice", line) from None
        extra: dict[str, object] = {}
        if row.get("model"):
            extra["gpu_model"] = row["model"]
        if row.get("cpu_milli"):
            extra["cpu_milli"] = int(rows.number(row, "cpu_milli", line, integer=True))
        if row.get("memory_mib"):
            extra["memory_mib"] = int(rows.number(row, "memory_mib", line, integer=True))
        if row.get("interconnect"):
            if row["interconnect"] not in INTERCONNECTS or req.kind != "gpu":
                raise rows.error(f"expected one of {', '.join(INTERCONNECTS)} for whole GPUs, "
                                 f"got {row['interconnect']!r}", "interconnect", line)
            extra["interconnect"] = row["interconnect"]
        if extra:
            req = replace(req, **extra)  # type: ignore[arg-type]
        kind = row.get("kind", "") or "batch"
        if kind not in KINDS:
            raise rows.error(f"kind must be one of {', '.join(KINDS)}, got {kind!r}", "kind", line)
        res_raw = row.get("resumable", "").lower()
        if res_raw == "":
            resumable = kind != "interactive"
        elif res_raw in _TRUE:
            resumable = True
        elif res_raw in _FALSE:
            resumable = False
        else:
            raise rows.error(f"expected true or false, got {row['resumable']!r}",
                             "resumable", line)
        min_rt = rows.duration(row, "min_runtime", line, default=0.0)
        tl = rows.duration(row, "time_limit", line, default=-1.0)
        jid = rows.unique(row.get("id", "") or f"job-{len(jobs) + 1}", "id", line, "id")
        project = row.get("project", "")
        if project and not all(c.isalnum() or c in "-_." for c in project):
            raise rows.error(f"project name {project!r} must be letters, digits, '-', '_' or '.'",
                             "project", line)
        ci = rows.duration(row, "checkpoint_interval", line, default=-1.0)
        busy = rows.number(row, "busy", line, default=-1.0) if row.get("busy") else None
        if busy is not None and not 0.0 <= busy <= 1.0:
            raise rows.error(f"expected a share from 0 to 1, got {row['busy']!r}", "busy", line)
        jobs.append(TraceJob(jid, submit, duration, req, project, row.get("user", ""), kind,
                             min_rt, resumable, tl if tl >= 0 else None,
                             ci if ci >= 0 else None, row.get("command", ""), busy))
    return Trace(tuple(sorted(jobs, key=lambda j: (j.submit, j.id))), source, "native",
                 tuple(bookings))


def _booking_row(rows: _Rows, row: dict[str, str], line: int, start: float, duration: float,
                 n: int) -> SimBooking:
    """A ``reservation`` row as a booking (sim/bookings.py: SimBooking) over ``[start,
    start + duration)`` in trace time; what a booking cannot hold is refused with its
    line."""
    from .bookings import SimBooking

    project = row.get("project", "")
    if not project:
        raise rows.error("a reservation names its project", "project", line)
    if "gpus" in row:
        gpus = int(rows.number(row, "gpus", line, integer=True))
    else:
        try:
            req = parse_slice(row.get("slice", ""))
        except ValueError as e:
            raise rows.error(f"{e} (got {row.get('slice', '')!r})", "slice", line) from None
        if req.kind != "gpu":
            raise rows.error("a reservation books whole GPUs (e.g. '4')", "slice", line)
        gpus = req.gpus
    if gpus < 1:
        raise rows.error("a reservation books at least one GPU", "gpus" if "gpus" in row
                         else "slice", line)
    for col in ("min_runtime", "time_limit", "checkpoint_interval", "busy", "resumable",
                "interconnect", "command", "user", "cpu_milli", "memory_mib"):
        if row.get(col):
            raise rows.error("not a column of a reservation row (it books GPUs; it runs "
                             "nothing)", col, line)
    bid = rows.unique(row.get("id", "") or f"r{n}", "id", line, "id")
    nodes = tuple(x for x in row.get("nodes", "").replace(";", " ").split() if x)
    return SimBooking(bid, project, start, start + duration, gpus, nodes,
                      row.get("model") or None, line, rows.source)


# ---------------------------------------------------------------------- ITP / ElasticFlow

ITP_COLUMNS = ("job_id", "submission_time", "duration", "num_gpu")


DEFAULT_MIN_RUNTIME = 3600.0  # contract given to trace jobs that declare none (ITP, openb)


def parse_itp(text: str, source: str = "<trace>",
              min_runtime: float = DEFAULT_MIN_RUNTIME) -> Trace:
    """Microsoft ITP traces as released with ElasticFlow: every job is a resumable batch job
    (training with checkpoints) of ``num_gpu`` whole GPUs, protected for its first
    ``min_runtime`` seconds (the trace declares no contract); projects come later."""
    rows = _Rows(text, source, ITP_COLUMNS, ("*",))
    jobs: list[TraceJob] = []
    for line, row in rows:
        jid = rows.unique(row["job_id"], "job_id", line, "job_id")
        submit = rows.number(row, "submission_time", line)
        duration = rows.number(row, "duration", line)
        if duration <= 0:
            raise rows.error(f"must be longer than zero, got {row['duration']!r}", "duration", line)
        n = int(rows.number(row, "num_gpu", line, minimum=1, integer=True))
        jobs.append(TraceJob(jid, submit, duration, SliceRequest.whole(n), kind="batch",
                             min_runtime=min_runtime, resumable=True))
    return Trace(tuple(sorted(jobs, key=lambda j: (j.submit, j.id))), source, "itp")


# ---------------------------------------------------------------------- Alibaba openb

OPENB_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
OPENB_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")


@dataclass(frozen=True, slots=True)
class OpenbPod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU; < 1000 with num_gpu 1 = a share of one GPU
    gpu_spec: str = ""  # allowed models joined by '|' ('' = any)
    creation_time: float = 0.0
    deletion_time: float | None = None
    scheduled_time: float | None = None

    @property
    def gpu_request_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    def request(self) -> SliceRequest:
        kw: dict[str, object] = {"cpu_milli": self.cpu_milli, "memory_mib": self.memory_mib}
        if self.gpu_spec:
            kw["gpu_model"] = self.gpu_spec
        if self.num_gpu == 0 or self.gpu_milli == 0:
            return SliceRequest.cpu_only(**kw)
        if self.gpu_milli < MILLI:
            return SliceRequest.mps(self.gpu_milli, **kw)
        return SliceRequest.whole(self.num_gpu, single_node=True, **kw)


@dataclass(frozen=True, slots=True)
class OpenbNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


def parse_openb_pods(text: str, source: str = "<pods>") -> list[OpenbPod]:
    rows = _Rows(text, source, OPENB_POD_COLUMNS, ("*",))
    pods: list[OpenbPod] = []
    for line, row in rows:
        name = row["name"]
        if not name:
            raise rows.error("missing value", "name", line)
        cpu = int(rows.number(row, "cpu_milli", line, integer=True))
        mem = int(rows.number(row, "memory_mib", line, integer=True))
        ngpu = int(rows.number(row, "num_gpu", line, integer=True))
        milli = int(rows.number(row, "gpu_milli", line, integer=True))
        if milli > MILLI:
            raise rows.error(f"gpu_milli is per GPU and at most {MILLI}, got {milli}",
                             "gpu_milli", line)
        if ngpu > 1 and milli != MILLI:
            raise rows.error(f"a pod with {ngpu} GPUs must ask for whole GPUs "
                             f"(gpu_milli {MILLI}), got {milli}", "gpu_milli", line)
        if ngpu == 0 and milli:
            raise rows.error("gpu_milli without num_gpu", "gpu_milli", line)
        spec = row.get("gpu_spec", "")
        created = rows.number(row, "creation_time", line, default=0.0) \
            if "creation_time" in row else 0.0
        deleted = rows.number(row, "deletion_time", line, default=-1.0) \
            if "deletion_time" in row else -1.0
        sched = rows.number(row, "scheduled_time", line, default=-1.0) \
            if "scheduled_time" in row else -1.0
        pods.append(OpenbPod(name, cpu, mem, ngpu, milli if ngpu else 0, spec, created,
                             deleted if deleted >= 0 else None, sched if sched >= 0 else None))
    return pods


def parse_openb_nodes(text: str, source: str = "<nodes>") -> list[OpenbNode]:
    rows = _Rows(text, source, OPENB_NODE_COLUMNS, ("*",))
    nodes: list[OpenbNode] = []
    for line, row in rows:
        name = rows.unique(row["sn"], "sn", line, "node")
        nodes.append(OpenbNode(
            name, int(rows.number(row, "cpu_milli", line, integer=True)),
            int(rows.number(row, "memory_mib", line, integer=True)),
            int(rows.number(row, "gpu", line, integer=True)), row["model"] or "GPU"))
    if not nodes:
        raise TraceError("the node list is empty", "", None, source)
    return nodes


def parse_openb_trace(text: str, source: str = "<trace>") -> Trace:
    """openb pods as a time trace: submitted at creation, running until deletion. Pods that
    never ran (no deletion time, or deleted before scheduled) are skipped. A pod list
    without time columns is for placement only: the error says so."""
    header = {c.strip() for c in text.lstrip("\ufeff").split("\n", 1)[0].split(",")}
    missing = [c for c in ("creation_time", "deletion_time") if c not in header]
    if missing:
        raise TraceError(f"an openb pod list without {' and '.join(missing)} has no times to "
                         "replay: use --placement-repro (with --nodes) to place its pods as "
                         "in the FGD paper", missing[0], 1, source)
    jobs = []
    for p in parse_openb_pods(text, source):
        if p.deletion_time is None:
            continue
        start = p.scheduled_time if p.scheduled_time is not None else p.creation_time
        dur = p.deletion_time - max(start, p.creation_time)
        if dur <= 0:
            continue
        jobs.append(TraceJob(p.name, p.creation_time, dur, p.request(), kind="batch",
                             min_runtime=DEFAULT_MIN_RUNTIME, resumable=False))
    return Trace(tuple(sorted(jobs, key=lambda j: (j.submit, j.id))), source, "openb")


# ---------------------------------------------------------------------- detection


#: the trace formats ``simulate --trace`` reads, and the columns that identify each
FORMATS = {
    "native": "submit, duration and gpus or slice (optional: " + ", ".join(NATIVE_OPTIONAL)
              + ")",
    "itp": "job_id, submission_time, duration, num_gpu (Microsoft ITP / ElasticFlow)",
    "openb": "name, cpu_milli, memory_mib, num_gpu, gpu_milli, and creation_time, "
             "deletion_time to replay in time (Alibaba openb pod list)",
}


def detect_format(text: str, source: str = "<trace>") -> str:
    """The trace format its header names; a header that matches none is an error that lists
    the formats and their columns."""
    first = text.lstrip("\ufeff").split("\n", 1)[0]
    cols = {c.strip() for c in first.split(",")}
    if {"job_id", "submission_time", "num_gpu"} <= cols:
        return "itp"
    if {"gpu_milli", "num_gpu", "cpu_milli"} <= cols and "name" in cols:
        return "openb"
    if {"submit", "duration"} <= cols or cols & {"gpus", "slice"}:
        return "native"  # its own checks name what is missing
    known = "; ".join(f"{name}: {what}" for name, what in FORMATS.items())
    shown = ", ".join(sorted(c for c in cols if c)) or "none"
    raise TraceError(f"the header matches no known trace format (columns: {shown}). "
                     f"Known formats — {known}", "", 1, source)


def parse_trace(text: str, source: str = "<trace>", fmt: str | None = None) -> Trace:
    fmt = fmt or detect_format(text, source)
    text = text.lstrip("\ufeff")
    if fmt == "itp":
        return parse_itp(text, source)
    if fmt == "openb":
        return parse_openb_trace(text, source)
    if fmt == "native":
        return parse_native(text, source)
    raise TraceError(f"unknown trace format {fmt!r} (native, itp, openb)", "", None, source)


def load_trace(path: str | os.PathLike[str], fmt: str | None = None) -> Trace:
    text, source = _read(path)
    return parse_trace(text, source, fmt)


def load_openb_pods(path: str | os.PathLike[str]) -> list[OpenbPod]:
    text, source = _read(path)
    return parse_openb_pods(text, source)


def load_openb_nodes(path: str | os.PathLike[str]) -> list[OpenbNode]:
    text, source = _read(path)
    return parse_openb_nodes(text, source)


# ---------------------------------------------------------------------- projects


def _unit(key: str) -> float:
    h = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0**64


def assign_projects(trace: Trace, accounts: AccountTree, cluster_gpu_hours: float = 1.0,
                    users_per_project: int = 4) -> Trace:
    """Give jobs without a project one, deterministically: a hash of the job id picks a project
    with probability proportional to its effective grant (equal when no grants are set), and a
    user ``<project>-u<k>``. Jobs naming an unknown project are an error."""
    projects = sorted(accounts.projects())
    if not projects:
        raise TraceError("the budgets define no projects", "", None, trace.source)
    grants = accounts.effective_grants(cluster_gpu_hours)
    weights = [max(grants.get(p, 0.0), 0.0) for p in projects]
    if sum(weights) <= 0:
        weights = [1.0] * len(projects)
    total = sum(weights)
    cum, acc = [], 0.0
    for w in weights:
        acc += w / total
        cum.append(acc)
    out = []
    for j in trace.jobs:
        if j.project:
            if not accounts.is_project(j.project):
                raise TraceError(f"job {j.id} charges {j.project!r}, which is not a project of "
                                 f"the budgets (projects: {', '.join(projects)})", "project",
                                 None, trace.source)
            if j.user:
                out.append(j)
                continue
            project = j.project
        else:
            u = _unit(j.id)
            k = next((i for i, c in enumerate(cum) if u < c), len(projects) - 1)
            project = projects[k]
        user = j.user or f"{project}-u{int(_unit('user:' + j.id) * users_per_project)}"
        out.append(replace(j, project=project, user=user))
    for b in trace.bookings:
        if b.project not in accounts or not accounts.is_project(b.project):
            raise TraceError(f"reservation {b.id} books for {b.project!r}, which is not a "
                             f"project of the budgets (projects: {', '.join(projects)})",
                             "project", b.line or None, trace.source)
    return Trace(tuple(out), trace.source, trace.format, trace.bookings)
