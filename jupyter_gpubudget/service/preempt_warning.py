"""Warning ahead of a likely preemption: the core's outlook (core/outlook.py) for running
work, in the session/job JSON (``preemption_forecast``), and told once to the owner a lead
time before — as a notice (shown in JupyterLab, posted to their webhook, mailed) and, for a
batch job that asked for one (``warn_signal``), as a signal to its processes.

The outlook runs the scheduler's own cycle at the moments that may change something, so it
costs a few cycles (3 to 7 on bench/preempt_outlook.py's cluster): it is recomputed when the
queue, the running set or a node's health changed, at most every ``min_interval`` s
(``preemption_outlook_interval``), and at least every ``interval`` s — not every cycle.
"""

from __future__ import annotations

import logging
import re
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

from sqlalchemy import select

from jupyter_gpubudget.core.model import HOUR
from jupyter_gpubudget.core.outlook import Outlook, preemption_outlook
from jupyter_gpubudget.core.scheduler import ClusterState
from jupyter_gpubudget.ledger.models import DecisionRow, WorkloadRow

from .timefmt import _dt, companions

#: the decision a warning is recorded as (a notice kind: service/notices.py)
WARNING_KIND = "preempt-warning"

_LOSES = re.compile(r"\s*\(loses [0-9.]+ GPU-h\)\s*$")
_DRAIN = re.compile(r"^node (?P<node>\S+) is draining")

#: where a batch job's ``warn_signal`` is kept (its environment: the job may read it too)
WARN_ENV = "GPUBUDGET_WARN_SIGNAL"

#: signals a batch job may ask for ahead of a likely preemption (``warn_signal``)
WARN_SIGNALS = ("USR1", "USR2", "INT", "TERM", "HUP")


@dataclass(frozen=True, slots=True)
class Foreseen:
    """A running workload's likely preemption, with what the service adds to the core's
    :class:`Outlook`: the project of the work it would yield to, and the reason in words."""

    outlook: Outlook
    for_project: str | None
    words: str

    @property
    def at(self) -> float:
        return self.outlook.at


def outlook_words(reason: str, for_project: str | None) -> str:
    """Why the workload is likely to be preempted, in words (the core's reason without its
    cost figure)."""
    text = _LOSES.sub("", reason or "")
    m = _DRAIN.match(text)
    if m:
        return f"its node {m.group('node')} is being drained for maintenance"
    whose = f"project {for_project}'s backed work" if for_project else "backed work"
    if text.startswith("unbacked work yields to backed work"):
        return (f"{whose} is waiting for its GPUs, and it runs unbacked (its project's grant "
                "does not cover it)")
    if text.startswith("an idle session yields to waiting work"):
        return f"{whose} is waiting for its GPUs, and the session is idle"
    m2 = re.match(r"^project (\S+) stands above (\S+)", text)
    if m2:
        return (f"{whose} is waiting for its GPUs, and project {m2.group(1)} has used more of "
                "its grant")
    return text or "waiting work needs its GPUs"


class Outlooks:
    """The last outlook, recomputed on the forecast's cadence (module docstring)."""

    def __init__(self, horizon: float = HOUR, interval: float = 60.0,
                 min_interval: float = 15.0, max_probes: int = 6) -> None:
        self.horizon = horizon
        self.interval = interval
        self.min_interval = min_interval
        self.max_probes = max_probes
        self._at = float("-inf")
        self._key: tuple = ()
        self._last: dict[str, Foreseen] = {}

    def get(self, state: ClusterState, now: float) -> dict[str, Foreseen]:
        key = (frozenset(w.id for w in state.pending),
               frozenset((w.id, w.stopping) for w in state.running), state.unhealthy)
        age = now - self._at
        if age >= self.interval or (key != self._key and age >= self.min_interval):
            projects = {w.id: w.project for w in state.pending}
            self._last = {
                wid: Foreseen(o, projects.get(o.for_workload or ""),
                              outlook_words(o.reason, projects.get(o.for_workload or "")))
                for wid, o in preemption_outlook(state, now, self.horizon,
                                                 self.max_probes).items()}
            self._at, self._key = now, key
        return self._last


