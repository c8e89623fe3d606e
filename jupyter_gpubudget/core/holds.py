"""Work that waits for something other than GPUs: the tasks of a job array beyond its
``max_running``, and jobs that run only after others (``after``).

Both are held out of a cycle before anything is ranked: a held workload is not pending for
the scheduler (it takes no reservation, preempts nothing, is not counted in its project's
projected standing). What is let through is ranked like any other work of its project. With
no arrays and no dependencies :func:`runnable` returns the pending work unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .model import Workload

#: Slurm's names: the job starts once every listed job has ended — ``afterok`` successfully
#: (the default), ``afterany`` in whatever way, ``afternotok`` at least one of them not
#: successfully
AFTER_KINDS: tuple[str, ...] = ("afterok", "afterany", "afternotok")

READY, WAIT, NEVER = "ready", "wait", "never"


def dependency(after: Sequence[str], kind: str, finished: Mapping[str, bool]) -> str:
    """Whether work that runs after ``after`` may start: ``ready``, ``wait`` (some have not
    ended yet) or ``never`` (its condition can no longer hold). ``finished`` maps each
    ended workload to whether it succeeded; a workload not in it has not ended."""
    if kind not in AFTER_KINDS:
        raise ValueError(f"after_kind: expected one of {', '.join(AFTER_KINDS)}, got {kind!r}")
    outcomes = [finished.get(d) for d in after]
    if kind == "afterok" and any(o is False for o in outcomes):
        return NEVER
    if any(o is None for o in outcomes):
        return WAIT
    if kind == "afternotok" and after and all(outcomes):
        return NEVER
    return READY


def unmet(after: Sequence[str], kind: str, finished: Mapping[str, bool]) -> list[str]:
    """The workloads ``after`` that still have to end (in their order)."""
    return [d for d in after if d not in finished] if kind in AFTER_KINDS else list(after)


def why_waiting(after: Sequence[str], kind: str, finished: Mapping[str, bool]) -> str:
    """What a researcher reads while the job waits: ``waiting for train-7 to succeed``."""
    left = unmet(after, kind, finished)
    verb = {"afterok": "to succeed", "afterany": "to end", "afternotok": "to end (and one to "
            "fail)"}.get(kind, "to end")
    if not left:
        return ""
    names = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
    return f"waiting for {names} {verb}"


def why_never(after: Sequence[str], kind: str, finished: Mapping[str, bool]) -> str:
    """Why a dependent job is cancelled: its condition can no longer hold."""
    if kind == "afterok":
        failed = [d for d in after if finished.get(d) is False]
        return (f"cancelled: it ran only after {', '.join(after)} succeeded, and "
                f"{', '.join(failed)} did not succeed")
    return (f"cancelled: it ran only if one of {', '.join(after)} did not succeed, and all "
            "succeeded")


def runnable(pending: Sequence[Workload], running: Iterable[Workload],
             finished: Mapping[str, bool]) -> Sequence[Workload]:
    """The pending work a cycle may consider: each array's tasks only up to its cap (its
    running tasks counted; the earliest submitted first, by index), and dependent work only
    once its condition holds. ``pending`` itself when nothing is held (no copy)."""
    if not any(w.array is not None or w.after for w in pending):
        return pending
    room: dict[str, int] = {}
    for w in pending:
        if w.array is not None and w.array_max > 0:
            room[w.array] = w.array_max
    for w in running:
        if w.array in room:
            room[w.array] -= 1
    held: set[str] = set()
    # tasks of one array were submitted together; their ids differ only in the index suffix
    # (``<array>_<index>``): shorter first puts task 2 before task 10
    for w in sorted(pending, key=lambda w: (w.submitted_at, len(w.id), w.id)):
        if w.after and dependency(w.after, w.after_kind, finished) != READY:
            held.add(w.id)
        elif w.array in room:
            if room[w.array] <= 0:
                held.add(w.id)
            else:
                room[w.array] -= 1
    return [w for w in pending if w.id not in held]
