"""The directory-exchange race against a batch job's restore, with the real CRIU and the real
launcher (as root), the job running as the attacker's account of ``test_criu_helper``.

The attacker's job held ``work/target`` (its own file) open read-write when it was
checkpointed. While its checkpoint is restored again and again (each time as a new attempt of
the job, as a requeue would), two of its own processes run — the exchanger and the grabber of
``test_restore_race`` (the same programs): ``work`` is swapped with a symlink to a root-owned
directory holding root's 0644 file of the same size, from one moment to the next; every
descriptor of every process of the attacker's uid is taken with ``pidfd_getfd``, checked
against what the attacker may open, and written into when it is root's.

The launcher restores with CRIU running as the job's account, so whichever directory the
name resolves to, the open is the job's own: root's file must be unchanged afterwards, and no
process of the attacker may ever have held a ``target`` it could not open itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

from tests.fixtures.unixusers import shared_tmp

from .test_criu_helper import USER, attacker  # noqa: F401 - the fixture
from .test_job_dump_attacks import counter, counts, launcher, nodes, wait_for  # noqa: F401
from .test_restore_race import EXCHANGER, PY3, _opened_for_writing, _read_json

RESTORES = 20

#: the grabber of ``test_restore_race``, looking only at the race's names (a job's stdout is
#: the attempt's log, the launcher's file handed to the job), and going on when a process
#: ends under it (jobs that could not be restored start again, and end, all along)
JOB_GRABBER = r"""
import ctypes, errno, json, os, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_PIDFD_GETFD = 438
uid, out, stop = os.getuid(), sys.argv[1], sys.argv[2]
me = {os.getpid(), os.getppid()}
found, seen = [], set()

def note(kind, **kw):
    found.append(dict(kind=kind, **kw))
    with open(out + ".tmp", "w") as f:
        json.dump({"found": found}, f)
    os.replace(out + ".tmp", out)

def look(pid, pidfd, fd):
    mine = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(fd), 0)
    if mine < 0:
        return
    try:
        st = os.fstat(mine)
        target = os.readlink(f"/proc/self/fd/{mine}")
        if not stat.S_ISREG(st.st_mode) or not target.endswith("/target"):
            return
        with open(f"/proc/self/fdinfo/{mine}") as f:
            flags = next(int(l.split()[1], 8) for l in f if l.startswith("flags:"))
        with open(f"/proc/{pid}/stat") as f:  # one incarnation of the pid
            start = int(f.read().rsplit(")", 1)[1].split()[19])
        if (pid, start, target) not in seen:
            seen.add((pid, start, target))
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
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    look(pid, pidfd, fd)
                except (OSError, ValueError, StopIteration):
                    continue  # (the process ended under us)
        except OSError:
            pass
        finally:
            os.close(pidfd)
