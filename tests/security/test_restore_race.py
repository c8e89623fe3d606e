"""The restore race, as a hostile user plays it through sudo with the real CRIU.

The user's kernel held ``work/target`` (its own file) open read-write when it was dumped.
While it asks the helper for restore after restore, two of its own processes run:

- an **exchanger** swaps the directory ``work`` with a symlink to a root-owned directory
  (``renameat2(RENAME_EXCHANGE)`` in a loop), so that ``work/target`` names, from one moment
  to the next, its own file or root's 0644 file of the same size;
- a **grabber** takes, with ``pidfd_open`` + ``pidfd_getfd``, every descriptor of every
  process of the user's uid (a restored process, even one left stopped, is the user's), and
  for each one that names a file asks the kernel whether the user may open that file the
  same way (reopening it through ``/proc/self/fd``), and writes into any root-owned one.

A check of the names before CRIU opens them cannot win this: the restore must open every
file with the user's own rights. After at least 200 restores root's file must be unchanged
and no restored process may ever have held a descriptor the user could not open.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

from tests.fixtures.unixusers import shared_tmp

from .test_criu_helper import attacker, gone, spawn_as, verb  # noqa: F401  (fixture)

RESTORES = 200
#: the attacker's own programs: the system's Python, standard library only, as its uid
PY3 = "/usr/bin/python3"

EXCHANGER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
RENAME_EXCHANGE = 2
a, b, count = sys.argv[1].encode(), sys.argv[2].encode(), sys.argv[3]
n = 0
while not os.path.exists(sys.argv[4]):
    if libc.renameat2(-100, a, -100, b, RENAME_EXCHANGE) == 0:
        n += 1
        if n % 1000 == 0:
            with open(count, "w") as f:
                f.write(str(n))
# leave the real directory under its own name
if os.path.islink(a):
    libc.renameat2(-100, a, -100, b, RENAME_EXCHANGE)
with open(count, "w") as f:
    f.write(str(n))
"""

GRABBER = r"""
import ctypes, errno, json, os, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_PIDFD_GETFD = 438
uid, out, stop = os.getuid(), sys.argv[1], sys.argv[2]
me = {os.getpid(), os.getppid()}
found, seen = [], {}

def note(kind, **kw):
    found.append(dict(kind=kind, **kw))
    with open(out + ".tmp", "w") as f:
        json.dump({"found": found}, f)
    os.replace(out + ".tmp", out)

rounds = 0
while not os.path.exists(stop):
    rounds += 1
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in me:
            continue
        pid = int(name)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                mine = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(fd), 0)
                if mine < 0:
                    continue
                try:
                    st = os.fstat(mine)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    target = os.readlink(f"/proc/self/fd/{mine}")
                    with open(f"/proc/self/fdinfo/{mine}") as f:
                        flags = next(int(l.split()[1], 8) for l in f if l.startswith("flags:"))
                    with open(f"/proc/{pid}/stat") as f:  # one incarnation of the pid
                        start = int(f.read().rsplit(")", 1)[1].split()[19])
                    if (pid, start, target) not in seen:
                        seen[(pid, start, target)] = 1
                        if target.endswith("/target"):
                            note("seen", pid=pid, start=start, fd=int(fd), target=target)
                    acc = flags & 3
                    try:  # may this account open it as the process holds it?
                        os.close(os.open(f"/proc/self/fd/{mine}",
                                         [os.O_RDONLY, os.O_WRONLY, os.O_RDWR][acc]))
                    except OSError as e:
                        if e.errno in (errno.EACCES, errno.EPERM):
                            note("could_not_open", pid=pid, fd=int(fd), target=target,
                                 owner=st.st_uid, mode=oct(st.st_mode & 0o7777), acc=acc)
                    if st.st_uid != uid and acc in (1, 2):
                        try:
                            os.pwrite(mine, b"OWNED BY THE RACE", 0)
                            note("wrote", pid=pid, fd=int(fd), target=target)
                        except OSError as e:
                            note("write_failed", pid=pid, target=target, error=str(e))
                finally:
                    os.close(mine)
        finally:
            os.close(pidfd)
note("done", rounds=rounds)
"""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"found": []}


