"""Advance reservations (bookings) in the simulator: a side file lists them
(``gpubudget simulate --reservations FILE.yaml``), the simulator replays them through the
same core (``core/reservations.py``: booked GPUs held back before the window, work of others
preempted at its start, the project's work started into it), and the report says what they
cost the others: the wait of the work of projects that hold no booking, with and without the
bookings (p50/p90), and each booking's GPU-hours used and left unused.

The file::

    reservations:
      - id: course          # optional (default: r1, r2, ... in order)
        project: lattice    # a project of the budgets tree
        start: 2d           # from the trace's start (a duration: 90, '30m', '8h', '2d4h')
        end: 2d4h
        gpus: 4
        nodes: [node-3]     # optional: on these nodes
        gpu_model: H100-80GB  # optional
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.accounts import AccountTree
from ..core.inventory import Inventory
from ..core.reservations import Booking, BookingError, choose_gpus
from ..core.yamlnodes import ConfigError, decode, parse

HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class SimBooking:
    """A booking as the file gives it: its window in seconds from the trace's start."""

    id: str
    project: str
    start: float
    end: float
    gpus: int
    nodes: tuple[str, ...] = ()
    gpu_model: str | None = None
    line: int = 0
    source: str = ""


def load_bookings(text: str | bytes, source: str = "<reservations>") -> list[SimBooking]:
    """The bookings of a reservations file; :class:`ConfigError` names the field and line."""
    root = parse(decode(text, source) if isinstance(text, bytes) else text, source)
    top = root.mapping({"reservations"})
    if "reservations" not in top:
        raise root.error("missing required key 'reservations'")
    out: list[SimBooking] = []
    seen: set[str] = set()
    for i, node in enumerate(top["reservations"].seq()):
        m = node.mapping({"id", "project", "start", "end", "gpus", "nodes", "gpu_model"})
        for key in ("project", "start", "end", "gpus"):
            if key not in m:
                raise node.error(f"missing required key {key!r}")
        bid = m["id"].string() if "id" in m else f"r{i + 1}"
        if bid in seen:
            raise m["id"].error(f"a second reservation {bid!r}")
        seen.add(bid)
        start, end = m["start"].duration(), m["end"].duration()
        if not end > start:
            raise m["end"].error("the window must end after it starts")
        out.append(SimBooking(
            bid, m["project"].string(), start, end,
            int(m["gpus"].number(minimum=1, integer=True)),
            tuple(m["nodes"].string_list()) if "nodes" in m else (),
            m["gpu_model"].string() if "gpu_model" in m else None, node.line, source))
    return out


def read_bookings(path: str | Path) -> list[SimBooking]:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read the reservations file: {e.strerror}", source=str(p)) \
            from None
    return load_bookings(data, str(p))


def place(specs: Sequence[SimBooking], inventory: Inventory, accounts: AccountTree,
          t0: float) -> list[Booking]:
    """The core's bookings for a trace starting at ``t0``: each one's GPUs chosen as the
    service chooses them (:func:`choose_gpus`, in the file's order). A project not in the
    budgets tree or a booking that does not fit is a :class:`ConfigError` naming it."""
    out: list[Booking] = []
    for s in specs:
        where = f"reservations[{s.id}]"
        if s.project not in accounts or not accounts.is_project(s.project):
            raise ConfigError(f"no project {s.project!r} in the budgets tree",
                              f"{where}.project", s.line or None, s.source)
        try:
            gpus = choose_gpus(inventory, out, s.gpus, t0 + s.start, t0 + s.end,
                               nodes=s.nodes, gpu_model=s.gpu_model)
        except BookingError as e:
            raise ConfigError(str(e).split(": ", 1)[-1], f"{where}.{e.field}",
                              s.line or None, s.source) from None
        out.append(Booking(s.id, s.project, t0 + s.start, t0 + s.end, gpus))
    return out


class BookedUse:
    """GPU-hours each booking's project held on the booking's own GPUs inside its window
    (the simulator calls :meth:`ran` as each run's charge closes)."""

    def __init__(self, bookings: Sequence[Booking]) -> None:
        self.bookings = list(bookings)
        self.by_gpu: dict[tuple[str, int], list[Booking]] = {}
        for b in self.bookings:
            for key in b.gpus:
                self.by_gpu.setdefault(key, []).append(b)
        self.used: dict[str, float] = {b.id: 0.0 for b in self.bookings}

    def ran(self, project: str, slices: Sequence[Any], start: float, end: float) -> None:
        for sl in slices:
            for b in self.by_gpu.get((sl.node, sl.gpu), ()):
                if b.project != project:
                    continue
                overlap = min(end, b.end) - max(start, b.start)
                if overlap > 0:
                    self.used[b.id] += sl.milli / 1000 * overlap / HOUR

    def table(self) -> list[dict[str, Any]]:
        out = []
        for b in self.bookings:
            booked = len(b.gpus) * (b.end - b.start) / HOUR
            used = min(booked, self.used[b.id])
            out.append({"id": b.id, "project": b.project, "gpus": len(b.gpus),
                        "booked_gpu_hours": round(booked, 4),
                        "used_gpu_hours": round(used, 4),
                        "unused_gpu_hours": round(booked - used, 4)})
        return out


def _pct(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile, interpolated linearly (as ``sim/metrics.py`` gives them)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def cost_to_others(with_res: Any, without: Any, bookings: Sequence[Booking],
                   use: BookedUse) -> dict[str, Any]:
    """What the bookings cost the others: the p50/p90 wait (seconds) of the work of projects
    that hold no booking, in the run with the bookings and in the same run without them,
    and each booking's GPU-hours used and unused."""
    booked = {b.project for b in bookings}

    def waits(res: Any) -> list[float]:
        return [r.wait for r in res.records.values()
                if r.job.project not in booked and r.wait is not None]

    a, b = waits(with_res), waits(without)
    rows = use.table()
    return {
        "others_wait_p50_s": {"with": _pct(a, 50), "without": _pct(b, 50)},
        "others_wait_p90_s": {"with": _pct(a, 90), "without": _pct(b, 90)},
        "others_jobs": len(a),
        "bookings": rows,
        "booked_gpu_hours": round(sum(r["booked_gpu_hours"] for r in rows), 4),
        "booked_used_gpu_hours": round(sum(r["used_gpu_hours"] for r in rows), 4),
        "booked_unused_gpu_hours": round(sum(r["unused_gpu_hours"] for r in rows), 4),
    }
