"""The usage report's shape, shared by the service's report over the ledger
(``ledger/reports.py``, ``GET /api/v1/reports``, ``gpubudget report``) and the simulator's
report over a simulated period (``sim/usage.py``, ``gpubudget simulate --report``): the
figures of one line (charged, busy, measured, idle GPU-hours), a grant pro rata for the
period, the waits' percentiles and the CSV columns. Pure: no I/O, no database.

*busy* is ``None`` (unknown) where nothing measured; where only part of the charged time was
measured, busy and idle describe the measured part (``measured_gpu_h`` says how much).
*charged* is at full price (what the slices held); *priced* is the same GPU-hours at their
price, off-peak parts at the policy's factor (what the standings count); ``None`` where the
report does not price them (the simulator's).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

MS_PER_H = 1000.0 * 3600.0  # milli-GPU-seconds in a GPU-hour

#: the figures of every line (project, user, period, total), in the CSV's order
FIGURES = ("charged_gpu_h", "priced_gpu_h", "busy_gpu_h", "measured_gpu_h", "idle_gpu_h",
           "idle_share")

#: the CSV's header
CSV_COLUMNS = ("row", "period_start", "project", "user", *FIGURES, "grant_gpu_h",
               "preemptions")


@dataclass
class Figures:
    """One line's sums in milli-GPU-seconds: charged, measured (the part of it something
    measured) and busy (what the measured part computed); ``discount_ms``: what off-peak
    prices took off the charged time (None: not priced)."""

    charged_ms: float = 0.0
    measured_ms: float = 0.0
    busy_ms: float = 0.0
    discount_ms: float | None = None

    def add(self, c: float, m: float, b: float, d: float | None = None) -> None:
        self.charged_ms += c
        self.measured_ms += m
        self.busy_ms += b
        if d is not None:
            self.discount_ms = (self.discount_ms or 0.0) + d

    def empty(self) -> bool:  # what moved between periods leaves rounding dust, not 0
        return abs(self.charged_ms) < 1e-3 and abs(self.measured_ms) < 1e-3

    def json(self) -> dict[str, Any]:
        charged = max(0.0, self.charged_ms / MS_PER_H)
        priced = None if self.discount_ms is None else max(
            0.0, (self.charged_ms - self.discount_ms) / MS_PER_H)
        if self.measured_ms <= 1e-3:
            return {"charged_gpu_h": charged, "priced_gpu_h": priced, "busy_gpu_h": None,
                    "measured_gpu_h": 0.0, "idle_gpu_h": None, "idle_share": None}
        measured, busy = self.measured_ms / MS_PER_H, max(0.0, self.busy_ms / MS_PER_H)
        idle = max(0.0, measured - busy)
        return {"charged_gpu_h": charged, "priced_gpu_h": priced, "busy_gpu_h": busy,
                "measured_gpu_h": measured, "idle_gpu_h": idle, "idle_share": idle / measured}


def grant_figures(hours: float | None, start: float, end: float, window: float
                  ) -> dict[str, Any]:
    """A grant of ``hours`` GPU-hours per ``window`` seconds, pro rata for ``[start, end)``
    (None: the account has none)."""
    if hours is None:
        return {"grant_gpu_h": None}
    return {"grant_gpu_h": hours * (end - start) / window, "grant_gpu_h_per_window": hours}


def nearest_rank(hist: list[tuple[float, int]], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of values given as (value, count)."""
    total = sum(n for _, n in hist)
    if total == 0:
        return None
    rank = min(total - 1, max(0, int(round(q * (total - 1)))))
    seen = 0
    for v, n in sorted(hist):
        seen += n
        if seen > rank:
            return float(v)
    return float(max(v for v, _ in hist))


def waits_figures(hist: dict[str, list[tuple[float, int]]]) -> dict[str, Any]:
    """Waits per kind (seconds, as (value, count)): their count, p50 and p90."""
    return {k: {"count": sum(n for _, n in v), "p50_s": nearest_rank(v, 0.5),
                "p90_s": nearest_rank(v, 0.9)} for k, v in sorted(hist.items())}


def csv_rows(rep: dict[str, Any]) -> Iterable[list[Any]]:
    """The report as CSV rows (header first): one row per project and user (``by=user``) or
    per period and project (``by=day|week``), then per project and a total row. The rows of
    one kind sum to the total, as the JSON's figures do."""
    yield list(CSV_COLUMNS)

    def fig(d: dict) -> list[Any]:
        return ["" if d.get(k) is None else d.get(k) for k in FIGURES]

    for per in rep.get("periods", []):
        for e in per["projects"]:
            yield ["period", per["start_local"], e["project"], "", *fig(e), "", ""]
    for p in rep["projects"]:
        for u in p["users"]:
            yield ["user", "", p["project"], u["user"], *fig(u), "", ""]
    for p in rep["projects"]:
        yield ["project", "", p["project"], "", *fig(p),
               "" if p.get("grant_gpu_h") is None else p["grant_gpu_h"], p["preemptions"]]
    t = rep["totals"]
    yield ["total", "", rep["account"], "", *fig(t),
           "" if t.get("grant_gpu_h") is None else t["grant_gpu_h"], t["preemptions"]]


def csv_text(rep: dict[str, Any], cell: Callable[[Any], str] = str) -> str:
    """:func:`csv_rows` as CSV text, every cell quoted and passed through ``cell`` (the
    service's and the simulator's make a spreadsheet formula plain text)."""
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\r\n")
    for row in csv_rows(rep):
        w.writerow([cell(x) for x in row])
    return buf.getvalue()
