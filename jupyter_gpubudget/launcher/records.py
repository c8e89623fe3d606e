"""The records the launcher keeps for each attempt, and how they are read back.

``<jobs_root>/<workload>/<attempt>/``, owned by root (by the service's user without
privileges), group the service's group, mode 0750 (0700 without a group):

- ``pid``: JSON ``{"pid", "pgid", "start", "uid", "user", "monitor_pid", "monitor_start",
  "launched_at", "time_limit"}``, written once the job's process exists;
- ``exit``: JSON ``{"exit_code", "ended_at", "timed_out", "signal"}``, written by the
  monitor when the job's process group has ended;
- ``output.log``: the job's stdout and stderr; ``launcher.log``: the monitor's own notes.

Files are 0640 (0600 without a group). The job's user can read none of them and write none:
a job cannot forge its exit (that would stop its charge while it keeps the GPU) nor point the
launcher at another process. Standard library only (the launcher runs as root).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def proc_starttime(pid: int) -> str | None:
    """The process's start time (clock ticks after boot) from /proc, or None when it does not
    exist or is a zombie. A pid with the recorded start time is the process recorded."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return fields[19]


def proc_uid(pid: int) -> int | None:
    """The real uid of a process, or None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def modes(gid: int | None) -> tuple[int, int]:
    """(directory mode, file mode): readable by the service's group when there is one."""
    return (0o750, 0o640) if gid is not None else (0o700, 0o600)


def make_dir(path: Path, gid: int | None) -> None:
    """Create ``path`` (one level) with the records' mode and group; it must not exist."""
    dmode, _ = modes(gid)
    os.mkdir(path, dmode)
    if gid is not None and os.geteuid() == 0:
        os.chown(path, 0, gid)
    os.chmod(path, dmode)  # whatever the umask


def ensure_dir(path: Path, gid: int | None) -> None:
    """Create ``path`` if missing, and give it the records' owner, group and mode."""
    try:
        make_dir(path, gid)
    except FileExistsError:
        dmode, _ = modes(gid)
        if path.is_symlink() or not path.is_dir():
            raise
        if os.geteuid() == 0:
            os.chown(path, 0, gid if gid is not None else 0)
        os.chmod(path, dmode)


def create_file(path: Path, gid: int | None) -> int:
    """A new file for writing (never an existing one, never through a link); returns the fd."""
    _, fmode = modes(gid)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND
                 | os.O_CLOEXEC, fmode)
    if gid is not None and os.geteuid() == 0:
        os.fchown(fd, 0, gid)
    os.fchmod(fd, fmode)
    return fd


def write_record(path: Path, obj: Any, gid: int | None) -> None:
    """Write a JSON record atomically (a temporary file renamed over the name)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = create_file(tmp, gid)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(obj))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_record(path: Path, trusted_uid: int | None = None) -> dict | None:
    """A record's JSON, or None when it is missing or unreadable. With ``trusted_uid``, a
    record not owned by that uid, or writable by anyone but its owner, is ignored."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if trusted_uid is not None:
            st = os.fstat(f.fileno())
            if st.st_uid != trusted_uid or st.st_mode & 0o022:
                return None
        try:
            obj = json.loads(f.read(65536))
        except ValueError:
            return None
    return obj if isinstance(obj, dict) else None
