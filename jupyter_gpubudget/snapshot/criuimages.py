"""What the privileged side reads in CRIU's images before it hands them out or restores them.

Standard library only (this runs as root, like :mod:`.criu`). A dump is only as safe as what
it holds and what it refers to:

- the **credentials of every task** (``core-<tid>.img``: ``core_entry.thread_core.creds``):
  an unprivileged caller's dump must hold only its own account's tasks, with no capabilities
  (a setuid child such as ``passwd`` in the tree would put root's memory in the images);
- the **files it refers to by path** (``files.img``: ``file_entry.reg``, the open files and the
  mapped ones, executables included): CRIU reopens them *by name* at restore. For an
  unprivileged caller it does so with the caller's own rights (:mod:`.criu`), so the kernel
  refuses a file the caller may not open; a name that became a symlink, or a file the caller
  may not open the way the image asks, is refused here first, with a reason.

A minimal reader of protocol buffers (varints and length-delimited fields) is enough for the
few fields read here; their numbers are those of CRIU's ``images/*.proto``.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass

#: the magics that may open an image before its own (``criu/include/magic.h``)
_COMMON_MAGICS = (0x54564319, 0x55105940)
#: file_entry.type of a regular file (``fd_types.REG``)
_REG = 1
_O_ACCMODE, _O_WRONLY, _O_RDWR = 0o3, 0o1, 0o2


class ImageError(ValueError):
    """An image that cannot be read as CRIU wrote it."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ImageError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def fields(buf: bytes) -> dict[int, list[int | bytes]]:
    """The fields of one protobuf message: number -> values (ints, or bytes for
    length-delimited ones; packed repeated varints come as bytes too)."""
    out: dict[int, list[int | bytes]] = {}
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        v: int | bytes
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ImageError("truncated field")
            v, i = buf[i:i + n], i + n
        elif wire == 1:
            v, i = int.from_bytes(buf[i:i + 8], "little"), i + 8
        elif wire == 5:
            v, i = int.from_bytes(buf[i:i + 4], "little"), i + 4
        else:
            raise ImageError(f"unsupported wire type {wire}")
        out.setdefault(num, []).append(v)
    return out


def _ints(f: dict[int, list[int | bytes]], num: int) -> list[int]:
    """A repeated varint field, packed or not."""
    out: list[int] = []
    for v in f.get(num, []):
        if isinstance(v, int):
            out.append(v)
        else:
            i = 0
            while i < len(v):
                x, i = _varint(v, i)
                out.append(x)
    return out


def _one(f: dict[int, list[int | bytes]], num: int) -> int | bytes | None:
    vals = f.get(num)
    return vals[-1] if vals else None


