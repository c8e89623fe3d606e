"""What the DEMO hub (``make run``, ``gpubudget hub``) sets up on the machine when it runs as
root, so that nothing of it runs as root but the hub itself and the small launcher:

- the service's Unix user (``gpubudget``, a system account with its own group) runs the
  gpubudget service; its ledger lives in ``<state>/service`` (0700, its own);
- one Unix account per demo user (``demo-<name>``) runs that user's notebook servers and
  batch jobs; each checkout gives them homes of its own, ``/home/gpubudget-demo-<key>/<account>``
  (0700, the account's, ``<key>`` a hash of the checkout's path: :func:`demo_home_root`), so
  two checkouts never share a lab layout or files, and whatever an earlier run left there that
  is not the account's own (a file root wrote) is given back to the account at start;
- the launcher's root-owned config (``<state>/launcher.json``) and a sudoers drop-in that lets
  the service user run exactly ``<python> -I -m jupyter_gpubudget.launcher --config
  <state>/launcher.json *`` as root.

``clean_demo`` (``make clean-demo``, ``python -m jupyter_gpubudget.hub.demo_setup clean``)
removes what this checkout's demo made: the users' accounts and their homes, the sudoers
drop-in, the service's account and the users' group. The names can be changed through the
environment (``GPUBUDGET_DEMO_PREFIX``, ``GPUBUDGET_DEMO_SERVICE_USER``,
``GPUBUDGET_DEMO_USERS_GROUP``, ``GPUBUDGET_DEMO_HOMES``: the tests' demos use their own).

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
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path


def _name(var: str, default: str) -> str:
    """A Unix name from the environment (the tests' demos use their own), checked."""
    value = os.environ.get(var) or default
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,23}", value):
        raise SystemExit(f"{var}={value!r}: expected a Unix name (lower-case letters, digits, "
                         "'-' and '_', at most 24)")
    return value


SERVICE_USER = _name("GPUBUDGET_DEMO_SERVICE_USER", "gpubudget")
DEMO_PREFIX = _name("GPUBUDGET_DEMO_PREFIX", "demo-")
SUDOERS_DIR = Path("/etc/sudoers.d")
CHECKOUT = Path(__file__).resolve().parents[2]


def demo_home_root(checkout: Path = CHECKOUT) -> Path:
    """Where this checkout's demo users have their homes: ``/home/gpubudget-demo-<key>``,
    ``<key>`` the first 10 hex digits of the SHA-256 of the checkout's path
    (``GPUBUDGET_DEMO_HOMES`` overrides it)."""
    if os.environ.get("GPUBUDGET_DEMO_HOMES"):
        return Path(os.environ["GPUBUDGET_DEMO_HOMES"]).resolve()
    key = hashlib.sha256(str(Path(checkout).resolve()).encode()).hexdigest()[:10]
    return Path("/home") / f"gpubudget-demo-{key}"


def give_back(home: Path, pw: pwd.struct_passwd) -> list[str]:
    """Every entry under ``home`` not owned by the account becomes the account's (root wrote
    it in an earlier run: the user could not change or remove it). Links are never followed
    (``lchown``), nothing outside ``home`` is touched. Returns the paths changed."""
    changed = []
    for dirpath, dirnames, filenames in os.walk(home, followlinks=False):
        for n in [*dirnames, *filenames]:
            p = os.path.join(dirpath, n)
            try:
                st = os.lstat(p)
                if st.st_uid != pw.pw_uid:
                    os.lchown(p, pw.pw_uid, pw.pw_gid)
                    changed.append(p)
            except OSError:
                pass
    return changed


def ensure_demo_home(root: Path, pw: pwd.struct_passwd) -> Path:
    """The account's home of this checkout's demo, ``root/<account>`` (0700, its own; root
    itself 0755, root's), with nothing in it owned by another account."""
    if root.is_symlink():
        raise RuntimeError(f"{root} is a symbolic link; the demo will not put homes there")
    root.mkdir(parents=True, exist_ok=True)
    os.chown(root, 0, 0)
    os.chmod(root, 0o755)
    home = root / pw.pw_name
    if home.is_symlink():
        raise RuntimeError(f"{home} is a symbolic link; the demo will not use it as a home")
    home.mkdir(exist_ok=True)
    os.chown(home, pw.pw_uid, pw.pw_gid)
    os.chmod(home, 0o700)
    give_back(home, pw)
    return home


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


