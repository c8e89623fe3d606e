"""Verbs for batch jobs: ``launch`` (the spec comes as JSON on stdin) and ``signal`` (stop a
job's process group: SIGTERM, a grace period, SIGKILL).

``launch`` checks the spec again (the service already did: this is defence in depth), makes
the attempt's directory under the jobs root and its cgroup (``cgroups.py``: no cgroup, no
job, unless the config turns containment off), and forks a *monitor* that stays for the job's
lifetime: it starts the job in its cgroup and a new session as the job's user (never root:
uid 0 and system accounts are refused), records its pid, start time and cgroup, enforces
``time_limit`` (SIGTERM, grace, SIGKILL; the exit record then says ``timed_out``), waits for
it, kills what is left in its cgroup (processes that called ``setsid`` included), and writes
the exit record once the cgroup is empty. The monitor keeps the launcher's privileges, so the
job's user can neither signal it nor touch the records; if it is killed all the same, the
cgroup still says whether the job runs (``signal`` then ends it and writes the record).

A job spec::

    {"workload": "a1b2", "attempt": 1, "user": "bob",
     "command": ["/usr/bin/python3", "train.py"],         # absolute program
     "env": {"WANDB_MODE": "offline"},                     # the user's (refused names: policy)
     "job_env": {"CUDA_VISIBLE_DEVICES": "GPU-…", "GPUBUDGET_WORKLOAD": "a1b2", …},
     "time_limit": 3600, "grace": 10}

Transparent checkpoints (``checkpoint: auto`` batch jobs): ``checkpoint WORKLOAD ATTEMPT``
dumps the attempt's whole process tree with the snapshot helper (:mod:`..snapshot.criu`,
every guard of a session's dump: the tree purely the job's account's, checked live and in the
images) and leaves it stopped; ``checkpoint-end WORKLOAD ATTEMPT kill|resume`` ends it once
its images are stored (its exit record then says ``checkpointed``) or lets it go on. A tree
that cannot be dumped (a process that left it by ``setsid``, an open internet socket, a device
CRIU refuses) is refused with the reason, written to the job's log too. A spec with
``"restore": {"images_dir": DIR, "log": OLD_OUTPUT_LOG}`` (or, in place of ``images_dir``,
``"chunks": STORE_CHUNK_DIR, "files": [...]``: the images' chunks in a snapshot store, written
once straight into the restore's private directory) starts the attempt from those images
instead of its command: CRIU restores it as the job's account, into the attempt's cgroup, with
the attempt's own ``output.log`` in place of the old one (the log continues there), as a child
of the monitor (a child subreaper), which then watches it as it watches any job.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import pwd
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

from . import cgroups
from .config import LauncherConfig, LauncherError, secure_path
from .policy import SERVICE_ENV, WORKLOAD_ID, argv_problem, bad_text, env_problem
from .records import (
    create_file,
    ensure_dir,
    make_dir,
    proc_starttime,
    proc_uid,
    read_record,
    write_record,
)

MAX_SPEC_BYTES = 512 * 1024
SPEC_KEYS = {"workload", "attempt", "user", "command", "env", "job_env", "time_limit", "grace",
             "fence", "restore"}
#: in an attempt's directory while its tree is being checkpointed: the exit then says so
CHECKPOINTING = "checkpointing"
#: the highest fencing token a service replica launched with (or raised by ``fence``):
#: a launch carrying a lower one comes from a replica that no longer leads, and is refused
FENCE_FILE = ".fence"
PRIVILEGED = os.geteuid() == 0


# ---------------------------------------------------------------------------- the spec
def _account(cfg: LauncherConfig, name: object) -> pwd.struct_passwd:
    """The job's Unix account: it must exist, and (as root) be no system account."""
    if not isinstance(name, str) or not name or bad_text(name) or len(name) > 64:
        raise LauncherError("user: expected a Unix user name")
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise LauncherError(f"user: no Unix account {name!r}") from None
    if not PRIVILEGED:
        if pw.pw_uid != os.geteuid():
            raise LauncherError(f"user: {name!r} is not the launcher's own user and the launcher "
                                "is not privileged (it cannot switch users)")
        return pw
    if pw.pw_uid == 0 or pw.pw_gid == 0:
        raise LauncherError(f"user: {name!r} is root or in group root; jobs never run as root")
    if pw.pw_name in cfg.denied_users or pw.pw_uid in (65534, 4294967294, 4294967295):
        raise LauncherError(f"user: {name!r} may not run jobs (denied_users, or the overflow "
                            "account nobody)")
    if pw.pw_uid < cfg.min_uid:
        raise LauncherError(f"user: {name!r} (uid {pw.pw_uid}) is a system account "
                            f"(min_uid {cfg.min_uid})")
    if cfg.gid is not None and cfg.gid in os.getgrouplist(name, pw.pw_gid):
        raise LauncherError(f"user: {name!r} is in the service's group {cfg.group!r}: it could "
                            "read other jobs' records")
    if cfg.allowed_groups:
        import grp

        mine = set(os.getgrouplist(name, pw.pw_gid))
        ok = set()
        for g in cfg.allowed_groups:
            try:
                ok.add(grp.getgrnam(g).gr_gid)
            except KeyError:
                continue
        if not mine & ok:
            raise LauncherError(f"user: {name!r} is in none of the allowed groups "
                                f"{', '.join(cfg.allowed_groups)}")
    return pw