def entries(path: str) -> list[bytes]:
    """The protobuf entries of one image file (magics skipped)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read()
    i = 4
    if len(data) < 4:
        raise ImageError(f"{os.path.basename(path)}: too short")
    if struct.unpack_from("<I", data, 0)[0] in _COMMON_MAGICS:
        i = 8
    out = []
    while i < len(data):
        if i + 4 > len(data):
            raise ImageError(f"{os.path.basename(path)}: truncated entry")
        (n,) = struct.unpack_from("<I", data, i)
        i += 4
        if i + n > len(data):
            raise ImageError(f"{os.path.basename(path)}: truncated entry")
        out.append(data[i:i + n])
        i += n
    return out


@dataclass(frozen=True)
class TaskCreds:
    tid: int
    comm: str
    uids: tuple[int, int, int, int]  # real, effective, saved, filesystem
    gids: tuple[int, int, int, int]
    caps: int  # any permitted or effective capability bit
    groups: tuple[int, ...]


def task_creds(images_dir: str) -> list[TaskCreds]:
    """The credentials of every task (thread) in a dump; a task whose image holds none is
    reported with uid -1 (refused by :func:`foreign_tasks`: nothing unknown passes)."""
    out = []
    for name in sorted(os.listdir(images_dir)):
        if not (name.startswith("core-") and name.endswith(".img")):
            continue
        tid = int(name[5:-4]) if name[5:-4].isdigit() else -1
        for entry in entries(os.path.join(images_dir, name)):
            core = fields(entry)
            comm = ""
            tc = _one(core, 3)
            if isinstance(tc, bytes):
                c = _one(fields(tc), 6)
                comm = c.decode(errors="replace") if isinstance(c, bytes) else ""
            creds = None
            th = _one(core, 5)
            if isinstance(th, bytes):
                cr = _one(fields(th), 10)
                creds = fields(cr) if isinstance(cr, bytes) else None
            if creds is None:
                out.append(TaskCreds(tid, comm, (-1,) * 4, (-1,) * 4, 0, ()))  # type: ignore[arg-type]
                continue

            def num(n: int, c: dict = creds) -> int:  # type: ignore[type-arg]
                v = _one(c, n)
                return v if isinstance(v, int) else -1

            caps = any(_ints(creds, 10)) or any(_ints(creds, 11))
            out.append(TaskCreds(tid, comm, (num(1), num(3), num(5), num(7)),
                                 (num(2), num(4), num(6), num(8)), int(caps),
                                 tuple(_ints(creds, 14))))
    return out


def foreign_tasks(images_dir: str, uid: int, gids: set[int]) -> list[str]:
    """Why each task of a dump is not purely ``uid``'s (other ids, set-id, capabilities);
    empty when every task is. A dump with no task at all is refused too."""
    tasks = task_creds(images_dir)
    if not tasks:
        return ["the dump holds no task credentials"]
    why = []
    for t in tasks:
        who = f"task {t.tid} ({t.comm or '?'})"
        if any(u != uid for u in t.uids):
            why.append(f"{who} runs with uids {'/'.join(map(str, t.uids))}, not {uid} "
                       "(a setuid program or another account's process)")
        elif any(g not in gids for g in t.gids):
            why.append(f"{who} runs with gids {'/'.join(map(str, t.gids))} (a setgid program)")
        elif t.caps:
            why.append(f"{who} holds capabilities")
    return why


@dataclass(frozen=True)
class RegFile:
    name: str
    flags: int

    @property
    def writes(self) -> bool:
        return self.flags & _O_ACCMODE in (_O_WRONLY, _O_RDWR)

    @property
    def reads(self) -> bool:
        return self.flags & _O_ACCMODE != _O_WRONLY


def reg_files(images_dir: str) -> list[RegFile]:
    """Every regular file the dump refers to by name (open descriptors, mappings, the
    executables), from ``files.img`` (and ``reg-files.img`` of older layouts)."""
    out = []
    path = os.path.join(images_dir, "files.img")
    if os.path.exists(path):
        for entry in entries(path):
            f = fields(entry)
            reg = _one(f, 3)
            if _one(f, 1) == _REG and isinstance(reg, bytes):
                out.append(_reg(fields(reg)))
    legacy = os.path.join(images_dir, "reg-files.img")
    if os.path.exists(legacy):
        out.extend(_reg(fields(e)) for e in entries(legacy))
    return out


def _reg(f: dict[int, list[int | bytes]]) -> RegFile:
    name, flags = _one(f, 6), _one(f, 2)
    if not isinstance(name, bytes) or not isinstance(flags, int):
        raise ImageError("a regular file entry without its name or flags")
    return RegFile(name.decode("utf-8", errors="surrogateescape"), flags)


# ------------------------------------------------------------------ what a caller may open
def may_access(st: os.stat_result, uid: int, gids: set[int], read: bool, write: bool) -> bool:
    """Whether ``uid`` (groups ``gids``) may open the file ``st`` describes as asked, by its
    mode bits (ACLs that would grant more are not honoured: refused, never widened)."""
    if st.st_uid == uid:
        bits = (st.st_mode >> 6) & 7
    elif st.st_gid in gids:
        bits = (st.st_mode >> 3) & 7
    else:
        bits = st.st_mode & 7
    return (not read or bool(bits & 4)) and (not write or bool(bits & 2))


def path_problem(name: str, uid: int, gids: set[int], read: bool, write: bool) -> str | None:
    """Why reopening ``name`` as root for ``uid`` would give it more than it may have: a
    symlink anywhere on the path, a directory it may not search, a file it may not open as
    asked, or (missing: CRIU recreates it) a directory it may not write. None: safe."""
    if not name.startswith("/") or "\x00" in name:
        return f"{name!r} is not an absolute path"
    parts = [p for p in name.split("/") if p]
    cur = "/"
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        nxt = os.path.join(cur, part)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            if not last:
                return f"{name}: {nxt} no longer exists"
            try:
                dst = os.stat(cur)
            except OSError:
                return f"{name}: {cur} cannot be read"
            if not may_access(dst, uid, gids, read=False, write=True):
                return f"{name} no longer exists and uid {uid} may not create it in {cur}"
            return None
        except OSError as e:
            return f"{name}: {e.strerror}"
        if stat.S_ISLNK(st.st_mode):
            try:
                to = repr(os.readlink(nxt))
            except OSError:  # changed again meanwhile
                to = "somewhere else"
            return (f"{nxt} is now a symbolic link (to {to}); it was a file or directory "
                    "when the snapshot was taken")
        if not last:
            if not stat.S_ISDIR(st.st_mode):
                return f"{name}: {nxt} is not a directory"
            if not (st.st_mode & 0o111) or not _may_search(st, uid, gids):
                return f"{name}: uid {uid} may not enter {nxt}"
        elif stat.S_ISDIR(st.st_mode):  # a working directory or root: entered, not opened
            if not _may_search(st, uid, gids):
                return f"uid {uid} may not enter {name}"
        elif not stat.S_ISREG(st.st_mode) and not stat.S_ISCHR(st.st_mode):
            return f"{name} is no longer a regular file"
        elif not may_access(st, uid, gids, read=read, write=write):
            what = "read and write" if read and write else "write" if write else "read"
            return (f"uid {uid} may not {what} {name} (owner uid {st.st_uid}, mode "
                    f"{stat.S_IMODE(st.st_mode):04o}): it was replaced since the snapshot")
        cur = nxt
    return None


def _may_search(st: os.stat_result, uid: int, gids: set[int]) -> bool:
    if st.st_uid == uid:
        return bool(st.st_mode & 0o100)
    if st.st_gid in gids:
        return bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o001)