def test_the_exchange_race_never_reaches_roots_file(attacker):  # noqa: F811
    pw = attacker
    d = shared_tmp("gbt-restore-race-")
    rootdir = d / "rootdir"  # root's directory, with root's 0644 file
    rootdir.mkdir(mode=0o755)
    victim = rootdir / "target"
    victim.write_text("root's own configuration line\n")
    os.chmod(victim, 0o644)
    before = victim.read_bytes()
    home = d / "u"  # the user's directory: its own names to exchange
    home.mkdir()
    os.chown(home, pw.pw_uid, pw.pw_gid)
    work = home / "work"
    work.mkdir()
    os.chown(work, pw.pw_uid, pw.pw_gid)
    mine = work / "target"
    mine.write_text("y" * len(before))  # the same size: CRIU's own size check passes
    os.chown(mine, pw.pw_uid, pw.pw_gid)
    os.chmod(mine, 0o644)
    swap = home / "swap"
    os.symlink(rootdir, swap)
    os.lchown(swap, pw.pw_uid, pw.pw_gid)
    tools = d / "tools"  # the attacker's programs (readable by it)
    tools.mkdir(mode=0o755)
    (tools / "exchanger.py").write_text(EXCHANGER)
    (tools / "grabber.py").write_text(GRABBER)
    out = home / "out"  # what the attacker's programs report
    out.mkdir()
    os.chown(out, pw.pw_uid, pw.pw_gid)
    stop = out / "stop"

    pid = spawn_as(pw, f"exec 3<>{mine}; exec sleep 600")
    helpers: list[subprocess.Popen] = []
    restored: list[int] = []
    outcomes: dict[str, int] = {}
    examples: dict[str, str] = {}  # one message of each kind of refusal
    images = None
    try:
        time.sleep(0.5)
        rc, res = verb(pw, "criu-dump", "--pid", str(pid))
        assert rc == 0, res
        images, seal = res["images_dir"], res["seal"]
        gone(pid)
        for script, args in (("exchanger.py", [str(work), str(swap), str(out / "count"),
                                                str(stop)]),
                             ("grabber.py", [str(out / "grabbed.json"), str(stop)])):
            helpers.append(subprocess.Popen(
                ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups",
                 "--reset-env", "--", PY3, str(tools / script), *args],
                start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
        for _ in range(RESTORES):
            _wait_free(pid)  # what a failed restore left is gone: its pid is free again
            rc, res = verb(pw, "criu-restore", "--images-dir", images, "--seal", seal)
            key = "restored" if rc == 0 else str(res.get("error"))
            outcomes[key] = outcomes.get(key, 0) + 1
            if rc != 0:
                examples.setdefault(key, f"{res.get('message')} {res.get('log', '')[-300:]}")
                continue
            rpid = res["pid"]
            restored.append(rpid)
            # what the restored process holds, seen by root: no file of another account
            # open for writing
            for fd in os.listdir(f"/proc/{rpid}/fd"):
                link = f"/proc/{rpid}/fd/{fd}"
                try:
                    st = os.stat(link)
                except OSError:
                    continue
                assert not stat.S_ISREG(st.st_mode) or st.st_uid == pw.pw_uid or \
                    not _opened_for_writing(rpid, fd), \
                    f"restored process {rpid} holds {os.readlink(link)} for writing"
            # the grabber gets its turn at every restored process before it is ended
            start = _start_time(rpid)
            deadline = time.monotonic() + 20
            while not any(f.get("pid") == rpid and f.get("start") == start for f in
                          _read_json(out / "grabbed.json")["found"]) and \
                    time.monotonic() < deadline:
                time.sleep(0.02)
            _end(rpid)
    finally:
        stop.touch()
        for h in helpers:
            try:
                h.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(h.pid, signal.SIGKILL)
                h.wait()
        for rpid in restored:
            _end(rpid)
        gone(pid)
        if images:  # the dump handed to the user (in /dev/shm)
            shutil.rmtree(images, ignore_errors=True)
    grabbed = _read_json(out / "grabbed.json")
    exchanges = int((out / "count").read_text() or 0) if (out / "count").exists() else 0
    summary = {"outcomes": outcomes, "examples": examples, "exchanges": exchanges,
               "grabbed_restored": sum(1 for f in grabbed["found"]
                                       if f["kind"] == "seen" and f.get("target") == str(mine))}
    print(json.dumps(summary))
    bad = [f for f in grabbed["found"] if f["kind"] in ("could_not_open", "wrote")]
    assert victim.read_bytes() == before, f"root's file was written: {bad} {summary}"
    assert not bad, f"a restored process held what the user may not open: {bad} {summary}"
    # the attack really ran: the names were exchanged all along, and the grabber reached
    # restored processes' descriptors
    assert exchanges > 0, summary
    assert any(f["kind"] == "done" for f in grabbed["found"]), grabbed
    assert outcomes.get("restored", 0) > 0 and summary["grabbed_restored"] > 0, summary
    assert sum(outcomes.values()) == RESTORES
    shutil.rmtree(d, ignore_errors=True)


def _start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _opened_for_writing(pid: int, fd: str) -> bool:
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            flags = next(int(ln.split()[1], 8) for ln in f if ln.startswith("flags:"))
    except (OSError, StopIteration):
        return False
    return flags & 0o3 in (0o1, 0o2)


def _end(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _wait_free(pid)


def _wait_free(pid: int) -> None:
    deadline = time.monotonic() + 10  # gone (reaped by init): its pid is free again
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_root_callers_restore_of_a_users_kernel_opens_its_files_as_the_user(attacker):  # noqa: F811
    """A service running as root (the in-process path) restores a user's kernel with that
    user's rights too: the user could otherwise race root's open of its own names just the
    same. The name is left pointing at root's directory (no race needed against the old
    code, which reopened it as root without a check): the kernel refuses CRIU's open."""
    from jupyter_gpubudget.snapshot.privcall import Privileged, PrivilegedError

    pw = attacker
    d = shared_tmp("gbt-root-restore-")
    rootdir = d / "rootdir"
    rootdir.mkdir(mode=0o755)
    victim = rootdir / "target"
    victim.write_text("root's own line\n")
    os.chmod(victim, 0o644)
    before = victim.read_bytes()
    home = d / "u"
    home.mkdir()
    os.chown(home, pw.pw_uid, pw.pw_gid)
    work = home / "work"
    work.mkdir()
    os.chown(work, pw.pw_uid, pw.pw_gid)
    mine = work / "target"
    mine.write_text("z" * len(before))
    os.chown(mine, pw.pw_uid, pw.pw_gid)
    root = Privileged(command_prefix=[])
    pid = spawn_as(pw, f"exec 3<>{mine}; exec sleep 600")
    images = d / "images"
    try:
        time.sleep(0.5)
        root.call("criu-dump", pid=pid, images_dir=str(images), expect_uid=pw.pw_uid)
        gone(pid)
        _wait_free(pid)
        # the user's directory is now a symlink to root's
        os.rename(work, home / "real")
        os.symlink(rootdir, work)
        try:
            restored = root.call("criu-restore", images_dir=str(images))["pid"]
        except PrivilegedError as e:
            assert e.reason == "restore_failed" and "Permission denied" in e.log, e.log
        else:  # the old code: root's file, open for writing, in the user's process
            held = os.readlink(f"/proc/{restored}/fd/3")
            _end(restored)
            raise AssertionError(f"restored as root: the user's process held {held}")
        assert victim.read_bytes() == before
        assert subprocess.run(["pgrep", "-u", str(pw.pw_uid), "-x", "sleep"]).returncode == 1
        # its own directory back: restored, as the user, holding its own file
        work.unlink()
        os.rename(home / "real", work)
        _wait_free(pid)
        restored = root.call("criu-restore", images_dir=str(images))["pid"]
        try:
            status = Path(f"/proc/{restored}/status").read_text()
            assert f"Uid:\t{pw.pw_uid}\t{pw.pw_uid}\t{pw.pw_uid}\t{pw.pw_uid}" in status
            assert "CapEff:\t0000000000000000" in status
            assert os.readlink(f"/proc/{restored}/fd/3") == str(mine)
        finally:
            _end(restored)
    finally:
        gone(pid)
    assert victim.read_bytes() == before
    shutil.rmtree(d, ignore_errors=True)