def _seconds(v: object, key: str, hi: float, allow_none: bool = True) -> float | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
            or not 0 <= v <= hi:
        raise LauncherError(f"{key}: expected seconds, 0..{hi:g}")
    return float(v)


def parse_spec(raw: Any, cfg: LauncherConfig) -> dict:
    if not isinstance(raw, dict):
        raise LauncherError("spec: expected a JSON object")
    unknown = set(raw) - SPEC_KEYS
    if unknown:
        raise LauncherError(f"{sorted(unknown)[0]}: unknown spec key")
    wid = raw.get("workload")
    if not isinstance(wid, str) or not WORKLOAD_ID.fullmatch(wid):
        raise LauncherError("workload: not a workload id")
    attempt = raw.get("attempt")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= 10**6:
        raise LauncherError("attempt: expected a whole number 1..1000000")
    pw = _account(cfg, raw.get("user"))
    cmd = raw.get("command")
    why = argv_problem(cmd)
    if why:
        raise LauncherError(f"{why[0]}: {why[1]}")
    assert isinstance(cmd, list)
    if not os.path.isabs(cmd[0]):
        raise LauncherError("command[0]: the program must be an absolute path")
    env = raw.get("env", {})
    why = env_problem(env)
    if why:
        raise LauncherError(f"{why[0]}: {why[1]}")
    job_env = raw.get("job_env", {})
    if not isinstance(job_env, dict):
        raise LauncherError("job_env: expected a mapping")
    for k, v in job_env.items():
        if k not in SERVICE_ENV:
            raise LauncherError(f"job_env.{k}: not a variable the service sets")
        if not isinstance(v, str) or bad_text(v) or len(v) > 65536:
            raise LauncherError(f"job_env.{k}: expected a string")
    fence = raw.get("fence")
    if fence is not None and (isinstance(fence, bool) or not isinstance(fence, int)
                              or not 0 <= fence < 2**62):
        raise LauncherError("fence: expected a whole number (the leader's fencing token)")
    restore = raw.get("restore")
    if restore is not None:
        where = ("chunks", "files") if isinstance(restore, dict) and "chunks" in restore \
            else ("images_dir",)
        if not isinstance(restore, dict) or not {*where, "log"} <= set(restore) \
                or not set(restore) <= {*where, "log", "gpu"}:
            raise LauncherError("restore: expected {images_dir, log, gpu} or "
                                "{chunks, files, log, gpu}")
        if not isinstance(restore.get("gpu", False), bool):
            raise LauncherError("restore.gpu: expected true or false")
        if "files" in restore:
            from ..snapshot.criu import CriuError, check_chunk_plan

            try:
                restore["files"] = check_chunk_plan(restore["files"])
            except CriuError as e:
                raise LauncherError(f"restore.{e.message}") from None
        for k in (*where[:1], "log"):
            v = restore[k]
            if not isinstance(v, str) or not os.path.isabs(v) or bad_text(v) or len(v) > 4096 \
                    or ":" in v or os.path.normpath(v) != v:
                raise LauncherError(f"restore.{k}: expected an absolute, normal path")
        restore = dict(restore)
    time_limit = _seconds(raw.get("time_limit"), "time_limit", 366 * 86400)
    grace = _seconds(raw.get("grace", 10.0), "grace", cfg.max_grace, allow_none=False)
    home = pw.pw_dir or "/"
    full = {"HOME": home, "USER": pw.pw_name, "LOGNAME": pw.pw_name,
            "SHELL": pw.pw_shell or "/bin/sh", "PATH": cfg.path, "LANG": "C.UTF-8"}
    full.update(env)
    full.update(cfg.env)
    full.update(job_env)
    workdir = cfg.workdir.format(home=home, user=pw.pw_name, workload=wid, attempt=attempt)
    workdir = os.path.normpath(workdir)
    if not os.path.isabs(workdir):
        raise LauncherError(f"workdir: {workdir!r} is not absolute")
    return {"workload": wid, "attempt": attempt, "pw": pw, "command": list(cmd), "env": full,
            "workdir": workdir, "time_limit": time_limit, "grace": grace, "umask": cfg.umask,
            "fence": fence, "restore": restore}


