"""Off-peak pricing replayed: how much batch work moves into the windows, and what the
windows' ("the night's") utilisation becomes.

Two runs of the same trace on the same cluster:

- *before*: the policy without off-peak prices, every job submitted when the trace says;
- *after*: the policy with them (usage charged at the windows' prices) and the batch jobs
  that can wait submitted with ``start: off-peak``: a job of kind ``batch`` (a deterministic
  ``share`` of them, 1.0: all) submitted outside a window waits for the next window's start,
  as the service holds such a job. Interactive sessions and debug runs never wait.

Trace time is read as UNIX time, as the core reads it: a trace that starts at 0 starts on
Thursday 1 January 1970, 00:00 UTC, and the windows are placed in the policy's time zone
from there. Figures:

- ``batch_in_window_share``: the share of the batch GPU-hours delivered inside the windows,
  before and after; ``moved_share`` is the difference (the share of batch GPU-hours that
  moved into the windows);
- ``window_utilisation``: GPU-hours delivered inside the windows over the cluster's GPU-hours
  in them (from the trace's start to the run's end), before and after; ``outside`` the same
  outside the windows;
- ``jobs_moved``: the batch jobs that waited for a window, and their wait for it.
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any

from ..core.accounts import Budgets
from ..core.model import HOUR, MILLI, Policy
from ..core.pricing import OffPeak, make_off_peak
from .engine import JobRecord, SimConfig, Simulator
from .traces import Trace

#: the windows ``gpubudget simulate --off-peak FACTOR`` uses when the budgets file sets none:
#: weekday nights and the whole weekend, in UTC
DEFAULT_WINDOWS = ("Mon-Fri 20:00-07:00", "Sat-Sun 00:00-24:00")


def off_peak_policy(policy: Policy, factor: float | None) -> OffPeak:
    """The off-peak policy to replay: the budgets file's, its factor replaced by ``factor``
    when given; else the default windows in UTC at ``factor``."""
    if policy.off_peak is not None:
        p = policy.off_peak
        return p if factor is None else make_off_peak(p.timezone, factor, list(p.text))
    if factor is None:
        raise ValueError("--off-peak: the budgets file sets no off_peak policy; give a factor")
    return make_off_peak("UTC", factor, list(DEFAULT_WINDOWS))


def can_wait(job_id: str, kind: str, share: float) -> bool:
    """Whether a trace job waits for the windows: batch jobs only, ``share`` of them, chosen
    by a hash of the id (the same jobs in every run)."""
    if kind != "batch" or share <= 0:
        return False
    return share >= 1 or (zlib.crc32(job_id.encode()) % 10_000) < share * 10_000


def move_to_windows(trace: Trace, off_peak: OffPeak, share: float = 1.0
                    ) -> tuple[Trace, dict[str, float]]:
    """The trace with the batch jobs that can wait submitted at the next window's start;
    returns it and the jobs moved, id -> seconds they wait for the window."""
    moved: dict[str, float] = {}
    jobs = []
    for j in trace.jobs:
        if can_wait(j.id, j.kind, share):
            at = off_peak.next_start(j.submit)
            if at is not None and at > j.submit:
                moved[j.id] = at - j.submit
                j = replace(j, submit=at)
        jobs.append(j)
    jobs.sort(key=lambda j: j.submit)
    return replace(trace, jobs=tuple(jobs)), moved


class _Recording(Simulator):
    """The simulator, keeping every run's (kind, GPUs, start, end) as it is charged."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.runs: list[tuple[str, float, float, float]] = []

    def _charge(self, r: JobRecord, now: float) -> float:
        if r.started_at is not None and now > r.started_at:
            self.runs.append((r.job.kind, r.milli / MILLI, r.started_at, now))
        return super()._charge(r, now)


def _figures(runs: list[tuple[str, float, float, float]], off_peak: OffPeak, gpus: float,
             start: float, end: float) -> dict[str, float]:
    batch = batch_in = used_in = used_out = 0.0
    for kind, g, a, b in runs:
        inside = sum(e - s for s, e, f in off_peak.split(a, b) if f < 1.0)
        used_in += g * inside / HOUR
        used_out += g * (b - a - inside) / HOUR
        if kind == "batch":
            batch += g * (b - a) / HOUR
            batch_in += g * inside / HOUR
    window_h = sum(e - s for s, e, f in off_peak.split(start, end) if f < 1.0) / HOUR
    out_h = (end - start) / HOUR - window_h
    return {"batch_gpu_hours": round(batch, 1),
            "batch_in_window_share": round(batch_in / batch, 4) if batch else 0.0,
            "window_utilisation": round(used_in / (gpus * window_h), 4) if window_h else 0.0,
            "outside_utilisation": round(used_out / (gpus * out_h), 4) if out_h > 0 else 0.0}


def replay(trace: Trace, budgets: Budgets, inventory: Any, config: SimConfig,
           factor: float | None = None, share: float = 1.0) -> dict[str, Any]:
    """Both runs and their figures (see the module's docstring)."""
    off_peak = off_peak_policy(budgets.policy, factor)
    base = replace(budgets.policy, off_peak=None)
    before = _Recording(trace, budgets.accounts, inventory, base, config)
    res_b = before.run()
    moved_trace, moved = move_to_windows(trace, off_peak, share)
    after = _Recording(moved_trace, budgets.accounts, inventory,
                       replace(budgets.policy, off_peak=off_peak), config)
    res_a = after.run()
    start = min((j.submit for j in trace.jobs), default=0.0)
    end = max(res_b.end, res_a.end)
    gpus = res_b.total_milli / MILLI
    fb = _figures(before.runs, off_peak, gpus, start, end)
    fa = _figures(after.runs, off_peak, gpus, start, end)
    waits = sorted(moved.values())
    return {
        "off_peak": {"timezone": off_peak.timezone, "factor": off_peak.factor,
                     "windows": list(off_peak.text)},
        "batch_that_may_wait": share,
        "jobs_moved": len(moved),
        "jobs_moved_wait_h_median": round(waits[len(waits) // 2] / HOUR, 2) if waits else 0.0,
        "before": fb, "after": fa,
        "moved_share": round(fa["batch_in_window_share"] - fb["batch_in_window_share"], 4),
        "span_h": round((end - start) / HOUR, 1),
    }


__all__ = ["DEFAULT_WINDOWS", "can_wait", "move_to_windows", "off_peak_policy", "replay"]
