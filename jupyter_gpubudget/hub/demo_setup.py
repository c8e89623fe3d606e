"""What the DEMO hub (``make run``, ``gpubudget hub``) sets up on the machine when it runs as
root, so that nothing of it runs as root but the hub itself and the small launcher:

- the service's Unix user (``gpubudget``, a system account with its own group) runs the
  gpubudget service; its ledger lives in ``<state>/service`` (0700, its own);
- one Unix account per demo user (``demo-<name>``, home ``/home/demo-<name>``, 0700) runs
  that user's notebook servers and batch jobs;
- the launcher's root-owned config (``<state>/launcher.json``) and a sudoers drop-in that lets
  the service user run exactly ``<python> -I -m jupyter_gpubudget.launcher --config
  <state>/launcher.json *`` as root.

``isolation_problem`` says why this cannot be done (the hub is not root, or a path the other
accounts need is not reachable by them); the demo then runs everything as the invoking user
and says so. Production hubs do these steps once, by hand or with configuration management
(docs/service.md, "Security model").
"""

from __future__ import annotations

import atexit
import grp
import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

SERVICE_USER = "gpubudget"
DEMO_PREFIX = "demo-"
SUDOERS_DIR = Path("/etc/sudoers.d")


def reachable(path: Path, execute: bool = False) -> str | None:
    """None if any user can read ``path`` (and run it with ``execute``), else the first
    component that stops them."""
    for p in {Path(os.path.abspath(path)), Path(path).resolve()}:
        for d in reversed(p.parents):
            try:
                if not os.stat(d).st_mode & stat.S_IXOTH:
                    return str(d)
            except OSError:
                return str(d)
        try:
            mode = os.stat(p).st_mode
        except OSError:
            return str(p)
        need = stat.S_IROTH | (stat.S_IXOTH if execute or stat.S_ISDIR(mode) else 0)
        if mode & need != need:
            return str(p)
    return None


def isolation_problem(paths: list[Path], python: str = sys.executable,
                      state: Path | None = None) -> str | None:
    """Why the demo cannot run its service and users as separate accounts, or None.
    ``paths`` must be readable by every account; ``state`` (the hub's state directory) must
    be controlled by root alone."""
    if os.geteuid() != 0:
        return "the hub is not running as root"
    for exe in ("useradd", "groupadd", "sudo"):
        if shutil.which(exe) is None:
            return f"{exe} is not installed"
    for p, execute in [(Path(python), True), *((q, False) for q in paths)]:
        stop = reachable(p, execute)
        if stop is not None:
            return (f"{p} is not reachable by other Unix users ({stop} is not readable or "
                    "searchable by others); put the checkout and its .venv where other "
                    "accounts can read them")
    if state is not None:
        from jupyter_gpubudget.launcher.config import LauncherError, secure_path

        try:  # the launcher writes job records only below directories root alone controls
            secure_path(state / "jobs", "the state directory")
        except LauncherError as e:
            return str(e)
    return None


def _run(cmd: list[str], ok: tuple[int, ...] = (0,)) -> int:
    for _ in range(60):  # another process may hold the lock on /etc/passwd
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode in ok:
            return r.returncode
        if r.returncode != 10 and "lock" not in (r.stderr or "").lower():
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip() or r.returncode}")
        time.sleep(0.5)
    raise RuntimeError(f"{' '.join(cmd)}: /etc/passwd stayed locked")


def ensure_service_user(name: str = SERVICE_USER) -> pwd.struct_passwd:
    """The service's system account and group (no login, no home)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    _run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir",
          "/nonexistent", "--shell", "/usr/sbin/nologin", name], ok=(0, 9))
    return pwd.getpwnam(name)


def ensure_user(name: str, service_group: str = SERVICE_USER) -> pwd.struct_passwd:
    """A regular account (uid >= 1000) with a home it owns (0700), never in the service's
    group."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        _run(["useradd", "--create-home", "--user-group", "--shell", "/bin/bash", name],
             ok=(0, 9))
        pw = pwd.getpwnam(name)
    if pw.pw_uid < 1000 or pw.pw_uid == 0:
        raise RuntimeError(f"{name} exists as a system account (uid {pw.pw_uid}); the demo will "
                           "not run anything as it")
    try:
        if name in grp.getgrnam(service_group).gr_mem:
            raise RuntimeError(f"{name} is in the service's group {service_group}")
    except KeyError:
        pass
    home = Path(pw.pw_dir)
    if not home.is_dir():
        home.mkdir(parents=True, exist_ok=True)
        os.chown(home, pw.pw_uid, pw.pw_gid)
    if os.lstat(home).st_uid == pw.pw_uid:
        os.chmod(home, 0o700)
    return pw