# ---------------------------------------------------------------------------- fencing
def _fence_open(cfg: LauncherConfig, token: int) -> int:
    """Lock the fence file (held until the returned fd is closed) and raise it to ``token``;
    refused when a newer token was seen — the caller's replica no longer leads."""
    fd = os.open(cfg.jobs_root / FENCE_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, 64, 0).decode(errors="replace").strip()
        seen = int(raw) if raw.isdigit() else 0
        if token < seen:
            raise LauncherError(f"fence: token {token} is stale (a replica leading with token "
                                f"{seen} runs this node's jobs now); nothing was started")
        if token > seen:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(token).encode(), 0)
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fence(cfg: LauncherConfig, args: list[str], stdin: BinaryIO) -> dict:
    """``fence TOKEN``: a service replica took over with this token; launches with a lower
    one are refused from now on (a launch already under way finishes first)."""
    if len(args) != 1 or not args[0].isdigit() or len(args[0]) > 18:
        raise LauncherError("fence takes one argument: the leader's fencing token")
    secure_path(cfg.jobs_root, "jobs_root")
    ensure_dir(cfg.jobs_root, cfg.gid)
    fd = _fence_open(cfg, int(args[0]))
    try:
        return {"fence": int(os.pread(fd, 64, 0).decode().strip() or 0)}
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- launch
def launch(cfg: LauncherConfig, args: list[str], stdin: BinaryIO) -> dict:
    if args:
        raise LauncherError("launch takes no arguments: the spec comes as JSON on stdin")
    data = stdin.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        raise LauncherError(f"spec: more than {MAX_SPEC_BYTES} bytes")
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise LauncherError(f"spec: not JSON ({e})") from None
    spec = parse_spec(raw, cfg)
    gid = cfg.gid
    secure_path(cfg.jobs_root, "jobs_root")
    ensure_dir(cfg.jobs_root, gid)
    # fenced: held (flock) until the job has started, so a takeover waits for it
    fence_fd = _fence_open(cfg, spec["fence"]) if spec["fence"] is not None else None
    try:
        return _launch(cfg, spec, gid, fence_fd)
    finally:
        if fence_fd is not None:
            os.close(fence_fd)


def _launch(cfg: LauncherConfig, spec: dict, gid: int | None, fence_fd: int | None) -> dict:
    wdir = cfg.jobs_root / spec["workload"]
    ensure_dir(wdir, gid)
    adir = wdir / str(spec["attempt"])
    already = LauncherError(f"attempt {spec['attempt']} of {spec['workload']} was already "
                            "launched")
    if os.path.lexists(adir):
        raise already
    spec["cgroup"] = None
    if cfg.contain:
        try:
            root = cgroups.find_root(cfg.cgroup_root)
            spec["cgroup"] = str(cgroups.prepare(root, cgroups.job_name(spec["workload"],
                                                                        spec["attempt"])))
        except cgroups.ContainmentError as e:
            raise LauncherError(f"containment: the job was not started: {e}") from None
    try:
        make_dir(adir, gid)
    except FileExistsError:
        raise already from None
    out_fd = create_file(adir / "output.log", gid)
    log_fd = create_file(adir / "launcher.log", gid)
    r, w = os.pipe()
    sys.stdout.flush()
    monitor = os.fork()
    if monitor == 0:
        code = 1
        try:
            if fence_fd is not None:  # (the lock is the launch's, not the job's)
                os.close(fence_fd)
            os.close(r)
            code = _monitor(spec, adir, gid, out_fd, log_fd, w)
        except BaseException as e:  # noqa: BLE001 - the monitor reports and ends, whatever
            try:
                os.write(log_fd, f"{time.ctime()} monitor failed: {e!r}\n".encode())
                os.write(w, json.dumps({"error": f"monitor failed: {e}"}).encode())
            except OSError:
                pass
        os._exit(code)
    os.close(w)
    os.close(out_fd)
    os.close(log_fd)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    try:
        report = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        report = {}
    if "error" in report or "pid" not in report:
        raise LauncherError(f"the job did not start: {report.get('error', 'no report')}")
    return {"pid": report["pid"], "user": spec["pw"].pw_name, "dir": str(adir),
            "monitor_pid": monitor}


