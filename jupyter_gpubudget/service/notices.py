"""Notices in words: what a researcher is told when the scheduler stops their work.

Pure functions, no I/O: a decision of the ledger (its kind, reason, detail and actor), the
workload it concerns, and what the service knows around it (the reason the core gave for a
preemption, the admin's note on a draining node, the snapshot kept) become a
:class:`Notice` — a title, a body in plain words (what happened, why, what was saved, where
the work went, what to do) and the ids, kept apart in ``details``. The words never carry raw
ids or ``user/`` server names: the default server is "your server", a named one is
"your server “gpu”". The same notice is shown in JupyterLab, posted to a webhook and mailed
(``service/delivery.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

#: decision kinds a user is told about (``Ledger.notices_for``)
NOTICE_KINDS = ("preempt", "idle", "requeue", "hibernate", "snapshot_lost", "timeout",
                "cancel", "restore", "preempt-warning")

#: why a notice was sent, one word each (the ``cause`` of a :class:`Notice`)
CAUSES = ("needed", "drain", "idle", "hibernate", "time_limit", "cancel", "restore_failed",
          "likely", "other")

_DRAIN = re.compile(r"^node (?P<node>\S+) is draining")
_LOSES = re.compile(r"\s*\(loses [0-9.]+ GPU-h\)\s*$")


@dataclass(frozen=True, slots=True)
class Notice:
    """One notice: ``title`` and ``body`` are words for people; ``details`` holds the ids."""

    kind: str
    cause: str
    title: str
    body: str
    details: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "cause": self.cause, "title": self.title,
                "body": self.body, "details": dict(self.details)}

    def as_text(self) -> str:
        """The notice as a plain-text message (an e-mail's body)."""
        lines = [self.title, "", self.body, ""]
        lines += [f"{k}: {v}" for k, v in self.details.items() if v not in (None, "")]
        return "\n".join(lines) + "\n"


def server_label(name: str | None, user: str | None, kind: str = "interactive") -> str:
    """What a workload is called in words: a session's server (``alice/`` → "your server",
    ``alice/gpu`` → "your server “gpu”"), a batch job by its name ("your job “train”")."""
    name = name or ""
    if kind == "interactive":
        server = name.split("/", 1)[1] if "/" in name else ("" if name == user else name)
        return f"your server “{server}”" if server else "your server"
    return f"your job “{name}”" if name else "your job"


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _why_preempted(cause_reason: str, drain_note: str | None, node: str | None) -> tuple[str, str]:
    """(cause, sentence) for a preemption the core explained with ``cause_reason``."""
    m = _DRAIN.match(cause_reason or "")
    if m or node:
        where = node or (m.group("node") if m else "")
        note = (drain_note or "").strip()
        said = (f" The administrators' note: “{note}”." if note
                else " The administrators left no note.")
        return "drain", (f"Its node {where} is being drained for maintenance, so the work on "
                         f"it had to stop.{said}")
    text = _LOSES.sub("", cause_reason or "")
    if text.startswith("unbacked work yields to backed work"):
        return "needed", ("Work backed by its project's grant needed the slice, and yours ran "
                          "unbacked (its project's grant did not cover it), so it was not "
                          "protected.")
    if text.startswith("an idle session yields to waiting work"):
        return "needed", ("Waiting work needed the slice, and your session had been idle, "
                          "so it was no longer protected.")
    m2 = re.match(r"^project (\S+) stands above (\S+)", text)
    if m2:
        return "needed", (f"Backed work of project {m2.group(2)} needed the slice: project "
                          f"{m2.group(1)} had used more of its grant, and its protected time "
                          "was over.")
    if text:
        return "other", f"The scheduler gave this reason: {text}."
    return "other", "The scheduler needed the slice."


def _hours(lost: Any) -> str:
    try:
        v = float(lost)
    except (TypeError, ValueError):
        return ""
    return f" About {v:.2f} GPU-hours of work since the last save were lost." if v > 0 else ""


def _warning(label: str, on: str, interactive: bool, w: dict[str, Any], detail: dict,
             ids: dict[str, Any]) -> Notice:
    """The notice a lead time ahead of a likely preemption: when, why, what will be saved,
    what to do now."""
    when = detail.get("at_clock") or "soon"
    ids.update({"likely_at": detail.get("at"), "for_workload": detail.get("for")})
    whose = (f" for project {detail['for_project']}'s backed work" if detail.get("for_project")
             else "")
    why = detail.get("why") or "waiting work needs its GPUs"
    if interactive:
        saved = ("If it is stopped, its kernels are saved in a snapshot first and restored when "
                 "it starts again." if w.get("resumable", True) else
                 "If it is stopped, its kernels' state is lost.")
        todo = ("Save your notebooks now, or release the GPU (stop the server) if you are "
                "done.")
    else:
        saved = ("If it is stopped, it is requeued and starts again." if w.get("resumable")
                 else "If it is stopped, it is not requeued.")
        sig = detail.get("signal")
        todo = (f"It was sent SIG{sig} now, as it asked, to save its work."
                if sig and not detail.get("signal_error") else
                "Save its progress now if it keeps its own checkpoints.")
    title = f"{_cap(label)}{on} may be stopped at {when}{whose}"
    body = " ".join((f"{_cap(label)}{on} may be stopped at about {when}{whose}: {why}. "
                     "Nothing has happened yet, and the queue may still change.", saved, todo))
    return Notice("preempt-warning", "likely", title, body, ids)


def build_notice(*, kind: str, reason: str = "", detail: dict | None = None,
                 actor: str = "scheduler", workload: dict[str, Any],
                 cause_reason: str = "", drain_note: str | None = None,
                 drain_node: str | None = None, lost_gpu_hours: float | None = None,
                 at: float | None = None) -> Notice:
    """The notice for one decision.

    Parameters
    ----------
    kind, reason, detail, actor:
        the decision as the ledger recorded it (``DecisionRow``).
    workload:
        ``id``, ``name``, ``user``, ``project``, ``kind`` (interactive | batch),
        ``resumable`` and ``state`` of the workload it concerns.
    cause_reason:
        the reason the core gave when it chose to preempt (for a requeue, recorded on the
        decision before it); defaults to ``reason``.
    drain_note, drain_node:
        the admin's note on the node being drained, and the node.
    lost_gpu_hours:
        the work lost since the last save, where known.
    """
    detail = dict(detail or {})
    w = workload
    label = server_label(w.get("name"), w.get("user"), w.get("kind") or "interactive")
    project = w.get("project") or ""
    interactive = (w.get("kind") or "interactive") == "interactive"
    ids: dict[str, Any] = {"workload": w.get("id"), "project": project,
                           "name": w.get("name") or None}
    if at is not None:
        ids["at"] = at
    on = f" (project {project})" if project else ""

    if kind in ("preempt", "requeue") and not (kind == "requeue" and actor != "scheduler"
                                               and not detail.get("snapshot")
                                               and reason.startswith("requeued by")):
        cause, why = _why_preempted(cause_reason or reason, drain_note, drain_node)
        snap = detail.get("snapshot")
        requeued_as = detail.get("as")
        requeued = bool(requeued_as) or bool(detail.get("requeued")) or kind == "requeue"
        ids.update({"snapshot": snap, "requeued_as": requeued_as,
                    "for_workload": detail.get("for")})
        if snap:
            saved = ("Your kernels were saved in a verified snapshot just before it stopped: "
                     "variables, imports and open notebooks come back as they were.")
        elif interactive:
            saved = ("No snapshot was saved: the kernels' state since the server started is "
                     "lost." + _hours(lost_gpu_hours if lost_gpu_hours is not None
                                      else detail.get("lost_gpu_hours")))
        elif detail.get("checkpoint_fallback"):
            saved = ("Its processes could not be checkpointed "
                     f"({detail['checkpoint_fallback']}), so it was stopped with a signal "
                     "and starts again from its command.")
            ids["checkpoint_fallback"] = detail["checkpoint_fallback"]
        elif detail.get("checkpoint"):
            saved = ("Its processes were checkpointed just before it stopped (everything they "
                     "held in memory was saved): it resumes where it stopped, not from its "
                     "command.")
            ids["checkpoint"] = detail["checkpoint"]
        else:
            saved = ("Nothing of a batch job's memory is saved: it starts again from its "
                     "command (resume from your own checkpoints).")
        if requeued and interactive:
            went = ("It is back in the queue as a resume with its saved kernels: when a slice "
                    "is free it starts again — possibly on another node — and restores them "
                    "before your browser reconnects.")
            todo = "Nothing to do: keep the tab open or come back later; the queue shows when it is predicted to start."
        elif requeued:
            went = "It is back in the queue, in its place by submission time, and starts again when a slice is free."
            todo = "Nothing to do; `gpubudget jobs` shows where it waits."
        else:
            went = "It was not requeued (it was not submitted as resumable)."
            todo = ("Start it again when you need it"
                    + (" (the spawn form shows when a slice is predicted to be free)."
                       if interactive else " (`gpubudget submit`)."))
        title = (f"{_cap(label)}{on} was stopped: its node is being drained" if cause == "drain"
                 else f"{_cap(label)}{on} was preempted")
        body = " ".join((f"{_cap(label)}{on} was stopped to free its GPU slice.", why, saved,
                         went, todo))
        return Notice(kind, cause, title, body, ids)

    if kind == "preempt-warning":  # ahead of a likely preemption (service/preempt_warning)
        return _warning(label, on, interactive, w, detail, ids)

    if kind == "requeue":  # an admin put a running batch job back in the queue
        title = f"{_cap(label)}{on} was requeued by an administrator"
        body = (f"An administrator ({actor}) stopped {label}{on} and put it back in the queue. "
                "It keeps its place by submission time and starts again when a slice is free; "
                "nothing of its memory is saved, so it starts from its command again. "
                "Nothing to do; ask the administrators if you want to know why.")
        return Notice(kind, "cancel", title, body, ids)

    if kind == "idle":
        title = f"{_cap(label)}{on} is idle: its protection ended"
        body = (f"{_cap(label)}{on} has used its GPU too little for a while, so its protected "
                "time ended early. It keeps running, but waiting work may now take its slice "
                "(after a snapshot of its kernels). Nothing was saved yet. Use the GPU again, "
                "or stop the server if you are done, so the project is not charged for idle "
                "time.")
        return Notice(kind, "idle", title, body, ids)

    if kind == "hibernate":
        snap = detail.get("snapshot")
        ids["snapshot"] = snap
        title = f"{_cap(label)}{on} was hibernated after being idle"
        body = (f"{_cap(label)}{on} was idle, so it was stopped and its GPU slice released; "
                "charging stopped with it. Your kernels were saved in a verified snapshot. "
                "Nothing is queued: open the server again from the hub when you need it, and "
                "the kernels are restored as they were.")
        return Notice(kind, "hibernate", title, body, ids)

    if kind == "timeout":
        m = re.search(r"([0-9.]+) s", reason or "")
        limit = f" ({float(m.group(1)) / 3600:.4g} h)" if m else ""
        title = f"{_cap(label)}{on} reached its time limit"
        body = (f"{_cap(label)}{on} ran for the whole time limit it was given{limit} and was "
                "stopped. Nothing was saved by the service and it was not requeued. Submit "
                "it again with a longer time limit, or resume from your own checkpoints.")
        return Notice(kind, "time_limit", title, body, ids)

    if kind == "cancel":
        by = actor if actor and actor != w.get("user") else ""
        title = (f"{_cap(label)}{on} was cancelled by an administrator" if by
                 else f"{_cap(label)}{on} was cancelled")
        body = ((f"An administrator ({by}) cancelled {label}{on}. " if by
                 else f"{_cap(label)}{on} was cancelled. ")
                + "It stopped and was not requeued; nothing was saved by the service. "
                "Ask the administrators why, or submit it again.")
        return Notice(kind, "cancel", title, body, ids)

    if kind in ("snapshot_lost", "restore"):  # (a restore report: only one with an error)
        problem = ((detail.get("error") if kind == "restore" else reason)
                   or "no snapshot could be restored")
        ids["snapshot"] = detail.get("snapshot")
        title = f"{_cap(label)}{on} could not be restored"
        body = (f"{_cap(label)}{on} was to come back from its saved kernels, but that failed: "
                f"{problem}. Your notebooks' files are untouched; the kernels start empty, so "
                "run the notebooks again. The loss is recorded; tell the administrators if it "
                "happens again.")
        return Notice(kind, "restore_failed", title, body, ids)

    title = f"{_cap(label)}{on}: {kind}"
    return Notice(kind, "other", title, f"{_cap(label)}{on}: {reason or kind}.", ids)