def ensure_user(name: str, service_group: str = SERVICE_USER,
                home_root: Path | None = None) -> pwd.struct_passwd:
    """A regular account (uid >= 1000) with a home it owns (0700), never in the service's
    group; a new account's home is ``home_root/<name>`` where given."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        where = ["--home-dir", str(home_root / name)] if home_root is not None else []
        _run(["useradd", "--create-home", *where, "--user-group", "--shell", "/bin/bash",
              name], ok=(0, 9))
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
                    allowed_groups: list[str] | None = None, workdir: str = "{home}") -> Path:
    """The launcher's config, owned by root, readable by all (it holds no secret). Jobs find
    the demo's Python environment first on their PATH (``python``, ``gpubudget``).
    ``allowed_groups``: jobs run only as members of these (the demo passes its users' group:
    without it the service's account could start a job as any account with uid >= 1000)."""
    path = state / "launcher.json"
    tmp = state / ".launcher.json.tmp"
    cfg: dict = {"jobs_root": str(jobs_root), "group": group, "min_uid": 1000,
                 "workdir": workdir}
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
USERS_GROUP = _name("GPUBUDGET_DEMO_USERS_GROUP", "gpubudget-users")


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


def sudoers_path(config: Path) -> Path:
    """The demo's sudoers drop-in for the launcher config ``config`` (one per state
    directory)."""
    return SUDOERS_DIR / ("gpubudget-" + hashlib.sha256(str(config).encode()).hexdigest()[:12])


def install_sudoers(user: str, python: str, config: Path, users_group: str | None = None
                    ) -> Path:
    """A drop-in in /etc/sudoers.d (checked with visudo first), removed when the hub exits."""
    line = sudoers_line(user, python, config)
    if users_group:
        line += "\n" + snapshot_sudoers_line(users_group, python)
    path = sudoers_path(config)
    name = path.name
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


def _userdel(name: str) -> str:
    """Remove an account (its group with it); '' when done or absent, else why not."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        return ""
    r = subprocess.run(["userdel", name], capture_output=True, text=True)
    return "" if r.returncode == 0 else f"{name}: {(r.stderr or '').strip() or r.returncode}"


def _owned_by(uid: int, pw: pwd.struct_passwd | None, ours: bool) -> bool:
    """Whether a home owned by ``uid`` is the demo account ``pw``'s to remove: its own, or
    (in this checkout's home root only) one whose account is gone."""
    if pw is not None:
        return uid == pw.pw_uid
    if not ours:
        return False
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return True
    return False


def clean_demo(users: list[str], state: Path, home_root: Path | None = None,
               shared: bool = True) -> list[str]:
    """Remove what the demo made for ``users`` (hub user names) from the state directory
    ``state``: the accounts ``<prefix><user>`` with their homes below ``home_root`` (this
    checkout's, :func:`demo_home_root`), the sudoers drop-in, and with ``shared`` the
    service's account and the users' group. An account still running processes is left
    and said. Returns what could not be removed (empty: all done)."""
    if os.geteuid() != 0:
        return ["not root: the demo's accounts and drop-ins can only be removed as root"]
    root = home_root or demo_home_root()
    problems = []
    for u in sorted(users):
        name = DEMO_PREFIX + u
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            pw = None
        if pw is not None and pw.pw_uid < 1000:
            problems.append(f"{name}: a system account (uid {pw.pw_uid}), not the demo's: kept")
            continue
        why = _userdel(name)
        if why:
            problems.append(why)
            continue
        for home in {root / name, *([Path(pw.pw_dir)] if pw is not None else [])}:
            # only a home the account owned: never another account's or a shared folder.
            # The accounts are the machine's and the homes each checkout's: once another
            # checkout's clean removed the account, this checkout's home of it belongs to a
            # uid no account has, and is removed as well
            if home.is_dir() and not home.is_symlink() and \
                    _owned_by(os.lstat(home).st_uid, pw, home == root / name):
                shutil.rmtree(home, ignore_errors=True)
    if root.is_dir() and not root.is_symlink() and not any(root.iterdir()):
        root.rmdir()
    drop_in = sudoers_path(state / "launcher.json")
    if drop_in.exists():
        drop_in.unlink()
    if shared:
        why = _userdel(SERVICE_USER)
        if why:
            problems.append(why)
        try:
            grp.getgrnam(USERS_GROUP)
            r = subprocess.run(["groupdel", USERS_GROUP], capture_output=True, text=True)
            if r.returncode != 0:
                problems.append(f"{USERS_GROUP}: {(r.stderr or '').strip()}")
        except KeyError:
            pass
    return problems


def main(argv: list[str] | None = None) -> int:
    """``python -m jupyter_gpubudget.hub.demo_setup clean [--dir STATE] [--budgets FILE]``."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m jupyter_gpubudget.hub.demo_setup")
    p.add_argument("action", choices=["clean"])
    p.add_argument("--dir", default=".gpubudget-hub", help="the demo's state directory")
    p.add_argument("--budgets", default=str(CHECKOUT / "examples" / "budgets-demo.yaml"))
    p.add_argument("--keep-shared", action="store_true",
                   help="keep the service's account and the users' group")
    a = p.parse_args(argv)
    from jupyter_gpubudget.core.accounts import load_budgets

    budgets = load_budgets(Path(a.budgets).read_bytes(), a.budgets)
    users = set(budgets.admins)
    for acc in budgets.accounts.accounts.values():
        users |= set(acc.members) | set(acc.managers)
    problems = clean_demo(sorted(users), Path(a.dir).resolve(), shared=not a.keep_shared)
    for line in problems:
        print(f"clean-demo: not removed: {line}", file=sys.stderr)
    if not problems:
        print(f"clean-demo: removed the demo's accounts ({DEMO_PREFIX}<user>, {SERVICE_USER}), "
              f"homes ({demo_home_root()}), group {USERS_GROUP} and sudoers drop-in")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
