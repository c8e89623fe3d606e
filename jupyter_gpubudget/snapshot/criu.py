"""The privileged part of the CRIU backend: plain functions, standard library only.

These run as root, called in-process when the caller is root, otherwise through a privileged
launcher (``python -m jupyter_gpubudget.snapshot.privileged criu-dump|criu-restore|criu-check``
via sudo). Every argument is checked here, since the caller is less privileged than this code:
the pid must be a kernel process (a session leader, as kernels started independent are) owned
by the expected user, the images directory an absolute path.

CRIU >= 4.1 is needed on recent kernels (older ones fail on the vDSO); ``find_criu`` looks for
it: ``$GPUBUDGET_CRIU``, then the build cache of ``.ci/build-criu.sh``, then ``PATH``.
GPU memory is captured only with NVIDIA's ``cuda-checkpoint`` (whole GPUs; not MIG), found the
same way (``$GPUBUDGET_CUDA_CHECKPOINT``, then ``PATH``); a kernel holding a GPU without it is
refused with reason ``gpu_state`` rather than dumped half.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time

NETWORK_LOCK = "nftables"
MIN_VERSION = (4, 1)


class CriuError(Exception):
    """``reason``: ``no_criu``, ``bad_input``, ``not_a_kernel``, ``gpu_state``, ``pid_in_use``,
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
    """A CRIU binary that runs and is >= 4.1, or None."""
    cands = [explicit, os.environ.get("GPUBUDGET_CRIU"),
             os.path.join(_cache_dir(), "criu-4.1", "tree", "criu", "criu"), shutil.which("criu")]
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


def criu_dump(pid: int, images_dir: str, *, leave_running: bool = False,
              keep_stopped: bool = False, expect_uid: int | None = None,
              owner: tuple[int, int] | None = None, criu: str | None = None,
              cuda_checkpoint: str | None = None, timeout: float = 600) -> dict:
    """Dump the process tree rooted at ``pid`` (a kernel) into ``images_dir`` (created, mode
    0700). The kernel is gone afterwards, unless ``leave_running`` (it runs on) or
    ``keep_stopped``: its process group is stopped (SIGSTOP) before the dump and stays stopped
    after it, so that the caller can store and verify the images and only then end it, or let
    it go on if that failed (:func:`criu_finish`). ``owner`` (uid, gid): the images are handed
    to this account (the unprivileged service ingests them). GPU state is captured with
    cuda-checkpoint when the tree uses a GPU; without it the dump is refused.
    Returns ``{"pid", "seconds", "bytes", "gpu", "criu"}``."""
    pid = _check_kernel_pid(pid, expect_uid)
    images_dir = _check_dir(images_dir, must_exist=False)
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
    t0 = time.perf_counter()
    if keep_stopped:
        os.killpg(pid, signal.SIGSTOP)
        _wait_stopped(pid)
        leave_running = True
    for p in gpu_pids:
        _cuda_toggle(tool, p)  # GPU memory moves into the process: CRIU then saves it
    argv = [binary, "dump", "-t", str(pid), "-D", images_dir, "-o", "dump.log", "-v2",
            "--tcp-established", "--network-lock", NETWORK_LOCK, "--file-locks"]
    if leave_running:
        argv.append("--leave-running")
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
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
        log = _log_tail(os.path.join(images_dir, "dump.log"))
        raise CriuError("dump_failed", f"criu dump of {pid} failed (exit {p.returncode})", log)
    size = 0
    for name in os.listdir(images_dir):
        path = os.path.join(images_dir, name)
        size += os.path.getsize(path)
        if owner is not None:
            os.chown(path, *owner)
    if owner is not None:
        os.chown(images_dir, *owner)
    return {"pid": pid, "seconds": seconds, "bytes": size, "gpu": bool(gpu_pids),
            "criu": binary}


def criu_finish(pid: int, *, kill: bool, expect_uid: int | None = None) -> dict:
    """End a kernel dumped with ``keep_stopped`` (``kill``: its snapshot is safe) or let it go
    on (SIGCONT: its snapshot failed, the session keeps its kernel)."""
    pid = _check_kernel_pid(pid, expect_uid)
    os.killpg(pid, signal.SIGKILL if kill else signal.SIGCONT)
    return {"pid": pid, "killed": kill}


def criu_restore(images_dir: str, *, criu: str | None = None,
                 cuda_checkpoint: str | None = None, gpu: bool = False,
                 timeout: float = 600) -> int:
    """Restore a dumped process tree, detached (its parent is init), with its TCP connections
    and listening sockets (the kernel's ZMQ ports); returns the root pid. ``gpu``: the dump
    carried GPU state, given back to the GPU with cuda-checkpoint after the restore."""
    images_dir = _check_dir(images_dir, must_exist=True)
    binary = find_criu(criu)
    if binary is None:
        raise CriuError("no_criu", "no CRIU >= 4.1 found (run .ci/build-criu.sh)")
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
    argv = [binary, "restore", "-D", images_dir, "-o", "restore.log", "-v2",
            "--tcp-established", "--network-lock", NETWORK_LOCK, "--file-locks",
            "--restore-detached", "--pidfile", pidfile]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CriuError("restore_failed", f"criu restore took over {timeout:.0f} s") from None
    if p.returncode != 0:
        log = _log_tail(os.path.join(images_dir, "restore.log"))
        if re.search(r"Can't fork for \d+: File exists", log):
            raise CriuError("pid_in_use", "criu restore failed: a process id of the snapshot "
                            "is in use here (restore on another node, or after it is free)", log)
        raise CriuError("restore_failed", f"criu restore failed (exit {p.returncode})", log)
    with open(pidfile) as f:
        pid = int(f.read().strip())
    try:  # a tree dumped while stopped comes back stopped
        os.killpg(pid, signal.SIGCONT)
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
            "root": os.geteuid() == 0}