def forecast_json(f: Foreseen | None, state: str, now: float, tz: tzinfo | None = None
                  ) -> dict[str, Any] | None:
    """``preemption_forecast`` of a workload: None unless it runs; ``likely`` with ``at``
    (epoch, and its ``_local``/``_text`` companions), the work it would yield to and why."""
    if state != "running":
        return None
    if f is None or f.at < now - 1:  # a forecast moment already past is no forecast
        return {"likely": False, "at": None, "at_local": None, "at_text": None,
                "for_workload": None, "for_project": None, "reason": None}
    return companions({"likely": True, "at": f.at, "for_workload": f.outlook.for_workload,
                       "for_project": f.for_project, "reason": f.words}, ("at",), now, tz)


def clock(t: float, tz: tzinfo | None = None) -> str:
    """'14:05 EST': a time of day with its zone's abbreviation."""
    d = _dt(t, tz)
    return f"{d.strftime('%H:%M')} {d.tzname() or ''}".strip()


def signal_number(name: str) -> int:
    return int(getattr(signal, f"SIG{name}"))


class PreemptionWarner:
    """Tells the owner of each running workload whose likely preemption is within ``lead``
    seconds, once per run: a ``preempt-warning`` decision (a notice), and for a batch job
    with a ``warn_signal`` that signal (``notify(row, signal name) -> error or None``)."""

    def __init__(self, ledger: Any, lead: float, *, tz: tzinfo | None = None,
                 notify: Callable[[WorkloadRow, str], str | None] | None = None,
                 log: logging.Logger | None = None) -> None:
        self.ledger = ledger
        self.lead = lead
        self.tz = tz
        self.notify = notify
        self.log = log or logging.getLogger("gpubudget.warning")
        self._told: set[tuple[str, float]] = set()  # (workload, started_at) warned

    def due(self, foreseen: Mapping[str, Foreseen], now: float) -> list[str]:
        """Workloads whose likely preemption is ahead (not this cycle's) and within the
        lead time."""
        if self.lead <= 0:
            return []
        return sorted(wid for wid, f in foreseen.items() if now < f.at <= now + self.lead)

    def __call__(self, foreseen: Mapping[str, Foreseen], now: float) -> list[str]:
        """Warn for every due workload not warned yet in its current run; the ids warned."""
        due = self.due(foreseen, now)
        if not due:
            return []
        todo = []
        with self.ledger.ro() as s:
            rows = {r.id: r for r in s.scalars(select(WorkloadRow).where(
                WorkloadRow.id.in_(due), WorkloadRow.state == "running"))}
            for wid in due:
                r = rows.get(wid)
                if r is None or r.started_at is None or (wid, r.started_at) in self._told:
                    continue
                self._told.add((wid, r.started_at))
                told = s.scalar(select(DecisionRow.id).where(
                    DecisionRow.workload == wid, DecisionRow.kind == WARNING_KIND,
                    DecisionRow.at >= r.started_at).limit(1))
                if told is None:  # (else warned before a restart of the service)
                    s.expunge(r)
                    todo.append(r)
        for r in todo:  # the engine and the ledger, outside the read
            f = foreseen[r.id]
            detail: dict[str, Any] = {
                "at": f.at, "at_clock": clock(f.at, self.tz),
                "for": f.outlook.for_workload, "for_project": f.for_project,
                "why": f.words, "lead_s": self.lead}
            sig = (r.env or {}).get(WARN_ENV) if r.kind == "batch" else None
            if sig in WARN_SIGNALS and self.notify is not None:
                err = self.notify(r, sig)
                detail["signal"] = sig
                if err:
                    detail["signal_error"] = err
                    self.log.warning("%s: warn signal %s not sent: %s", r.id, sig, err)
            self.ledger.record_decision(now=now, kind=WARNING_KIND, workload=r.id,
                                        reason=f.outlook.reason, detail=detail)
        return [r.id for r in todo]


# ------------------------------------------------------------ the lab's notice before a stop
#: the decision recorded when a session's owner lets its preemption go ahead now
RELEASE_KIND = "release-now"


def notice_seconds(notice_time: float, stop_grace: float) -> float:
    """The notice a preempted session's lab gets before its server is stopped: the setting,
    never more than half the stop grace (the other half is the snapshot's)."""
    return max(0.0, min(notice_time, stop_grace / 2))


def stop_at(requested_at: float, notice: float, decisions: list[DecisionRow]) -> float:
    """When the spawner stops a server whose preemption was asked for at ``requested_at``:
    after the notice, or when its owner released it (a ``release-now`` since then)."""
    at = requested_at + notice
    for d in decisions:
        if d.kind == RELEASE_KIND and d.at >= requested_at:
            at = min(at, d.at)
    return at
