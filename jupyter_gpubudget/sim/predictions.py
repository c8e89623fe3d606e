"""How good are the core's run-time predictions? Measured on a trace, offline.

Jobs are taken in submission order; each is predicted from the runs that had finished by the
time it was submitted (a run finishes at submission + duration here: the predictor is judged
on its own, not on how long the scheduler made the job wait), then its own run is learnt.
Three predictors on the same jobs:

- ``predicted``: the core's predictor (``core.backfill.predict_runtime``: features and
  shrinkage);
- ``plain_p90``: the predictor the core had before (90th percentile of the user's, else the
  project's runs in that kind);
- ``declared``: the job's declared time limit, else the policy default.

Figures per predictor: ``mdape`` (median absolute percentage error, |predicted − actual| /
actual) and ``under_pct`` (share of jobs that run past their prediction, in percent).
``baseline_mdape`` is the better of ``plain_p90`` and ``declared``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.backfill import PREDICT_QUANTILE, plain_p90, predict_runtime
from ..core.model import Policy, RuntimeHistory, Workload
from .traces import Trace, TraceJob

Predictor = Callable[[Workload, RuntimeHistory, Policy], float]


def _workload(j: TraceJob) -> Workload:
    return Workload(j.id, j.project, j.user, j.request, j.submit, j.kind, j.min_runtime,
                    j.resumable, j.time_limit, command=j.command)


def replay(trace: Trace, policy: Policy | None = None, q: float = PREDICT_QUANTILE
           ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(predicted, actual) seconds per predictor, for every job of the trace."""
    policy = policy or Policy()
    history = RuntimeHistory()
    done: list[tuple[float, int, TraceJob]] = []
    preds: dict[str, list[float]] = {"predicted": [], "plain_p90": [], "declared": []}
    actual: list[float] = []
    jobs = sorted(trace.jobs, key=lambda j: (j.submit, j.id))
    for k, j in enumerate(jobs):
        while done and done[0][0] <= j.submit:
            _, _, f = heapq.heappop(done)
            history.add_run(_workload(f), f.duration)
        w = _workload(j)
        preds["predicted"].append(predict_runtime(w, history, policy, q))
        preds["plain_p90"].append(plain_p90(w, history, policy))
        preds["declared"].append(max(1.0, j.time_limit or policy.default_runtime))
        actual.append(j.duration)
        heapq.heappush(done, (j.submit + j.duration, k, j))
    a = np.asarray(actual, dtype=float)
    return {name: (np.asarray(p, dtype=float), a) for name, p in preds.items()}


def mdape(predicted: np.ndarray, actual: np.ndarray) -> float:
    """Median absolute percentage error, in percent."""
    if len(actual) == 0:
        return float("nan")
    return float(100.0 * np.median(np.abs(predicted - actual) / actual))


def under_pct(predicted: np.ndarray, actual: np.ndarray) -> float:
    """Share of jobs that ran past their prediction, in percent."""
    if len(actual) == 0:
        return float("nan")
    return float(100.0 * np.mean(actual > predicted))


def evaluate(trace: Trace, policy: Policy | None = None, q: float = PREDICT_QUANTILE
             ) -> dict[str, Any]:
    """The figures of the module docstring, per predictor and per kind."""
    runs = replay(trace, policy, q)
    out: dict[str, Any] = {"jobs": len(trace.jobs)}
    for name, (p, a) in runs.items():
        out[name] = {"mdape": mdape(p, a), "under_pct": under_pct(p, a)}
    out["baseline_mdape"] = min(out["plain_p90"]["mdape"], out["declared"]["mdape"])
    kinds = np.asarray([j.kind for j in sorted(trace.jobs, key=lambda j: (j.submit, j.id))])
    out["by_kind"] = {}
    for kind in sorted(set(kinds.tolist())):
        sel = kinds == kind
        out["by_kind"][kind] = {name: {"mdape": mdape(p[sel], a[sel]),
                                       "under_pct": under_pct(p[sel], a[sel])}
                                for name, (p, a) in runs.items()}
    return out


__all__ = ["replay", "evaluate", "mdape", "under_pct"]