def private_dir(path: Path, uid: int, gid: int, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def move_old_ledger(state: Path, service_dir: Path, owner: pwd.struct_passwd) -> None:
    """A state directory from before the service had its own user kept the ledger at
    ``<state>/ledger.sqlite``: move it (with -wal/-shm) into the service's directory."""
    old, new = state / "ledger.sqlite", service_dir / "ledger.sqlite"
    if not old.exists() or new.exists():
        return
    for suffix in ("", "-wal", "-shm"):
        src = state / f"ledger.sqlite{suffix}"
        if src.exists():
            dst = service_dir / src.name
            os.replace(src, dst)
            os.chown(dst, owner.pw_uid, owner.pw_gid)
            os.chmod(dst, 0o600)


def launcher_config(state: Path, jobs_root: Path, group: str, bin_dir: Path | None = None,
                    allowed_groups: list[str] | None = None) -> Path:
    """The launcher's config, owned by root, readable by all (it holds no secret). Jobs find
    the demo's Python environment first on their PATH (``python``, ``gpubudget``).
    ``allowed_groups``: jobs run only as members of these (the demo passes its users' group:
    without it the service's account could start a job as any account with uid >= 1000)."""
    path = state / "launcher.json"
    tmp = state / ".launcher.json.tmp"
    cfg: dict = {"jobs_root": str(jobs_root), "group": group, "min_uid": 1000,
                 "workdir": "{home}"}
    if allowed_groups:
        cfg["allowed_groups"] = list(allowed_groups)
    if bin_dir is not None:
        cfg["path"] = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"
    tmp.write_text(json.dumps(cfg, indent=2) + "\n")
    os.chown(tmp, 0, 0)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


#: the demo users' group: their notebook servers may run the CRIU steps of a snapshot as root
#: (the privileged side acts only on the caller's own kernels; docs/snapshot.md)
USERS_GROUP = "gpubudget-users"


def sudoers_line(user: str, python: str, config: Path) -> str:
    """The one command the service user may run as root."""
    return (f"{user} ALL=(root) NOPASSWD: {python} -I -m jupyter_gpubudget.launcher "
            f"--config {config} *")


def snapshot_sudoers_line(group: str, python: str) -> str:
    """What the users' servers may run as root: the snapshot module's CRIU verbs. A server
    calls them with its own interpreter, which the environment's scripts name ``python3``
    where the hub runs as ``python``: both spellings of the same environment's interpreter
    are allowed (sudo compares the path as written)."""
    spellings = [python]
    here = os.path.dirname(python)
    for name in ("python", "python3", f"python3.{sys.version_info[1]}"):
        alt = os.path.join(here, name)
        if alt not in spellings and os.path.exists(alt) and \
                os.path.realpath(alt) == os.path.realpath(python):
            spellings.append(alt)
    cmds = ", ".join(f"{p} -I -m jupyter_gpubudget.snapshot.privileged *" for p in spellings)
    return f"%{group} ALL=(root) NOPASSWD: {cmds}"


def ensure_users_group(members: list[str], group: str = USERS_GROUP) -> None:
    try:
        grp.getgrnam(group)
    except KeyError:
        _run(["groupadd", "--system", group], ok=(0, 9))
    have = set(grp.getgrnam(group).gr_mem)
    for m in members:
        if m not in have:
            _run(["usermod", "-aG", group, m])


def install_sudoers(user: str, python: str, config: Path, users_group: str | None = None
                    ) -> Path:
    """A drop-in in /etc/sudoers.d (checked with visudo first), removed when the hub exits."""
    line = sudoers_line(user, python, config)
    if users_group:
        line += "\n" + snapshot_sudoers_line(users_group, python)
    name = "gpubudget-" + hashlib.sha256(str(config).encode()).hexdigest()[:12]
    path = SUDOERS_DIR / name
    text = (f"# gpubudget demo hub ({config.parent}): the service may run the launcher as "
            f"root; the users' servers the CRIU steps of their own snapshots\n{line}\n")
    SUDOERS_DIR.mkdir(exist_ok=True)
    tmp = SUDOERS_DIR / f".{name}.tmp"  # names with a '.' are ignored by sudo
    tmp.write_text(text)
    os.chmod(tmp, 0o440)
    if shutil.which("visudo"):
        r = subprocess.run(["visudo", "-c", "-q", "-f", str(tmp)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            tmp.unlink()
            raise RuntimeError(f"sudoers line refused by visudo: {r.stdout}{r.stderr}")
    os.replace(tmp, path)

    def remove() -> None:
        try:
            if path.read_text() == text:
                path.unlink()
        except OSError:
            pass

    atexit.register(remove)
    return path
