"""Containment: every batch job and notebook session runs in its own cgroup v2 directory, and
"has it ended?" means "is its cgroup empty?".

A process group is not a container: a job that calls ``setsid`` (or double-forks into a new
session) leaves its group, and ending the group leaves it running as the user on a GPU the
scheduler has given to someone else. A cgroup holds every descendant whatever it does with
sessions and groups, a user cannot move a process out of it (``cgroup.procs`` is root's), and
``cgroup.kill`` ends all of it at once. The privileged side (the launcher, the hub's spawner
as root) makes the cgroup and moves the child into it before it execs the user's program.

Layout: ``<root>/job.<workload>.<attempt>`` and ``<root>/session.<uid>.<random>``, where the
root is configured (launcher config ``cgroup_root``; ``cgroup_root`` traits) or, when empty,
``gpubudget`` under the first cgroup2 mount in ``/proc/self/mountinfo`` (``/sys/fs/cgroup`` on
a pure cgroup v2 host, ``/sys/fs/cgroup/unified`` on a hybrid one). Where no cgroup can be
made, nothing starts (``ContainmentError`` says why and what to configure); containment can
only be turned off explicitly, which is unsafe. Standard library only: the launcher runs as
root.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

#: the project's subtree under the cgroup2 mount when no root is configured
SUBTREE = "gpubudget"
#: a cgroup name made here: letters, digits and ``_.@+-`` (workload ids, uids, hex)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,254}$")

OFF_HINT = ("set cgroup_root to a cgroup v2 directory the launcher (root) may write, e.g. a "
            "delegated subtree; turning containment off (contain: false) is UNSAFE: a job's "
            "processes that leave their process group then outlive it on the GPU")


class ContainmentError(Exception):
    """No cgroup could be made or used for a job or session: it does not start."""


# ---------------------------------------------------------------------------- pure helpers
def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup2_mounts(mountinfo: str) -> list[str]:
    """The mount points of the cgroup2 filesystems in a ``/proc/<pid>/mountinfo`` text, in
    order (the filesystem type follows the ``-`` separator)."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        if len(fields) >= 5 and right.split()[:1] == ["cgroup2"]:
            out.append(_unescape(fields[4]))
    return out


def default_root(mountinfo: str) -> str | None:
    """``<first cgroup2 mount>/gpubudget``, or None when there is no cgroup2 mount."""
    mounts = cgroup2_mounts(mountinfo)
    return os.path.join(mounts[0], SUBTREE) if mounts else None


def job_name(workload: str, attempt: int) -> str:
    """The cgroup of a job's attempt (workload ids never hold '/')."""
    name = f"job.{workload}.{int(attempt)}"
    if not NAME.fullmatch(name):
        raise ContainmentError(f"workload {workload!r}: not usable as a cgroup name")
    return name


def session_name(uid: int, token: str) -> str:
    name = f"session.{int(uid)}.{token}"
    if not NAME.fullmatch(name):
        raise ContainmentError(f"session token {token!r}: not usable as a cgroup name")
    return name


def parse_events(text: str) -> dict[str, int]:
    """``cgroup.events`` (``populated 1\\nfrozen 0``) as a mapping."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def parse_procs(text: str) -> list[int]:
    """``cgroup.procs``: one pid a line."""
    return [int(x) for x in text.split() if x.isdigit()]


# ---------------------------------------------------------------------------- the cgroup fs
def find_root(configured: str = "", mountinfo: str | None = None) -> Path:
    """The root of the project's subtree: ``configured`` (absolute) or the default."""
    if configured:
        if not os.path.isabs(configured):
            raise ContainmentError(f"cgroup_root: {configured!r} is not an absolute path")
        return Path(os.path.normpath(configured))
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError as e:
            raise ContainmentError(f"cannot read /proc/self/mountinfo ({e.strerror})") from None
    root = default_root(mountinfo)
    if root is None:
        raise ContainmentError(f"no cgroup v2 filesystem is mounted; {OFF_HINT}")
    return Path(root)


