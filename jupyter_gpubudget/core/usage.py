"""Usage: GPU-hours charged, weighted by slice size, over a sliding window or a half-life.

usage(project, now) = Σ over charge intervals of (milli / 1000) × hours of the interval that
fall inside [now - window, now]; with a half-life h instead, each moment t counts
2^-((now - t) / h). Open intervals count up to ``now``. With off-peak pricing
(``Policy.off_peak``, core/pricing.py) each interval is split at the windows' edges to the
second and each part counts at its price factor. The same sum per (project, user) is a
member's usage inside the project, which ranks the project's members (ranking.py) and meets
their limits (members.py).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable

from .model import HOUR, MILLI, ChargeInterval, Policy
from .pricing import OffPeak, weighted_seconds

LN2 = math.log(2.0)


def interval_usage(milli: int, start: float, end: float, now: float, policy: Policy) -> float:
    """GPU-hours one interval contributes at ``now`` (off-peak parts at their price)."""
    end = min(end, now)
    if end <= start:
        return 0.0
    if policy.off_peak is not None:  # each part of the interval at its price (pricing.py)
        if not policy.half_life:
            start = max(start, now - policy.window)
        return sum(f * _at_full_price(milli, a, b, now, policy)
                   for a, b, f in policy.off_peak.split(start, end) if f)
    return _at_full_price(milli, start, end, now, policy)


def _at_full_price(milli: int, start: float, end: float, now: float, policy: Policy) -> float:
    if policy.half_life:
        h = policy.half_life
        # ∫_start^end 2^(-(now - t)/h) dt
        w = (h / LN2) * (2.0 ** (-(now - end) / h) - 2.0 ** (-(now - start) / h))
        return milli / MILLI * w / HOUR
    lo = max(start, now - policy.window)
    if end <= lo:
        return 0.0
    return milli / MILLI * (end - lo) / HOUR


def usage_by_span(charges: Iterable[ChargeInterval], spans: list[tuple[float, float]],
                  now: float, off_peak: OffPeak | None = None) -> list[float]:
    """GPU-hours charged inside each ``(start, end)`` span — sorted, not overlapping, e.g. the
    days of a chart — without window or decay: slice fraction × wall time of each interval's
    overlap (its off-peak parts at their price). Open intervals count up to ``now``."""
    out = [0.0] * len(spans)
    ends = [hi for _, hi in spans]
    for c in charges:
        end = min(now, c.end if c.end is not None else now)
        if end <= c.start:
            continue
        i = bisect_right(ends, c.start)  # the first span ending after the interval starts
        while i < len(spans) and spans[i][0] < end:
            lo, hi = spans[i]
            overlap = weighted_seconds(off_peak, max(c.start, lo), min(end, hi))
            if overlap > 0:
                out[i] += c.milli / MILLI * overlap / HOUR
            i += 1
    return out


def usage_by_project(charges: Iterable[ChargeInterval], now: float, policy: Policy
                     ) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in charges:
        u = interval_usage(c.milli, c.start, now if c.end is None else c.end, now, policy)
        if u:
            out[c.project] = out.get(c.project, 0.0) + u
    return out


#: usage per (project, user): a member's GPU-hours inside one project
MemberUsage = dict[tuple[str, str], float]


class UsageMeter:
    """Keeps the scheduler's own charges: closed intervals per project and user (dropped once
    they leave the window) and the open interval of each running workload."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.closed: dict[tuple[str, str], deque[ChargeInterval]] = {}
        self.open: dict[str, ChargeInterval] = {}
        self.horizon = policy.window if not policy.half_life else 20 * policy.half_life

    def add(self, c: ChargeInterval) -> None:
        if c.end is None:
            self.open[c.workload] = c
        elif c.end > c.start:
            self.closed.setdefault((c.project, c.user), deque()).append(c)

    def open_interval(self, workload: str, project: str, user: str, milli: int, start: float
                      ) -> None:
        self.open[workload] = ChargeInterval(workload, project, user, milli, start, None)

    def close(self, workload: str, end: float) -> ChargeInterval | None:
        c = self.open.pop(workload, None)
        if c is None:
            return None
        done = ChargeInterval(c.workload, c.project, c.user, c.milli, c.start, max(end, c.start))
        self.add(done)
        return done

    def usage(self, now: float) -> dict[str, float]:
        """GPU-hours per project at ``now``."""
        return self.split(now)[0]

    def split(self, now: float) -> tuple[dict[str, float], MemberUsage]:
        """GPU-hours per project and per (project, user) at ``now``."""
        out: dict[str, float] = {}
        members: MemberUsage = {}
        self.forget_old(now)
        for key, dq in self.closed.items():
            total = 0.0
            for c in dq:
                total += interval_usage(c.milli, c.start, c.end or now, now, self.policy)
            if total:
                members[key] = total
                out[key[0]] = out.get(key[0], 0.0) + total
        self.add_open(out, now, members)
        return out, members

    def forget_old(self, now: float) -> None:
        """Drop closed intervals that ended before the horizon: they count for nothing."""
        cutoff = now - self.horizon
        for dq in self.closed.values():
            while dq and dq[0].end is not None and dq[0].end <= cutoff:
                dq.popleft()

    def add_open(self, out: dict[str, float], now: float,
                 members: MemberUsage | None = None) -> None:
        """Add the open intervals' usage up to ``now`` to ``out`` (per project) and to
        ``members`` (per project and user)."""
        for c in self.open.values():
            u = interval_usage(c.milli, c.start, now, now, self.policy)
            if u:
                out[c.project] = out.get(c.project, 0.0) + u
                if members is not None:
                    key = (c.project, c.user)
                    members[key] = members.get(key, 0.0) + u

    def charges(self) -> list[ChargeInterval]:
        out = [c for dq in self.closed.values() for c in dq]
        out.extend(self.open.values())
        return out