note("done", rounds=rounds)
"""


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def test_the_exchange_race_never_reaches_roots_file_through_a_job_restore(
        nodes, attacker):  # noqa: F811
    pw = attacker
    a, b = nodes
    d = shared_tmp("gbt-job-race-")
    rootdir = d / "rootdir"  # root's directory, with root's 0644 file
    rootdir.mkdir(mode=0o755)
    victim = rootdir / "target"
    victim.write_text("root's own configuration line\n")
    os.chmod(victim, 0o644)
    before = victim.read_bytes()
    home = d / "u"  # the attacker's directory: its own names to exchange
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
    tools = d / "tools"
    tools.mkdir(mode=0o755)
    (tools / "exchanger.py").write_text(EXCHANGER)
    (tools / "grabber.py").write_text(JOB_GRABBER)
    out = home / "out"
    out.mkdir()
    os.chown(out, pw.pw_uid, pw.pw_gid)
    stop = out / "stop"

    wid = f"jr{os.getpid():x}"
    rc, first = launcher(a["cfg"], "launch", spec={
        "workload": wid, "attempt": 1, "user": USER, "command": counter(str(mine))})
    assert rc == 0, first
    log1 = a["jobs"] / wid / "1" / "output.log"
    wait_for(lambda: len(counts(log1)) > 3)
    rc, ck = launcher(a["cfg"], "checkpoint", wid, "1")
    assert rc == 0 and ck["checkpointed"], ck
    rc, _ = launcher(a["cfg"], "checkpoint-end", wid, "1", "kill")
    assert rc == 0
    helpers: list[subprocess.Popen] = []
    outcomes = {"restored": 0, "started again": 0}
    grabbed_restored = 0
    try:
        for script, args in (("exchanger.py", [str(work), str(swap), str(out / "count"),
                                                str(stop)]),
                             ("grabber.py", [str(out / "grabbed.json"), str(stop)])):
            helpers.append(subprocess.Popen(
                ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups",
                 "--reset-env", "--", PY3, str(tools / script), *args],
                start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=open(out / f"{script}.err", "wb")))  # noqa: SIM115
        for attempt in range(2, 2 + RESTORES):
            rc, res = launcher(b["cfg"], "launch", spec={
                "workload": wid, "attempt": attempt, "user": USER,
                "command": counter(str(mine)),
                "restore": {"images_dir": ck["images_dir"], "log": str(log1)}})
            adir = b["jobs"] / wid / str(attempt)
            try:
                if rc != 0:  # (its fresh start failed: its open of root's file was refused)
                    outcomes["started again"] += 1
                    continue
                rpid = res["pid"]
                if "restored the checkpointed job" in (adir / "launcher.log").read_text():
                    outcomes["restored"] += 1
                    start = _start_time(rpid)
                    deadline = time.monotonic() + 10  # the grabber's turn at it
                    while not any(f.get("pid") == rpid and f.get("start") == start
                                  for f in _read_json(out / "grabbed.json")["found"]) and \
                            time.monotonic() < deadline:
                        time.sleep(0.02)
                else:
                    outcomes["started again"] += 1
                # what the job holds, seen by root: no file of another account for writing
                for fd in os.listdir(f"/proc/{rpid}/fd") if os.path.exists(
                        f"/proc/{rpid}") else []:
                    link = f"/proc/{rpid}/fd/{fd}"
                    try:
                        st = os.stat(link)
                        target = os.readlink(link)
                    except OSError:
                        continue
                    assert not target.endswith("/target") or st.st_uid == pw.pw_uid or \
                        not _opened_for_writing(rpid, fd), \
                        f"attempt {attempt} (pid {rpid}) holds {target} for writing"
            finally:
                launcher(b["cfg"], "signal", wid, str(attempt), "1")
    finally:
        stop.touch()
        for h in helpers:
            try:
                h.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(h.pid, signal.SIGKILL)
                h.wait()
        subprocess.run(["rm", "-rf", ck["images_dir"]], check=False)
    grabbed = _read_json(out / "grabbed.json")
    exchanges = int((out / "count").read_text() or 0) if (out / "count").exists() else 0
    grabbed_restored = sum(1 for f in grabbed["found"]
                           if f["kind"] == "seen" and f.get("target") == str(mine))
    summary = {"outcomes": outcomes, "exchanges": exchanges,
               "grabbed_restored": grabbed_restored}
    print(json.dumps(summary))
    # the race's names only: a job's own output log is the launcher's file, handed to it
    bad = [f for f in grabbed["found"] if f["kind"] in ("could_not_open", "wrote")
           and str(f.get("target", "")).endswith("/target")]
    assert victim.read_bytes() == before, f"root's file was written: {bad} {summary}"
    assert not bad, f"a job's process held what its user may not open: {bad} {summary}"
    # the attack really ran: names exchanged all along, restored jobs' descriptors reached
    assert exchanges > 0, summary
    assert any(f["kind"] == "done" for f in grabbed["found"]), grabbed
    assert outcomes["restored"] > 0 and grabbed_restored > 0, summary
    shutil.rmtree(d, ignore_errors=True)