def _is_cgroup_dir(path: Path) -> bool:
    return (path / "cgroup.procs").is_file()


def prepare(root: Path, name: str) -> Path:
    """Make (or reuse, when empty) ``<root>/<name>`` and return it; the root is made too.
    Raises ContainmentError with what to do when it cannot be made or is not a cgroup."""
    if not NAME.fullmatch(name):
        raise ContainmentError(f"{name!r}: not usable as a cgroup name")
    try:
        if not os.path.isdir(root):
            os.makedirs(root, 0o755, exist_ok=True)
            os.chmod(root, 0o755)  # (whatever the umask) the service reads cgroup.events
    except OSError as e:
        raise ContainmentError(f"cgroup root {root} cannot be made ({e.strerror}); "
                               f"{OFF_HINT}") from None
    if not _is_cgroup_dir(root):
        raise ContainmentError(f"cgroup root {root} is not in a cgroup v2 filesystem; "
                               f"{OFF_HINT}")
    cg = root / name
    try:
        os.mkdir(cg, 0o755)
        os.chmod(cg, 0o755)
    except FileExistsError:
        if populated(cg):
            raise ContainmentError(f"cgroup {cg} already holds processes") from None
    except OSError as e:
        raise ContainmentError(f"cgroup {cg} cannot be made ({e.strerror}); {OFF_HINT}") \
            from None
    if not os.access(cg / "cgroup.procs", os.W_OK):
        raise ContainmentError(f"cgroup {cg}: cgroup.procs is not writable; {OFF_HINT}")
    return cg


def join(cg: Path, pid: int | None = None) -> None:
    """Move ``pid`` (default: this process) into the cgroup. Safe after fork (no allocation
    beyond a small write)."""
    fd = os.open(os.path.join(cg, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(os.getpid() if pid is None else pid).encode())
    finally:
        os.close(fd)


def populated(cg: Path | str) -> bool:
    """Whether any process is left in the cgroup (a cgroup that is gone holds none). Other
    errors (a root the reader may not traverse) are raised: they say nothing of the job."""
    try:
        text = Path(cg, "cgroup.events").read_text()
    except FileNotFoundError:
        return False
    return bool(parse_events(text).get("populated", 0))


def pids(cg: Path | str) -> list[int]:
    try:
        return parse_procs(Path(cg, "cgroup.procs").read_text())
    except FileNotFoundError:
        return []


def signal_all(cg: Path | str, sig: int) -> None:
    """Send ``sig`` to every process in the cgroup (SIGTERM before the kill)."""
    for pid in pids(cg):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill(cg: Path | str) -> None:
    """SIGKILL everything in the cgroup: ``cgroup.kill`` (Linux 5.14) where it exists (it
    also catches processes forking while it runs), else each listed process."""
    try:
        fd = os.open(os.path.join(cg, "cgroup.kill"), os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        if os.path.isdir(cg):
            signal_all(cg, signal.SIGKILL)
        return
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)


def wait_empty(cg: Path | str, timeout: float | None = None, every: float = 0.02) -> bool:
    """Wait until the cgroup is empty, killing what is left every second; False when
    ``timeout`` seconds passed first (None: wait for ever: a process in uninterruptible
    sleep ends when the kernel lets it)."""
    start = time.monotonic()
    killed = start
    while populated(cg):
        now = time.monotonic()
        if timeout is not None and now - start >= timeout:
            return False
        if now - killed >= 1.0:
            kill(cg)
            killed = now
        time.sleep(every)
    return True


def end(cg: Path | str, timeout: float | None = None) -> bool:
    """Kill everything in the cgroup, wait until it is empty, remove it. False when it was
    not empty within ``timeout`` (it is kept)."""
    kill(cg)
    if not wait_empty(cg, timeout):
        return False
    remove(cg)
    return True


def remove(cg: Path | str) -> None:
    try:
        os.rmdir(cg)
    except OSError:
        pass  # gone, or (EBUSY) a process slipped in: it is found populated next time
