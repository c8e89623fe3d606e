"""The privileged part of the CRIU backend: plain functions, standard library only.

These run as root (and start CRIU as root only for a root caller: below), called in-process
when the caller is root, otherwise through a privileged launcher
(``python -m jupyter_gpubudget.snapshot.privileged criu-dump|criu-restore|criu-check`` via
sudo; :mod:`.privcall` builds that command). Every argument is checked here, since the caller
is less privileged than this code: the pid must be a kernel process (a session leader, as
kernels started independent are) owned by the expected user, the images directory an absolute
path.

A caller that reached root through sudo (``$SUDO_UID``) or a setuid launcher (real uid not 0)
is *unprivileged*, and then: it may only dump, resume or kill its own processes (its uid
overrides any ``expect_uid``); dump images are written into a fresh directory this code
creates (never one the caller names) and handed to the caller; and every dump is **sealed**:
an HMAC (key readable by root only, :data:`SEAL_KEY`) over the caller's uid and each image's
SHA-256. A restore for an unprivileged caller copies the images into a private directory,
checks the seal on that copy and restores from it, so only images this code dumped, of the
caller's own processes, unchanged, are ever restored. Nodes that restore each other's
snapshots need the same key.

**CRIU itself never runs as root for an unprivileged caller.** Its dumps and restores run in
CRIU's unprivileged mode (``--unprivileged``) with the caller's own uid, gid and groups and one
capability, ``CAP_CHECKPOINT_RESTORE`` (:func:`user_criu_argv`, through util-linux's
``setpriv``): every file a restored process gets is opened by the kernel's rules for the
caller's account, so a name that becomes a symlink to root's file between any check of ours and
CRIU's open (a ``renameat2(RENAME_EXCHANGE)`` loop) gets ``EACCES``, not root's file. The
capability only lets CRIU pick process ids and read its own processes' mappings; the caller
cannot trace CRIU while it holds it (its capabilities are not the caller's) nor reach the
images' directory, which lies under one only root may enter. The restored tasks end with the
credentials of their images (the caller's, no capabilities: checked before the dump is handed
out and again on the restored tree). What that mode cannot do is refused or left out:

- established TCP connections need ``CAP_NET_ADMIN`` (``TCP_REPAIR``): they are dumped and
  restored **closed** (``--tcp-close``); listening sockets come back as they were. A Jupyter
  kernel only listens on its ZMQ ports: its clients reconnect, as they do after any restart.
- no other capability is given, so anything else CRIU needs root for (another account's
  process, a namespace or cgroup of its own) fails with CRIU's own error.

Root callers (the service running as root, the in-process path) dump with CRIU as root, with
``--tcp-established --network-lock nftables``; their restore of one account's kernel (every task
of the images that account's, no capabilities) runs CRIU as that account all the same (the
account could race root's open of its own names just as well), and only root's own trees are
restored by CRIU as root.

CRIU >= 4.1 is needed on recent kernels (older ones fail on the vDSO); ``find_criu`` looks for
it: ``$GPUBUDGET_CRIU``, then the build cache of ``.ci/build-criu.sh``, then ``PATH``.
GPU memory is captured only with NVIDIA's ``cuda-checkpoint`` (whole GPUs; not MIG), found the
same way (``$GPUBUDGET_CUDA_CHECKPOINT``, then ``PATH``); a kernel holding a GPU without it is
refused with reason ``gpu_state`` rather than dumped half.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable

NETWORK_LOCK = "nftables"
MIN_VERSION = (4, 1)
#: the key that seals dump images for unprivileged callers (created on first use, mode 0600)
SEAL_KEY = "/var/lib/jupyter-gpubudget/criu-seal.key"


class CriuError(Exception):
    """``reason``: ``no_criu``, ``bad_input``, ``not_a_kernel``, ``gpu_state``, ``pid_in_use``,
    ``unsafe`` (a tree or images that would give the caller what its account may not have),
    ``dump_failed``, ``restore_failed``; ``log`` holds the tail of CRIU's log."""

    def __init__(self, reason: str, message: str, log: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.log = log


def _cache_dir() -> str:
    return os.environ.get("GPUBUDGET_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "jupyter-gpubudget")


def criu_version(binary: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Version:\s*([0-9.]+)", out)
    return tuple(int(x) for x in m.group(1).split(".") if x) if m else None


def find_criu(explicit: str | None = None) -> str | None:
    """A CRIU binary that runs and is >= 4.1, or None: ``explicit``, ``$GPUBUDGET_CRIU``, the
    newest build of ``.ci/build-criu.sh`` in the cache, the PATH."""
    import glob
    import pwd

    caches = {_cache_dir()}
    try:  # the account's own home too ($HOME may be a user's, e.g. in a server run as root)
        caches.add(os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".cache", "jupyter-gpubudget"))
    except KeyError:
        pass
    built = sorted((p for c in caches
                    for p in glob.glob(os.path.join(c, "criu-4.1*", "tree", "criu", "criu"))),
                   key=lambda p: os.path.getmtime(p), reverse=True)
    cands = [explicit, os.environ.get("GPUBUDGET_CRIU"), *built, shutil.which("criu")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            v = criu_version(c)
            if v is not None and v >= MIN_VERSION:
                return c
    return None


def find_cuda_checkpoint() -> str | None:
    c = os.environ.get("GPUBUDGET_CUDA_CHECKPOINT") or shutil.which("cuda-checkpoint")
    return c if c and os.access(c, os.X_OK) else None


def uses_gpu(pid: int) -> bool:
    """Whether the process has an NVIDIA device open or the CUDA driver mapped (needs the
    right to read its /proc entries: root, or its owner)."""
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/nvidia"):
                    return True
            except OSError:
                continue
        with open(f"/proc/{pid}/maps") as f:
            return any("libcuda.so" in line for line in f)
    except (FileNotFoundError, PermissionError):
        return False


def caller_uid() -> int:
    """The account this code acts for: 0 when root called it directly, else the real uid of
    a setuid launch, else sudo's ``$SUDO_UID``."""
    if os.getuid() != 0:
        return os.getuid()
    raw = os.environ.get("SUDO_UID", "")
    return int(raw) if raw.isdigit() else 0


def caller_gids(uid: int) -> set[int]:
    """The groups an account's processes may hold (its primary group and its memberships)."""
    import pwd

    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return {uid}
    return set(os.getgrouplist(pw.pw_name, pw.pw_gid))


def _status_ids(pid: int) -> tuple[list[int], list[int], int, str]:
    """(uids, gids, permitted|effective capabilities, name) of a live process."""
    uids: list[int] = []
    gids: list[int] = []
    caps, name = 0, "?"
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key == "Uid":
                uids = [int(x) for x in val.split()]
            elif key == "Gid":
                gids = [int(x) for x in val.split()]
            elif key in ("CapPrm", "CapEff"):
                caps |= int(val.strip(), 16)
            elif key == "Name":
                name = val.strip()
    return uids, gids, caps, name


def tree_problems(pid: int, uid: int, gids: set[int]) -> list[str]:
    """Why the live tree at ``pid`` is not purely ``uid``'s: a process of another account, a
    set-id one (``sleep | passwd``), or one holding capabilities. Checked before a dump (a
    clear, early refusal); the dump's own images are checked again after it
    (:func:`.criuimages.foreign_tasks`), since the tree may change in between."""
    why = []
    for p in _tree(pid):
        try:
            uids, pgids, caps, name = _status_ids(p)
        except (OSError, ValueError):
            continue  # gone meanwhile
        if any(u != uid for u in uids):
            why.append(f"process {p} ({name}) runs with uids {'/'.join(map(str, uids))}, not "
                       f"{uid} (a setuid program or another account's process)")
        elif any(g not in gids for g in pgids):
            why.append(f"process {p} ({name}) runs with gids {'/'.join(map(str, pgids))} "
                       "(a setgid program)")
        elif caps:
            why.append(f"process {p} ({name}) holds capabilities")
    return why


def live_problems(pid: int, uid: int, gids: set[int],
                  handed: frozenset[tuple[int, int]] = frozenset()) -> list[str]:
    """Why the restored (still stopped) tree at ``pid`` holds more than ``uid`` may: another
    account's credentials, or an open or mapped file its account could not open as it is
    open now (a name that became a symlink or another file between the snapshot and the
    restore, reopened by CRIU by name). For an unprivileged caller CRIU opened everything with
    the caller's own rights, so the kernel already refused that; this is the second look, on
    what the processes really hold, before they run. ``handed``: (device, inode) of files
    root itself handed to the tree (``--inherit-fd``, a batch job's log): not reopened by
    name, so not the caller's to open."""
    from .criuimages import may_access

    why = tree_problems(pid, uid, gids)
    for p in _tree(pid):
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            link = f"/proc/{p}/fd/{fd}"
            try:
                target = os.readlink(link)
                if not target.startswith("/"):
                    continue  # pipes, sockets, anonymous inodes: nothing reopened by name
                st = os.stat(link)
                if (st.st_dev, st.st_ino) in handed:
                    continue
                with open(f"/proc/{p}/fdinfo/{fd}") as f:
                    flags = next(int(ln.split()[1], 8) for ln in f if ln.startswith("flags:"))
            except (OSError, StopIteration, ValueError, IndexError):
                continue
            acc = flags & 0o3
            if not may_access(st, uid, gids, read=acc != 0o1, write=acc in (0o1, 0o2)):
                why.append(f"process {p} holds {target} open "
                           f"{'for writing' if acc else 'for reading'}, which uid {uid} may "
                           f"not (owner uid {st.st_uid}, mode {st.st_mode & 0o7777:04o})")
        try:
            with open(f"/proc/{p}/maps") as f:
                maps = f.read().splitlines()
        except OSError:
            continue
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) < 6 or not parts[5].startswith("/") or parts[4] == "0":
                continue
            perms = parts[1]
            try:
                st = os.stat(f"/proc/{p}/map_files/{parts[0]}")
            except OSError:
                continue
            write = perms[1] == "w" and perms[3] == "s"
            if not may_access(st, uid, gids, read=True, write=write):
                why.append(f"process {p} maps {parts[5]} ({perms}), which uid {uid} may not "
                           f"{'write' if write else 'read'}")
    return why


def _kill_tree(pid: int) -> None:
    pids = _tree(pid)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _seal_key() -> bytes:
    path = SEAL_KEY
    if caller_uid() == 0 and os.environ.get("GPUBUDGET_SEAL_KEY"):
        path = os.environ["GPUBUDGET_SEAL_KEY"]  # only root itself may point elsewhere
    try:
        with open(path, "rb") as f:
            key = f.read()
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        key = os.urandom(32)
        # written whole under a private name, then linked in: a second first use at the same
        # moment reads the winner's key, never a short or empty one
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        try:
            os.link(tmp, path)
        except FileExistsError:
            with open(path, "rb") as f:
                key = f.read()
        finally:
            os.unlink(tmp)
    if len(key) < 32:
        raise CriuError("bad_input", f"seal key {path} is shorter than 32 bytes")
    return key


def _digests(images_dir: str) -> list[tuple[str, int, str]]:
    out = []
    for name in sorted(os.listdir(images_dir)):
        if not name.endswith(".img"):
            continue
        path = os.path.join(images_dir, name)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        h, n = hashlib.sha256(), 0
        with os.fdopen(fd, "rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
                n += len(chunk)
        out.append((name, n, h.hexdigest()))
    return out


def _mac(uid: int, digests: list[tuple[str, int, str]]) -> str:
    body = json.dumps({"uid": uid, "images": digests}, sort_keys=True).encode()
    return hmac.new(_seal_key(), body, hashlib.sha256).hexdigest()


def seal(images_dir: str, uid: int) -> str:
    """The seal of a dump's images for ``uid`` (see the module's docstring)."""
    return _mac(uid, _digests(images_dir))


#: the one directory inside a root-only box where CRIU, running as the caller, reads and
#: writes images (the caller's own, so that CRIU may; out of its other processes' reach)
_INNER = "images"


def _private_copy(images_dir: str) -> tuple[str, str]:
    """A copy of the ``*.img`` files of ``images_dir`` that the caller cannot change: (the
    box, a root-owned 0700 directory to remove afterwards; the directory of the copy inside
    it, reachable only through the box, which only root may enter, even once it is handed
    to the caller's account for CRIU running as it: :func:`_hand_over`)."""
    need = sum(os.path.getsize(os.path.join(images_dir, n)) for n in os.listdir(images_dir)
               if n.endswith(".img"))
    box, dest = _private_box(need)
    for name in os.listdir(images_dir):
        if not name.endswith(".img"):
            continue
        src = os.open(os.path.join(images_dir, name), os.O_RDONLY | os.O_NOFOLLOW)
        dst = os.open(os.path.join(dest, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                      os.O_NOFOLLOW, 0o600)
        with os.fdopen(src, "rb") as fi, os.fdopen(dst, "wb") as fo:
            shutil.copyfileobj(fi, fo, 8 << 20)
    return box, dest


def _private_box(need: int) -> tuple[str, str]:
    """(a fresh root-owned 0700 box, the empty directory ``images`` inside it): in /dev/shm
    when it has room for ``need`` bytes twice over."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and \
        shutil.disk_usage("/dev/shm").free > 2 * need + (64 << 20) else None
    box = tempfile.mkdtemp(prefix="gpubudget-criu-restore-", dir=base)
    dest = os.path.join(box, _INNER)
    os.mkdir(dest, 0o700)
    return box, dest


_IMAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}")
_DIGEST = re.compile(r"[0-9a-f]{64}")


def check_chunk_plan(files: object) -> list[dict]:
    """The image files of a stored checkpoint as a restore reads them from the store
    (``[{"name", "size", "chunks": [[sha256, length, codec, ...], ...]}, ...]``), checked;
    anything else is ``bad_input``."""
    if not isinstance(files, list) or not files or len(files) > 100_000:
        raise CriuError("bad_input", "files: expected a list of image files")
    out, names = [], set()
    for e in files:
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) \
                or not _IMAGE_NAME.fullmatch(e["name"]) or e["name"] in names:
            raise CriuError("bad_input", f"files: {str(e)[:80]!r} is not an image file "
                            "(name, size, chunks)")
        refs, size = e.get("chunks"), e.get("size")
        if not isinstance(refs, list) or isinstance(size, bool) or not isinstance(size, int):
            raise CriuError("bad_input", f"files: {e['name']}: expected its size and chunks")
        total = 0
        for r in refs:
            if not isinstance(r, list) or len(r) < 3 or not isinstance(r[0], str) \
                    or not _DIGEST.fullmatch(r[0]) or isinstance(r[1], bool) \
                    or not isinstance(r[1], int) or not 0 < r[1] <= 1 << 30 \
                    or r[2] not in ("zst", "raw"):
                raise CriuError("bad_input", f"files: {e['name']}: {str(r)[:80]!r} is not a "
                                "chunk reference")
            total += r[1]
        if total != size:
            raise CriuError("bad_input", f"files: {e['name']}: its chunks hold {total} bytes, "
                            f"not {size}")
        names.add(e["name"])
        out.append({"name": e["name"], "size": size, "chunks": [list(r[:3]) for r in refs]})
    return out


def _private_fill(chunk_root: str, files: list[dict], owner: int | None,
                  check: bool = True) -> tuple[str, str]:
    """Like :func:`_private_copy`, from the snapshot store's chunks instead of a directory of
    images: each image is written once, straight from its chunks into the box (checked
    chunk by chunk; ``check`` False: the raw ones are left to :class:`_Checking`). ``owner``:
    the account the store belongs to (its chunks must be that account's files, never reached
    through a symlink); None when root itself asked."""
    from . import chunkio

    box, dest = _private_box(sum(e["size"] for e in files))
    try:
        dfd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for e in files:
                if not e["name"].endswith(".img"):
                    continue  # CRIU's statistics: as _private_copy, only the images
                chunkio.fill_file(chunk_root, e["chunks"], dfd, e["name"], owner=owner,
                                  check=check)
        finally:
            os.close(dfd)
    except chunkio.ChunkError as err:
        shutil.rmtree(box, ignore_errors=True)
        raise CriuError("restore_failed", f"the checkpoint's images cannot be read back: "
                        f"{err}") from None
    except BaseException:
        shutil.rmtree(box, ignore_errors=True)
        raise
    return box, dest


class _Checking:
    """Checks the raw chunks of images :func:`_private_fill` wrote unchecked, on its own
    threads, while CRIU restores from them: :meth:`wait` (the gate :func:`_restore` passes
    before the restored tree may run) raises if any differs from its checksum."""

    def __init__(self, directory: str, files: list[dict]) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from . import chunkio

        self._dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        self._pool = ThreadPoolExecutor(max_workers=1)
        imgs = [e for e in files if e["name"].endswith(".img")]
        self._future = self._pool.submit(
            lambda: [chunkio.check_file(self._dfd, e["name"], e["chunks"]) for e in imgs])
        self._closed = False

    def wait(self) -> None:
        from . import chunkio

        try:
            self._future.result()
        except chunkio.ChunkError as err:
            raise CriuError("restore_failed", "the checkpoint's images cannot be read back: "
                            f"{err}") from None
        finally:
            self.close()

    def close(self) -> None:
        """Wait for the threads (they read the box, removed next) and let the directory go."""
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True)
            os.close(self._dfd)


def _hand_over(directory: str, uid: int) -> None:
    """Give ``directory`` and its files to the account ``uid`` (CRIU, running as it, reads
    the images and writes its log there)."""
    gid = _account(uid)[0]
    for name in os.listdir(directory):
        os.chown(os.path.join(directory, name), uid, gid, follow_symlinks=False)
    os.chown(directory, uid, gid)


def _account(uid: int) -> tuple[int, list[int]]:
    """(primary gid, every group) of the account ``uid``; an account without a passwd entry
    is refused (its groups cannot be known)."""
    import pwd

    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        raise CriuError("bad_input", f"uid {uid} has no account here (no passwd entry): "
                        "CRIU runs as the caller's account, which must exist") from None
    return pw.pw_gid, sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid)))


def _setpriv() -> str:
    found = shutil.which("setpriv") or next(
        (p for p in ("/usr/bin/setpriv", "/bin/setpriv") if os.access(p, os.X_OK)), None)
    if found is None:
        raise CriuError("no_criu", "setpriv (util-linux) is not installed: CRIU cannot be run "
                        "with the caller's own rights, and it is never run as root for it")
    return found


def user_criu_argv(binary_fd: int, uid: int) -> list[str]:
    """The command that runs CRIU (the executable open as ``binary_fd``, passed to the child:
    the caller may not be able to reach its path, e.g. a build under root's home) as the
    account ``uid`` with its own gid and groups and only ``CAP_CHECKPOINT_RESTORE``, which is
    what CRIU's ``--unprivileged`` mode needs. ``setpriv`` keeps the capability across the
    change of uid as an ambient one; nothing else is kept."""
    gid, groups = _account(uid)
    return [_setpriv(), f"--reuid={uid}", f"--regid={gid}",
            "--groups=" + ",".join(map(str, groups)),
            "--inh-caps=-all,+checkpoint_restore", "--ambient-caps=-all,+checkpoint_restore",
            "--", f"/proc/self/fd/{binary_fd}"]


#: CRIU's options in its unprivileged mode: no configuration file of anyone's is read (the
#: caller's ``~/.criu/default.conf`` could name action scripts), TCP connections closed
USER_CRIU_OPTS = ["--unprivileged", "--no-default-config", "--tcp-close"]
#: the environment CRIU runs with for an unprivileged caller (none of the caller's)
_USER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


def _run_criu(binary: str, args: list[str], timeout: float, user: int | None, cwd: str,
              pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    """Run ``criu ARGS`` in ``cwd``: as root (``user`` None), or as the account ``user`` in
    CRIU's unprivileged mode (:func:`user_criu_argv`). ``pass_fds``: open files CRIU is
    given (``--inherit-fd``)."""
    if user is None:
        return subprocess.run([binary, *args], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, pass_fds=pass_fds)
    fd = os.open(binary, os.O_RDONLY | os.O_CLOEXEC)
    try:
        argv = user_criu_argv(fd, user)
        os.set_inheritable(fd, True)
        return subprocess.run([*argv, *args, *USER_CRIU_OPTS], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, env=_USER_ENV,
                              pass_fds=(fd, *pass_fds),
                              stdin=subprocess.DEVNULL)
    finally:
        os.close(fd)


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def _check_kernel_pid(pid: object, expect_uid: int | None) -> int:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        raise CriuError("bad_input", f"pid: {pid!r} is not a process id")
    try:
        st = os.stat(f"/proc/{pid}")
    except FileNotFoundError:
        raise CriuError("not_a_kernel", f"pid: no process {pid}") from None
    if expect_uid is not None and st.st_uid != expect_uid:
        raise CriuError("not_a_kernel", f"pid: process {pid} is not owned by uid {expect_uid}")
    if st.st_uid == 0 and expect_uid != 0:
        raise CriuError("not_a_kernel", f"pid: process {pid} runs as root: refused")
    if os.getsid(pid) != pid:
        raise CriuError("not_a_kernel", f"pid: process {pid} does not lead its own session "
                        "(start kernels independent of their launcher)")
    return pid


def _check_dir(path: object, must_exist: bool) -> str:
    if not isinstance(path, str) or not os.path.isabs(path) or "\x00" in path:
        raise CriuError("bad_input", f"images_dir: {path!r} is not an absolute path")
    path = os.path.normpath(path)
    if must_exist and not os.path.isdir(path):
        raise CriuError("bad_input", f"images_dir: {path} is not a directory")
    return path


def _log_tail(path: str, n: int = 12) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    errs = [ln for ln in lines if "Error" in ln and "RLIMIT_NOFILE" not in ln]
    return "\n".join((errs or lines)[-n:])


def _cuda_toggle(tool: str, pid: int) -> None:
    p = subprocess.run([tool, "--toggle", "--pid", str(pid)], capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        raise CriuError("gpu_state", f"cuda-checkpoint --toggle --pid {pid} failed: "
                        f"{(p.stderr or p.stdout).strip()[:500]}")


def _wait_stopped(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    return
        except OSError:
            return
        time.sleep(0.005)


def _new_images_dir(pid: int, uid: int | None = None) -> str:
    """A fresh directory (mode 0700, root's) for a dump: in /dev/shm when it has room for
    twice the tree's resident memory, else the system's temporary directory."""
    need = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/statm") as f:
                need += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            pass
    base = "/dev/shm" if os.path.isdir("/dev/shm") and \
        shutil.disk_usage("/dev/shm").free > 2 * need + (64 << 20) else None
    # named for the account it is dumped for: an admin (and a test) sees whose it is
    prefix = "gpubudget-criu-" + (f"{uid}-" if uid is not None else "")
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def criu_dump(pid: int, images_dir: str | None = None, *, leave_running: bool = False,
              keep_stopped: bool = False, expect_uid: int | None = None,
              owner: tuple[int, int] | None = None, criu: str | None = None,
              cuda_checkpoint: str | None = None, timeout: float = 600,
              own_cgroup: bool = False) -> dict:
    """Dump the process tree rooted at ``pid`` (a kernel) into ``images_dir`` (created, mode
    0700; None: a fresh one, which is always the case for an unprivileged caller). The kernel
    is gone afterwards, unless ``leave_running`` (it runs on) or
    ``keep_stopped``: its process group is stopped (SIGSTOP) before the dump and stays stopped
    after it, so that the caller can store and verify the images and only then end it, or let
    it go on if that failed (:func:`criu_finish`). ``owner`` (uid, gid): the images are handed
    to this account (the unprivileged service ingests them; an unprivileged caller always gets
    them). GPU state is captured with cuda-checkpoint when the tree uses a GPU; without it the
    dump is refused. Returns ``{"pid", "seconds", "bytes", "gpu", "criu", "images_dir"}`` and,
    for an unprivileged caller, the images' ``"seal"``."""
    caller = caller_uid()
    if caller != 0:
        expect_uid = caller  # an unprivileged caller dumps its own processes only
        if images_dir is not None:
            raise CriuError("bad_input", "images_dir: chosen here for an unprivileged caller "
                            "(leave it out)")
        import pwd

        try:
            owner = (caller, pwd.getpwuid(caller).pw_gid)
        except KeyError:
            owner = (caller, caller)
    pid = _check_kernel_pid(pid, expect_uid)
    # only a tree that is purely the account's own is dumped for it: a set-id child (say
    # `sleep | passwd`) would put root's memory into images handed to the account
    only = (expect_uid or None) if caller == 0 else caller  # root's own tree: no such check
    gids = caller_gids(only) if only is not None else set()
    if only is not None:
        why = tree_problems(pid, only, gids)
        if why:
            raise CriuError("unsafe", f"pid: process {pid}'s tree is not only uid {only}'s, "
                            f"not dumped: {why[0]}" + (f" (and {len(why) - 1} more)"
                                                        if len(why) > 1 else ""))
    created = images_dir is None
    if images_dir is None:
        images_dir = _new_images_dir(pid, only)
    images_dir = _check_dir(images_dir, must_exist=False)
    try:
        return _dump(pid, images_dir, leave_running, keep_stopped, caller, owner, criu,
                     cuda_checkpoint, timeout, only, gids, user=caller or None,
                     own_cgroup=own_cgroup)
    except BaseException:
        if created:  # nobody else knows where it is: not left behind
            shutil.rmtree(images_dir, ignore_errors=True)
        raise


def _dump(pid: int, images_dir: str, leave_running: bool, keep_stopped: bool, caller: int,
          owner: tuple[int, int] | None, criu: str | None, cuda_checkpoint: str | None,
          timeout: float, only: int | None = None, gids: set[int] | None = None,
          user: int | None = None, own_cgroup: bool = False) -> dict:
    """``own_cgroup``: the tree has a cgroup of its own (a batch job's), which is not saved:
    its restore goes into the cgroup its launcher gives it (``--manage-cgroups=ignore``).
    ``user``: CRIU runs as this account (an unprivileged caller's), in a directory of its
    own inside ``images_dir`` (which only root may enter); the images are moved up into
    ``images_dir`` once CRIU is done, and only then read, checked and sealed."""
    binary = find_criu(criu)
    if binary is None:
        raise CriuError("no_criu", "no CRIU >= 4.1 found (run .ci/build-criu.sh)")
    gpu_pids = [p for p in _tree(pid) if uses_gpu(p)]
    tool = None
    if gpu_pids:
        tool = find_cuda_checkpoint() if cuda_checkpoint is None else cuda_checkpoint
        if not tool:
            raise CriuError("gpu_state", f"process {pid} uses a GPU and cuda-checkpoint is not "
                            "installed: its GPU state cannot be captured")
    os.makedirs(images_dir, mode=0o700, exist_ok=True)
    work = images_dir
    if user is not None:
        _setpriv()  # refused before anything is stopped: no setpriv, or no such account
        work = os.path.join(images_dir, _INNER)
        os.mkdir(work, 0o700)
        os.chown(work, user, _account(user)[0])
    t0 = time.perf_counter()
    if keep_stopped:
        os.killpg(pid, signal.SIGSTOP)
        _wait_stopped(pid)
        leave_running = True
    for p in gpu_pids:
        _cuda_toggle(tool, p)  # GPU memory moves into the process: CRIU then saves it
    argv = ["dump", "-t", str(pid), "-D", ".", "-o", "dump.log", "-v2", "--file-locks"]
    if user is None:
        argv += ["--tcp-established", "--network-lock", NETWORK_LOCK]
    if leave_running:
        argv.append("--leave-running")
    if own_cgroup:
        argv.append("--manage-cgroups=ignore")
    try:
        p = _run_criu(binary, argv, timeout, user, work)
        if user is not None:
            _move_up(work, images_dir)
    except subprocess.TimeoutExpired:
        raise CriuError("dump_failed", f"criu dump of {pid} took over {timeout:.0f} s") from None
    finally:
        if gpu_pids and leave_running:
            for gp in gpu_pids:
                _cuda_toggle(tool, gp)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        if gpu_pids and not leave_running:  # the dump failed: the kernel runs on; give it back
            for gp in gpu_pids:
                try:
                    _cuda_toggle(tool, gp)
                except CriuError:
                    pass
        if keep_stopped:
            os.killpg(pid, signal.SIGCONT)
        log = _log_tail(os.path.join(images_dir, "dump.log")) or p.stderr.strip()[-2000:]
        raise CriuError("dump_failed", f"criu dump of {pid} failed (exit {p.returncode})", log)
    if only is not None:  # what was really dumped: the tree may have changed since the check
        from .criuimages import ImageError, foreign_tasks

        try:
            why = foreign_tasks(images_dir, only, gids or set())
        except (ImageError, OSError) as e:
            why = [f"its images cannot be read ({e})"]
        if why:
            if keep_stopped:
                os.killpg(pid, signal.SIGCONT)
            raise CriuError("unsafe", f"the dump of process {pid} is not only uid {only}'s and "
                            f"was destroyed: {why[0]}")
    out = {"pid": pid, "seconds": seconds, "gpu": bool(gpu_pids), "criu": binary,
           "images_dir": images_dir}
    if caller != 0:
        out["seal"] = seal(images_dir, caller)
    size = 0
    for name in os.listdir(images_dir):
        path = os.path.join(images_dir, name)
        size += os.path.getsize(path)
        if owner is not None:
            os.chown(path, *owner)
    if owner is not None:
        os.chown(images_dir, *owner)
    out["bytes"] = size
    return out


def _move_up(work: str, images_dir: str) -> None:
    """Move what CRIU wrote as the caller (``work``, inside ``images_dir``) up into
    ``images_dir`` (only root's from then on: the files are re-owned below) and remove
    ``work``. Only regular files are kept."""
    import stat as stat_

    for name in os.listdir(work):
        path = os.path.join(work, name)
        if stat_.S_ISREG(os.lstat(path).st_mode):
            os.rename(path, os.path.join(images_dir, name))
        else:
            os.unlink(path)
    os.rmdir(work)
    for name in os.listdir(images_dir):
        os.chown(os.path.join(images_dir, name), 0, 0, follow_symlinks=False)


def criu_finish(pid: int, *, kill: bool, expect_uid: int | None = None) -> dict:
    """End a kernel dumped with ``keep_stopped`` (``kill``: its snapshot is safe) or let it go
    on (SIGCONT: its snapshot failed, the session keeps its kernel)."""
    if caller_uid() != 0:
        expect_uid = caller_uid()
    pid = _check_kernel_pid(pid, expect_uid)
    os.killpg(pid, signal.SIGKILL if kill else signal.SIGCONT)
    return {"pid": pid, "killed": kill}


def criu_restore(images_dir: str | None, *, criu: str | None = None,
                 cuda_checkpoint: str | None = None, gpu: bool = False,
                 timeout: float = 600, seal_hex: str | None = None,
                 inherit: dict[int, str] | None = None,
                 chunks: tuple[str, list[dict]] | None = None,
                 chunk_owner: int | None = None, expect_owner: int | None = None,
                 seconds: dict | None = None) -> int:
    """Restore a dumped process tree, detached (its parent is init), with its TCP connections
    and listening sockets (the kernel's ZMQ ports); returns the root pid. ``gpu``: the dump
    carried GPU state, given back to the GPU with cuda-checkpoint after the restore. For an
    unprivileged caller the images must carry their dump's seal (``seal_hex``), checked on a
    private copy that is what CRIU restores, and CRIU runs as the caller's own account in its
    unprivileged mode (the module's docstring): every file is opened with the caller's rights,
    its TCP connections come back closed.

    ``inherit`` (root callers only: the batch-job launcher): {open fd: the file's name as the
    dump saw it, without its leading ``/``}; CRIU gives the restored tree that open file in
    place of reopening the name (``--inherit-fd``): a requeued job's log on the node where it
    lands. Those files are root's to hand out and are not held to the account's rights.

    ``chunks`` (root callers only, in place of ``images_dir``): (a snapshot store's chunk
    directory, the images' files as :func:`check_chunk_plan` takes them): the images are
    written once, from the store straight into the private box (no directory of images in
    between); ``chunk_owner``: the account that store belongs to (its chunks must be that
    account's files). ``expect_owner``: the images must hold that account's tasks only.
    ``seconds``: filled with where the time went (``images``: writing them into the private
    directory; ``criu``: CRIU's restore until the tree runs)."""
    if chunks is not None:
        if images_dir is not None or caller_uid() != 0:
            raise CriuError("bad_input", "chunks: only root restores from a store's chunks, "
                            "in place of an images directory")
        chunk_root = _check_dir(chunks[0], must_exist=True)
        plan = check_chunk_plan(chunks[1])
    else:
        images_dir = _check_dir(images_dir, must_exist=True)
    inherit = dict(inherit or {})
    if inherit and caller_uid() != 0:
        raise CriuError("bad_input", "inherit: only root hands open files to a restore")
    for fd, key in inherit.items():
        if isinstance(fd, bool) or not isinstance(fd, int) or fd < 3 or not isinstance(
                key, str) or not key or key.startswith("/") or "\x00" in key or ":" in key:
            raise CriuError("bad_input", f"inherit: {fd!r}: {key!r} is not an open file and a "
                            "relative name")
    binary = find_criu(criu)
    if binary is None:
        raise CriuError("no_criu", "no CRIU >= 4.1 found (run .ci/build-criu.sh)")
    caller = caller_uid()
    if chunks is not None:  # the box first: the images exist nowhere else
        t0 = time.perf_counter()
        # written unchecked, then checked on other threads while CRIU restores from them: the
        # restored tree stays stopped until every chunk checked out (else it is killed)
        box, private = _private_fill(chunk_root, plan, chunk_owner, check=False)
        if seconds is not None:
            seconds["images"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        checking = None
        try:
            checking = _Checking(private, plan)
            owner = _sole_owner(private)
            if expect_owner is not None and owner != expect_owner:
                checking.wait()  # damaged images say so first
                raise CriuError("unsafe", f"the checkpoint holds {_whose(private)}, not only "
                                f"uid {expect_owner}'s: refused")
            if owner is None:  # root's own tree is not left stopped: checked before
                checking.wait()
                return _restore(private, binary, cuda_checkpoint, gpu, timeout,
                                inherit=inherit)
            _setpriv()
            _hand_over(private, owner)
            return _restore(private, binary, cuda_checkpoint, gpu, timeout, only=owner,
                            gids=caller_gids(owner), user=owner, inherit=inherit,
                            gate=checking.wait)
        finally:
            if checking is not None:
                checking.close()
            shutil.rmtree(box, ignore_errors=True)
            if seconds is not None:
                seconds["criu"] = time.perf_counter() - t0
    assert images_dir is not None
    if caller == 0:
        owner = _sole_owner(images_dir)
        if owner is None:  # root's own tree (or several accounts'): CRIU as root
            return _restore(images_dir, binary, cuda_checkpoint, gpu, timeout,
                            inherit=inherit)
        # one account's kernel, restored by root (a service running as root): with that
        # account's rights all the same, or the account could race root's open of its files
        box, private = _private_copy(images_dir)
        try:
            _setpriv()
            _hand_over(private, owner)
            return _restore(private, binary, cuda_checkpoint, gpu, timeout, only=owner,
                            gids=caller_gids(owner), user=owner, inherit=inherit)
        finally:
            shutil.rmtree(box, ignore_errors=True)
    if not isinstance(seal_hex, str) or not re.fullmatch(r"[0-9a-f]{64}", seal_hex):
        raise CriuError("bad_input", "seal: required for an unprivileged caller (the seal its "
                        "dump returned)")
    box, private = _private_copy(images_dir)
    try:
        if not hmac.compare_digest(_mac(caller, _digests(private)), seal_hex):
            raise CriuError("bad_input", "seal: the images do not match the seal of a dump of "
                            "this account's processes (changed, or not dumped here)")
        gids = caller_gids(caller)
        # a clear, early refusal of what the kernel would refuse anyway (CRIU opens every
        # file as the caller): a name that became a symlink or another account's file
        _check_names(private, caller, gids)
        _setpriv()
        _hand_over(private, caller)
        return _restore(private, binary, cuda_checkpoint, gpu, timeout, only=caller,
                        gids=gids, user=caller)
    finally:
        shutil.rmtree(box, ignore_errors=True)


def _check_names(images_dir: str, uid: int, gids: set[int]) -> None:
    """Refuse a restore that would reopen a file by a name that no longer leads where it did
    (a symlink, a replaced file) or to a file ``uid`` may not open as asked. The seal covers
    the images, not the files they name. This is an early refusal that says why; it is not
    what keeps other accounts' files safe (a name can change right after it): CRIU opening
    every file with ``uid``'s own rights is."""
    from .criuimages import ImageError, path_problem, reg_files

    try:
        files = reg_files(images_dir)
    except (ImageError, OSError) as e:
        raise CriuError("unsafe", f"the snapshot's file table cannot be read: {e}") from None
    for rf in files:
        why = path_problem(rf.name, uid, gids, read=rf.reads, write=rf.writes)
        if why:
            raise CriuError("unsafe", f"restore refused: {why}")


def _whose(images_dir: str) -> str:
    """Whose tasks a dump holds, in words (for a refusal)."""
    from .criuimages import ImageError, task_creds

    try:
        uids = sorted({u for t in task_creds(images_dir) for u in t.uids})
    except (ImageError, OSError) as e:
        return f"tasks that cannot be read ({e})"
    return f"processes of uids {uids}"


def _sole_owner(images_dir: str) -> int | None:
    """The account whose tree a dump holds when it holds one account's tasks only (every
    uid the same, not root, no capabilities) and that account exists here; else None."""
    from .criuimages import ImageError, task_creds

    try:
        tasks = task_creds(images_dir)
    except (ImageError, OSError):
        return None
    uids = {u for t in tasks for u in t.uids}
    if len(uids) != 1 or any(t.caps for t in tasks):
        return None
    uid = uids.pop()
    if uid <= 0:
        return None
    try:
        _account(uid)
    except CriuError:
        return None
    return uid


def _tcp_closed(images_dir: str) -> bool:
    """Whether the dump closed its TCP connections (``inventory_entry.tcp_close``): then its
    restore must say so too."""
    from .criuimages import ImageError, entries, fields

    try:
        inv = entries(os.path.join(images_dir, "inventory.img"))
    except (ImageError, OSError):
        return False  # CRIU itself says what is wrong with it
    return any(fields(e).get(10, [0])[-1] == 1 for e in inv)


def _restore(images_dir: str, binary: str, cuda_checkpoint: str | None, gpu: bool,
             timeout: float, only: int | None = None, gids: set[int] | None = None,
             user: int | None = None, inherit: dict[int, str] | None = None,
             gate: Callable[[], None] | None = None) -> int:
    """Restore from ``images_dir``: CRIU as root, or as the account ``user`` in its
    unprivileged mode (``images_dir`` is then that account's directory in a root-only box).
    ``only``: the restored tree is left stopped, checked for anything not ``only``'s, and
    killed if it holds any. ``gate`` (with ``only``): called once CRIU is done, before the
    tree may run; what it raises kills the tree (the images' check, made meanwhile)."""
    tool = None
    if gpu:
        tool = find_cuda_checkpoint() if cuda_checkpoint is None else cuda_checkpoint
        if not tool:
            raise CriuError("gpu_state", "the snapshot holds GPU state and cuda-checkpoint is "
                            "not installed here")
    pidfile = os.path.join(images_dir, "restored.pid")
    try:
        os.unlink(pidfile)
    except FileNotFoundError:
        pass
    argv = ["restore", "-D", ".", "-o", "restore.log", "-v2", "--file-locks",
            "--restore-detached", "--pidfile", "restored.pid"]
    if user is None:
        argv += (["--tcp-close"] if _tcp_closed(images_dir) else
                 ["--tcp-established", "--network-lock", NETWORK_LOCK])
    if only is not None:  # checked while stopped: it runs only once it holds nothing foreign
        argv.append("--leave-stopped")
    handed = set()
    if inherit:  # a batch job: restored into the cgroup its launcher put CRIU in, not its old one
        argv.append("--manage-cgroups=ignore")
    for fd, key in (inherit or {}).items():
        argv += ["--inherit-fd", f"fd[{fd}]:{key}"]
        st = os.fstat(fd)
        handed.add((st.st_dev, st.st_ino))
    try:
        p = _run_criu(binary, argv, timeout, user, images_dir, tuple(inherit or ()))
    except subprocess.TimeoutExpired:
        raise CriuError("restore_failed", f"criu restore took over {timeout:.0f} s") from None
    if p.returncode != 0:
        if gate is not None:
            gate()  # damaged images: that is the reason, not what CRIU made of them
        log = _log_tail(os.path.join(images_dir, "restore.log")) or p.stderr.strip()[-2000:]
        if re.search(r"Can't fork for \d+: File exists", log):
            raise CriuError("pid_in_use", "criu restore failed: a process id of the snapshot "
                            "is in use here (restore on another node, or after it is free)", log)
        raise CriuError("restore_failed", f"criu restore failed (exit {p.returncode})", log)
    with os.fdopen(os.open(pidfile, os.O_RDONLY | os.O_NOFOLLOW)) as f:
        pid = int(f.read().strip())
    if gate is not None:
        try:
            gate()
        except BaseException:
            _kill_tree(pid)
            raise
    if only is not None:
        why = live_problems(pid, only, gids or set(), frozenset(handed))
        if why:
            _kill_tree(pid)
            raise CriuError("unsafe", f"restore refused and the restored process killed: "
                            f"{why[0]}")
    for p in [pid, *_tree(pid)] if only is not None else [pid]:
        try:  # a tree dumped while stopped (or left stopped above) comes back stopped
            os.killpg(p, signal.SIGCONT) if p == pid else os.kill(p, signal.SIGCONT)
        except ProcessLookupError:
            pass
    if tool:
        for gp in _tree(pid):
            if uses_gpu(gp):
                _cuda_toggle(tool, gp)
    return pid


def criu_check(criu: str | None = None) -> dict:
    """What this machine offers: CRIU's path and version, cuda-checkpoint, whether we are root."""
    binary = find_criu(criu)
    return {"criu": binary, "version": ".".join(map(str, criu_version(binary) or ()))
            if binary else None, "cuda_checkpoint": find_cuda_checkpoint(),
            "root": os.geteuid() == 0, "caller_uid": caller_uid()}
