"""``notify WORKLOAD ATTEMPT SIGNAL``: send a running attempt's processes the signal its job
asked for ahead of a likely preemption (``warn_signal``), and nothing else: it is not
stopped, and no other process is touched.

Only the signals a job may ask for (USR1, USR2, INT, TERM, HUP); only an attempt this
launcher started, while its job is still the process recorded (same start time and user:
``jobs._running_job``); the job's process group, and every process of its cgroup.
"""

from __future__ import annotations

import signal
from typing import BinaryIO

from . import cgroups
from .config import LauncherConfig, LauncherError
from .jobs import _attempt_args, _job_note, _kill, _running_job

#: the signals a job may ask for (service/preempt_warning.py: WARN_SIGNALS)
ALLOWED = ("USR1", "USR2", "INT", "TERM", "HUP")


def notify_job(cfg: LauncherConfig, args: list[str], stdin: BinaryIO) -> dict:
    wid, attempt_s, adir = _attempt_args(cfg, args, 3, "notify WORKLOAD ATTEMPT SIGNAL")
    name = args[2]
    if name not in ALLOWED:
        raise LauncherError(f"notify: the signal is one of {', '.join(ALLOWED)}")
    job = _running_job(adir, wid, attempt_s)
    if job is None:
        return {"notified": False, "reason": "not running"}
    sig = getattr(signal, f"SIG{name}")
    _job_note(adir, f"likely to be preempted soon: SIG{name} sent so that the job saves "
                    "its work")
    _kill(job["pid"], sig)  # its group (a new session: pgid = pid)
    if job["cgroup"]:
        cgroups.signal_all(job["cgroup"], sig)
    return {"notified": True, "signal": name}