def _note(log_fd: int, text: str) -> None:
    try:
        os.write(log_fd, f"{time.strftime('%Y-%m-%d %H:%M:%S %z')} {text}\n".encode())
    except OSError:
        pass


def _monitor(spec: dict, adir: Path, gid: int | None, out_fd: int, log_fd: int,
             report_fd: int) -> int:
    """The monitor process: start the job, record it, wait for it, record how it ended."""
    os.setsid()  # out of the service's session: a service restart does not touch it
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # never hold the launcher's stdout (the service reads it to EOF)
        os.dup2(null, fd)
    os.close(null)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only root (or the service's user) could send them
    pw = spec["pw"]
    cg = spec["cgroup"]
    restored = False
    if spec.get("restore"):
        job, failure = _restore_job(spec, out_fd, log_fd)
        if failure:  # the fallback: the command from its start, and the log says why
            why = failure.decode(errors="replace").strip()
            _note(log_fd, f"not restored ({why}): the job starts again from the beginning")
            try:
                os.write(out_fd, f"[gpubudget {time.strftime('%H:%M:%S')}] this job's "
                         f"checkpoint could not be restored ({why.splitlines()[0][:500]}); it "
                         "starts again from the beginning\n".encode())
            except OSError:
                pass
        else:
            restored = True
            os.close(out_fd)
    if not restored:
        err_r, err_w = os.pipe()
        job = os.fork()
        if job == 0:
            os.close(err_r)
            _exec_job(spec, out_fd, err_w)  # never returns
        os.close(err_w)
        os.close(out_fd)
        failure = b""
        while chunk := os.read(err_r, 65536):  # EOF at the job's exec (close-on-exec)
            failure += chunk
        os.close(err_r)
    if failure:
        if job > 0:
            os.waitpid(job, 0)
        if cg:
            cgroups.end(cg)
        msg = failure.decode(errors="replace")
        _note(log_fd, f"could not start the job as {pw.pw_name}: {msg}")
        write_record(adir / "exit", {"exit_code": 127, "ended_at": time.time(),
                                     "timed_out": False, "error": msg}, gid)
        os.write(report_fd, json.dumps({"error": msg}).encode())
        os.close(report_fd)
        return 0
    launched = time.time()
    record = {"pid": job, "pgid": job, "start": proc_starttime(job), "uid": pw.pw_uid,
              "user": pw.pw_name, "monitor_pid": os.getpid(),
              "monitor_start": proc_starttime(os.getpid()), "launched_at": launched,
              "time_limit": spec["time_limit"], "cgroup": cg}
    write_record(adir / "pid", record, gid)
    if restored:
        _note(log_fd, f"restored the checkpointed job as {pw.pw_name} (uid {pw.pw_uid}), pid "
                      f"{job}: it continues where it stopped")
    else:
        _note(log_fd, f"started {spec['command'][0]} as {pw.pw_name} (uid {pw.pw_uid}), pid "
                      f"{job}, in {spec['workdir']}")
    os.write(report_fd, json.dumps({"pid": job}).encode())
    os.close(report_fd)

    grace = spec["grace"]
    timed_out = False
    limit = spec["time_limit"]
    deadline = launched + limit if limit is not None else None
    if not _exited(job, None if deadline is None else deadline - time.time()):
        timed_out = True
        _note(log_fd, f"time limit {limit:g} s reached: SIGTERM, then SIGKILL after {grace:g} s")
        _kill(job, signal.SIGTERM)
        if cg:
            cgroups.signal_all(cg, signal.SIGTERM)
        if not _exited(job, grace):
            _kill(job, signal.SIGKILL)
            if cg:
                cgroups.kill(cg)
    _, status = os.waitpid(job, 0)
    code = os.waitstatus_to_exitcode(status)
    if cg:  # what the job left behind ends with it, wherever it went: its cgroup empties
        end_cgroup(cg, min(grace, 5.0))
    else:
        end_group(job, min(grace, 5.0))  # containment off: its process group only
    ended = time.time()  # the GPU was held until now
    checkpointed = os.path.exists(adir / CHECKPOINTING)
    write_record(adir / "exit", {"exit_code": code, "ended_at": ended, "timed_out": timed_out,
                                 "signal": -code if code < 0 else None,
                                 "checkpointed": checkpointed}, gid)
    _note(log_fd, f"ended with {code}" + (" (time limit)" if timed_out else "")
          + (" (checkpointed: the next attempt continues from its images)"
             if checkpointed else ""))
    return 0


def _restore_job(spec: dict, out_fd: int, log_fd: int) -> tuple[int, bytes]:
    """Restore the checkpointed job of ``spec["restore"]`` (in the monitor): (its pid, b"") or
    (-1, why not). A forked child joins the attempt's cgroup and runs the snapshot helper's
    restore (CRIU as the job's account; every task of the images must be that account's and
    hold nothing it may not): what CRIU restores is born in the cgroup, and once CRIU exits it
    is the monitor's child (a child subreaper), so it is waited for like a started job."""
    import ctypes

    from ..snapshot.criu import CriuError, criu_restore
    from ..snapshot.criuimages import ImageError, task_creds

    pw = spec["pw"]
    images = spec["restore"].get("images_dir")
    # from a store's chunks: written once into the restore's private directory, where the
    # same check is made (expect_owner) before anything is restored
    chunks = None if images else (spec["restore"]["chunks"], spec["restore"]["files"])
    if images:
        try:
            uids = {u for t in task_creds(images) for u in t.uids}
        except (ImageError, OSError) as e:
            return -1, f"restore: the checkpoint's images cannot be read: {e}".encode()
        if uids != {pw.pw_uid}:
            return -1, (f"restore: the checkpoint holds processes of uids {sorted(uids)}, not "
                        f"only {pw.pw_name}'s (uid {pw.pw_uid}): refused").encode()
    # the store is the account's that called the launcher (sudo's caller): its chunks must
    # be that account's files; root calling directly may name any
    sudo_uid = os.environ.get("SUDO_UID", "")
    chunk_owner = int(sudo_uid) if sudo_uid.isdigit() and int(sudo_uid) != 0 else None
    took: dict[str, float] = {}
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        return -1, b"restore: the monitor cannot become a child subreaper"
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        try:
            # the monitor ignores these; CRIU (which ends its helpers with SIGTERM) and the
            # job must not inherit that
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            if spec["cgroup"]:
                cgroups.join(spec["cgroup"])
            os.environ.pop("SUDO_UID", None)  # the launcher acts for the job's account here
            key = spec["restore"]["log"].lstrip("/")
            pid = criu_restore(images, inherit={out_fd: key},
                               gpu=bool(spec["restore"].get("gpu")), chunks=chunks,
                               chunk_owner=chunk_owner,
                               expect_owner=pw.pw_uid if chunks else None, seconds=took)
            os.write(w, json.dumps({"pid": pid, "seconds": took}).encode())
        except CriuError as e:
            os.write(w, json.dumps({"error": f"{e.reason}: {e.message}"
                                    + (f"\n{e.log}" if e.log else "")}).encode()[:8000])
        except BaseException as e:  # noqa: BLE001
            os.write(w, json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()[:8000])
        os._exit(0)
    os.close(w)
    raw = b""
    while chunk := os.read(r, 65536):
        raw += chunk
    os.close(r)
    os.waitpid(child, 0)
    try:
        out = json.loads(raw or b"{}")
    except ValueError:
        out = {}
    if "pid" not in out:
        return -1, str(out.get("error", "restore: no answer")).encode()
    took = out.get("seconds") or {}
    _note(log_fd, "restored from " + (images or f"the snapshot store {spec['restore']['chunks']}")
          + (f" (images written in {took['images']:.2f} s, CRIU restored them in "
             f"{took['criu']:.2f} s)" if {"images", "criu"} <= set(took) else ""))
    return int(out["pid"]), b""


def _exited(child: int, timeout: float | None) -> bool:
    """Wait up to ``timeout`` seconds (None: for ever) for ``child`` to exit, without reaping
    it. A pidfd where the kernel has them, else polling."""
    try:
        pidfd = os.pidfd_open(child)
    except OSError:
        pidfd = None
    if pidfd is not None:
        try:
            ready, _, _ = select.select([pidfd], [], [], None if timeout is None
                                        else max(0.0, timeout))
            return bool(ready)
        finally:
            os.close(pidfd)
    end = None if timeout is None else time.monotonic() + timeout
    while end is None or time.monotonic() < end:
        if os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(0.1)
    return os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _exec_job(spec: dict, out_fd: int, err_w: int) -> None:
    """In the job's process: its cgroup, a new session, the user's identity, the workdir,
    exec."""
    try:
        if spec["cgroup"]:
            cgroups.join(spec["cgroup"])  # as root, before anything of the user's runs
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        pw = spec["pw"]
        if PRIVILEGED:
            os.setgroups(os.getgrouplist(pw.pw_name, pw.pw_gid))
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            if (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) != (
                    pw.pw_uid, pw.pw_uid, pw.pw_gid, pw.pw_gid) or 0 in os.getgroups():
                raise PermissionError("could not drop root's identity")
            try:
                os.setuid(0)
            except PermissionError:
                pass
            else:
                raise PermissionError("root could be regained")
        os.umask(spec["umask"])
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE,
                    signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.makedirs(spec["workdir"], 0o700, exist_ok=True)  # as the user: their permissions
        os.chdir(spec["workdir"])
        os.execve(spec["command"][0], spec["command"], spec["env"])
    except BaseException as e:  # noqa: BLE001
        try:
            os.write(err_w, f"{type(e).__name__}: {e}".encode()[:4000])
        finally:
            os._exit(127)


def _kill(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (zombies waiting for a parent do not)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def end_group(pgid: int, grace: float) -> None:
    """SIGTERM what is left of a process group, SIGKILL it after ``grace`` seconds."""
    if not _group_alive(pgid):
        return
    _kill(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.05)
    if _group_alive(pgid):
        _kill(pgid, signal.SIGKILL)


def end_cgroup(cg: str, grace: float) -> None:
    """SIGTERM everything in the cgroup, SIGKILL it all after ``grace`` seconds, and return
    once it is empty (then remove it)."""
    if cgroups.populated(cg):
        cgroups.signal_all(cg, signal.SIGTERM)
        cgroups.wait_empty(cg, grace)
    cgroups.end(cg)


# ---------------------------------------------------------------------------- signal
def signal_job(cfg: LauncherConfig, args: list[str], stdin: BinaryIO) -> dict:
    """``signal WORKLOAD ATTEMPT GRACE``: SIGTERM the attempt's process group, SIGKILL it after
    GRACE seconds. Only a group this launcher started, and only while it is the same one: the
    pid record must be the launcher's own, and the job (or its monitor) must still be the
    process recorded (same start time, same user)."""
    if len(args) != 3:
        raise LauncherError("usage: signal WORKLOAD ATTEMPT GRACE_SECONDS")
    wid, attempt_s, grace_s = args
    if not WORKLOAD_ID.fullmatch(wid) or not attempt_s.isdigit() or not 1 <= int(attempt_s) <= 10**6:
        raise LauncherError("signal: not a workload id and attempt")
    try:
        grace = _seconds(float(grace_s), "grace", cfg.max_grace, allow_none=False)
    except ValueError:
        raise LauncherError("grace: expected seconds") from None
    assert grace is not None
    adir = cfg.jobs_root / wid / attempt_s
    secure_path(cfg.jobs_root, "jobs_root")
    me = os.geteuid()
    rec = read_record(adir / "pid", trusted_uid=me)
    if rec is None:
        return {"signalled": False, "reason": "no pid record written by the launcher",
                "exit": read_record(adir / "exit", trusted_uid=me)}
    try:
        pid, start, uid = int(rec["pid"]), str(rec["start"]), int(rec["uid"])
        mpid, mstart = int(rec["monitor_pid"]), str(rec["monitor_start"])
    except (KeyError, TypeError, ValueError):
        raise LauncherError("the pid record is damaged") from None
    if pid <= 1 or mpid <= 1:
        raise LauncherError("the pid record is damaged")
    cg = rec.get("cgroup")
    if cg is not None and not (isinstance(cg, str) and os.path.isabs(cg)
                               and os.path.basename(cg) == cgroups.job_name(wid, int(attempt_s))):
        raise LauncherError("the pid record is damaged (cgroup)")
    monitor_alive = proc_starttime(mpid) == mstart and proc_uid(mpid) == me
    job_alive = proc_starttime(pid) == start and proc_uid(pid) == uid
    contained = bool(cg) and cgroups.populated(cg)
    if not (monitor_alive or job_alive or contained):
        exit_rec = read_record(adir / "exit", trusted_uid=me)
        if exit_rec is None and cg:  # its monitor was killed; its cgroup is empty now
            exit_rec = _monitor_lost(adir, cg, cfg.gid)
        return {"signalled": False, "reason": "not running", "exit": exit_rec}
    _kill(pid, signal.SIGTERM)  # the job's group: its pgid is its pid (a new session)
    if cg:  # and every process of its cgroup, wherever it went
        cgroups.signal_all(cg, signal.SIGTERM)
        if not cgroups.wait_empty(cg, grace):
            cgroups.kill(cg)
        cgroups.wait_empty(cg)
    else:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _group_alive(pid):
            time.sleep(0.05)
        if _group_alive(pid):
            _kill(pid, signal.SIGKILL)
    exit_rec = None
    deadline = time.monotonic() + 10
    while monitor_alive and time.monotonic() < deadline:  # the monitor writes the exit record
        exit_rec = read_record(adir / "exit", trusted_uid=me)
        if exit_rec is not None or proc_starttime(mpid) != mstart:
            break
        time.sleep(0.05)
    exit_rec = exit_rec or read_record(adir / "exit", trusted_uid=me)
    if exit_rec is None and cg and proc_starttime(mpid) != mstart:
        exit_rec = _monitor_lost(adir, cg, cfg.gid)
    return {"signalled": True, "exit": exit_rec}


def _monitor_lost(adir: Path, cg: str, gid: int | None) -> dict:
    """The exit record of a job whose monitor was killed, written once its cgroup is empty:
    nobody could wait for the job, so its exit code is unknown; it ended when its cgroup was
    found empty (its charge runs to then)."""
    rec = {"exit_code": None, "ended_at": time.time(), "timed_out": False, "signal": None,
           "monitor_lost": True,
           "error": "the job's monitor was killed: its exit code is unknown"}
    write_record(adir / "exit", rec, gid)
    cgroups.remove(cg)
    return rec


# ---------------------------------------------------------------------------- checkpoint
def _attempt_args(cfg: LauncherConfig, args: list[str], n: int, usage: str
                  ) -> tuple[str, str, Path]:
    if len(args) != n:
        raise LauncherError(f"usage: {usage}")
    wid, attempt_s = args[0], args[1]
    if not WORKLOAD_ID.fullmatch(wid) or not attempt_s.isdigit() or not 1 <= int(attempt_s) <= 10**6:
        raise LauncherError(f"{usage.split()[0]}: not a workload id and attempt")
    secure_path(cfg.jobs_root, "jobs_root")
    return wid, attempt_s, cfg.jobs_root / wid / attempt_s


def _running_job(adir: Path, wid: str, attempt_s: str) -> dict | None:
    """The attempt's pid record while its job runs (the same process as recorded), else None."""
    rec = read_record(adir / "pid", trusted_uid=os.geteuid())
    if rec is None:
        return None
    try:
        pid, start, uid = int(rec["pid"]), str(rec["start"]), int(rec["uid"])
    except (KeyError, TypeError, ValueError):
        raise LauncherError("the pid record is damaged") from None
    cg = rec.get("cgroup")
    if pid <= 1 or (cg is not None and not (
            isinstance(cg, str) and os.path.isabs(cg)
            and os.path.basename(cg) == cgroups.job_name(wid, int(attempt_s)))):
        raise LauncherError("the pid record is damaged")
    if proc_starttime(pid) != start or proc_uid(pid) != uid:
        return None
    return {"pid": pid, "uid": uid, "cgroup": cg}


def _inet_sockets(pids: list[int]) -> list[str]:
    """The internet sockets (TCP, UDP) the processes hold: CRIU cannot take a connection to
    another machine along with the job (it would come back closed)."""
    inodes: dict[str, int] = {}
    for p in pids:
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                t = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            if t.startswith("socket:["):
                inodes[t[8:-1]] = p
    found = []
    if not inodes:
        return found
    for p in pids[:1]:
        for proto in ("tcp", "tcp6", "udp", "udp6"):
            try:
                with open(f"/proc/{p}/net/{proto}") as f:
                    lines = f.read().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                cols = line.split()
                if len(cols) > 9 and cols[9] in inodes:
                    found.append(f"process {inodes[cols[9]]} holds a {proto} socket "
                                 f"({cols[1]} -> {cols[2]})")
    return found


def _job_note(adir: Path, text: str) -> None:
    """A line for the researcher in the job's own output (appended; a regular file only)."""
    try:
        fd = os.open(adir / "output.log", os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        os.write(fd, f"\n[gpubudget {time.strftime('%H:%M:%S')}] {text}\n".encode())
    finally:
        os.close(fd)


def checkpoint_job(cfg: LauncherConfig, args: list[str], stdin: BinaryIO) -> dict:
    """``checkpoint WORKLOAD ATTEMPT``: dump the running attempt's process tree (everything in
    its cgroup) with the snapshot helper and leave it stopped; ``{"checkpointed": true,
    "images_dir", "bytes", "seconds", "gpu", "log"}`` (the images handed to the caller's
    account), or ``{"checkpointed": false, "reason"}`` with the job running on as before."""
    from ..snapshot.criu import CriuError, _tree, criu_dump

    wid, attempt_s, adir = _attempt_args(cfg, args, 2, "checkpoint WORKLOAD ATTEMPT")
    job = _running_job(adir, wid, attempt_s)
    if job is None:
        return {"checkpointed": False, "reason": "not running"}
    log_fd = os.open(adir / "launcher.log", os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)

    def refuse(why: str) -> dict:
        _note(log_fd, f"not checkpointed: {why}")
        _job_note(adir, f"this job could not be checkpointed ({why}); it is stopped and will "
                        "start again from the beginning")
        os.close(log_fd)
        return {"checkpointed": False, "reason": why}

    pid, cg = job["pid"], job["cgroup"]
    tree = _tree(pid)
    if cg:
        try:
            stray = sorted(set(cgroups.parse_procs((Path(cg) / "cgroup.procs").read_text()))
                           - set(tree))
        except OSError as e:
            return refuse(f"its cgroup cannot be read ({e})")
        if stray:
            return refuse(f"process {stray[0]} left the job's process tree (setsid or a "
                          "daemon): CRIU dumps one tree")
    why = _inet_sockets(tree)
    if why:
        return refuse(f"{why[0]}: a connection to another machine cannot be checkpointed")
    caller = os.environ.get("SUDO_UID", "")
    caller_gid = os.environ.get("SUDO_GID", "")
    owner = (int(caller), int(caller_gid or caller)) if caller.isdigit() else \
        (os.getuid(), os.getgid())
    os.environ.pop("SUDO_UID", None)  # the launcher acts for the job's account (checked above)
    write_record(adir / CHECKPOINTING, {"at": time.time()}, cfg.gid)
    try:
        out = criu_dump(pid, keep_stopped=True, expect_uid=job["uid"], owner=owner,
                        own_cgroup=bool(cg))
    except (CriuError, OSError) as e:
        _unlink(adir / CHECKPOINTING)
        _kill(pid, signal.SIGCONT)  # never left stopped
        if cg:
            cgroups.signal_all(cg, signal.SIGCONT)
        return refuse(f"{e.reason}: {e.message}" if isinstance(e, CriuError) else str(e))
    _note(log_fd, f"checkpointed: {out['bytes']} bytes of images in {out['seconds']:.2f} s; "
                  "stopped until they are stored")
    os.close(log_fd)
    return {"checkpointed": True, "images_dir": out["images_dir"], "bytes": out["bytes"],
            "seconds": out["seconds"], "gpu": out["gpu"], "log": str(adir / "output.log"),
            "pid": pid}


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def checkpoint_end(cfg: LauncherConfig, args: list[str], stdin: BinaryIO) -> dict:
    """``checkpoint-end WORKLOAD ATTEMPT kill|resume``: end a checkpointed attempt (its images
    are stored: its exit record says ``checkpointed``) or let it go on (they could not be)."""
    wid, attempt_s, adir = _attempt_args(cfg, args, 3,
                                         "checkpoint-end WORKLOAD ATTEMPT kill|resume")
    if args[2] not in ("kill", "resume"):
        raise LauncherError("checkpoint-end: the third argument is kill or resume")
    job = _running_job(adir, wid, attempt_s)
    me = os.geteuid()
    if job is None:
        _unlink(adir / CHECKPOINTING)
        return {"ended": False, "exit": read_record(adir / "exit", trusted_uid=me)}
    pid, cg = job["pid"], job["cgroup"]
    if args[2] == "resume":
        _unlink(adir / CHECKPOINTING)
        if cg:
            cgroups.signal_all(cg, signal.SIGCONT)
        _kill(pid, signal.SIGCONT)
        _job_note(adir, "its checkpoint could not be stored: the job goes on")
        return {"ended": False, "resumed": True}
    _job_note(adir, "checkpointed: the job continues where it stopped when it runs again")
    if cg:
        cgroups.kill(cg)
        cgroups.wait_empty(cg)
    else:
        _kill(pid, signal.SIGKILL)
    exit_rec = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        exit_rec = read_record(adir / "exit", trusted_uid=me)
        if exit_rec is not None:
            break
        time.sleep(0.02)
    return {"ended": True, "exit": exit_rec}
