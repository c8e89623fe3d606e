"""MPS control daemons, one per GPU that carries MPS shares, and the launcher's verbs that
run them as root (``mps-acquire``, ``mps-release``, ``mps-ensure``).

When the first share lands on a GPU, ``nvidia-cuda-mps-control -d`` is started for it with
``CUDA_VISIBLE_DEVICES`` set to that GPU alone and its own directories::

    <root>/                      0711  (job users reach their GPU's pipe directory, list nothing)
    <root>/<gpu id>/             0711
    <root>/<gpu id>/pipe/        0700 when jobs run as the daemon's user, else 0711
    <root>/<gpu id>/log/         0700  (control.log, server.log: the daemon's own)
    <root>/<gpu id>/holders/     0700  one empty file per share holding the daemon

A share's process gets ``CUDA_MPS_PIPE_DIRECTORY=<root>/<gpu id>/pipe``. When the last share on
the GPU ends, the daemon is told to ``quit`` through the same pipe directory. The holders are
files, so the count survives a restart of the service, and ``fcntl`` locks keep two processes
sharing the root consistent. A daemon found dead while shares hold it is started again.

Who runs the daemons: the service itself when jobs run as its own user (isolation off) or when
it is root; under sudo isolation the jobs run as their users' accounts, whose MPS servers only
a root daemon can start, so the unprivileged service asks the launcher (these verbs, root,
``mps_root`` / ``mps_control`` from the launcher's config, never from the caller).

Nothing here changes a GPU's compute mode (MPS works in the default mode; an admin who wants
``EXCLUSIVE_PROCESS`` sets it). Without the binary or without an NVIDIA driver nothing is
assumed: :meth:`MpsDaemons.missing` says what is missing and :meth:`MpsDaemons.acquire` raises
:class:`MpsUnavailable` with that sentence, so the share does not start unconfined. Standard
library only: the launcher runs as root.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from .config import DRIVER_PROBE, LauncherConfig, LauncherError, secure_path

log = logging.getLogger("gpubudget.mps")

CONTROL = "nvidia-cuda-mps-control"


class MpsUnavailable(RuntimeError):
    """The MPS control daemon cannot run here (or did not start); the message says why."""


def _key(text: str) -> str:
    """A file name for a GPU id or a holder (ids are [A-Za-z0-9-] already; anything else
    becomes '_', and a leading dot is refused)."""
    out = re.sub(r"[^A-Za-z0-9._-]", "_", text)
    if not out or out.startswith("."):
        out = "_" + out
    return out


class MpsDaemons:
    """Reference-counted MPS control daemons, one per GPU (see the module docstring).

    ``control``: the program (a name looked up on PATH, or a path). ``other_users``: jobs run
    as other Unix users than this process (then the pipe directory must be reachable by them,
    and the daemon must run as root to start MPS servers for them). ``timeout``: seconds for
    one call of the program and for a started daemon to answer."""

    def __init__(self, root: str | Path, control: str = CONTROL,
                 driver_probe: str | Path = DRIVER_PROBE, other_users: bool = False,
                 timeout: float = 10.0, logger: logging.Logger | None = None) -> None:
        self.root = Path(root).absolute()
        self.control = control
        self.driver_probe = Path(driver_probe)
        self.other_users = other_users
        self.timeout = timeout
        self.log = logger or log
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ what is there
    def program(self) -> str | None:
        return shutil.which(self.control)

    def missing(self) -> str | None:
        """Why no MPS control daemon can run here, or None."""
        if self.program() is None:
            where = "" if os.sep in self.control else f" on PATH ({os.environ.get('PATH', '')})"
            return (f"MPS shares need the NVIDIA MPS control daemon: {self.control!r} is not "
                    f"found{where}; install the NVIDIA driver's utilities")
        if not self.driver_probe.exists():
            return (f"MPS shares need an NVIDIA driver: {self.driver_probe} is missing (no "
                    "driver loaded)")
        if self.other_users and os.geteuid() != 0:
            return ("MPS shares of jobs that run as other users need the MPS control daemon "
                    "to run as root (it starts each user's MPS server); this service runs "
                    "unprivileged")
        return None

    def dirs(self, gpu: str) -> tuple[Path, Path]:
        """(pipe directory, log directory) of ``gpu``'s daemon."""
        base = self.root / _key(gpu)
        return base / "pipe", base / "log"

    def holders(self, gpu: str) -> set[str]:
        d = self.root / _key(gpu) / "holders"
        try:
            return {p.name for p in d.iterdir()}
        except FileNotFoundError:
            return set()

    def held_by(self, holder: str) -> list[str]:
        """GPUs whose daemon ``holder`` holds."""
        return [g for g in self.gpus() if _key(holder) in self.holders(g)]

    def gpus(self) -> list[str]:
        """GPUs with a daemon directory (held or not)."""
        try:
            return sorted(p.name for p in self.root.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []

    # ------------------------------------------------------------------ the program
    def _env(self, gpu: str) -> dict[str, str]:
        pipe, logdir = self.dirs(gpu)
        return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                "LANG": "C.UTF-8", "CUDA_VISIBLE_DEVICES": gpu,
                "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logdir)}

    def _run(self, gpu: str, args: list[str], stdin: str = "") -> subprocess.CompletedProcess:
        prog = self.program()
        if prog is None:
            raise MpsUnavailable(self.missing() or f"{self.control} not found")
        return subprocess.run([prog, *args], input=stdin.encode(), capture_output=True,
                              env=self._env(gpu), cwd="/", timeout=self.timeout)

    def alive(self, gpu: str) -> bool:
        """Does ``gpu``'s daemon answer (the front end exits 0 only when it reaches it)?"""
        if not (self.dirs(gpu)[0]).is_dir() or self.program() is None:
            return False
        try:
            return self._run(gpu, [], "get_server_list\n").returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _prepare(self, gpu: str) -> None:
        pipe, logdir = self.dirs(gpu)
        reach = 0o711 if self.other_users else 0o700
        for d, mode in ((self.root, 0o711), (pipe.parent, 0o711), (pipe, reach),
                        (logdir, 0o700), (pipe.parent / "holders", 0o700)):
            d.mkdir(mode=mode, exist_ok=True)
            st = d.lstat()
            if not d.is_dir() or d.is_symlink() or st.st_uid != os.geteuid():
                raise MpsUnavailable(f"{d}: not a directory owned by this service's user")
            os.chmod(d, mode)

    def _start(self, gpu: str) -> None:
        self._prepare(gpu)
        try:
            proc = self._run(gpu, ["-d"])
        except subprocess.TimeoutExpired:
            raise MpsUnavailable(f"{self.control} -d for {gpu} did not return within "
                                 f"{self.timeout:g} s") from None
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout).decode(errors="replace").strip()[-500:]
            raise MpsUnavailable(f"{self.control} -d for {gpu} failed (exit status "
                                 f"{proc.returncode}){': ' + why if why else ''}")
        deadline = time.monotonic() + self.timeout
        while not self.alive(gpu):
            if time.monotonic() > deadline:
                raise MpsUnavailable(f"the MPS control daemon for {gpu} started but does not "
                                     f"answer on {self.dirs(gpu)[0]} (see "
                                     f"{self.dirs(gpu)[1]}/control.log)")
            time.sleep(0.05)
        self.log.info("MPS control daemon started for %s (pipe %s)", gpu, self.dirs(gpu)[0])

    def _stop(self, gpu: str) -> None:
        try:
            proc = self._run(gpu, [], "quit\n")
        except (subprocess.TimeoutExpired, MpsUnavailable) as e:
            self.log.error("MPS control daemon for %s: quit failed: %s", gpu, e)
            return
        if proc.returncode == 0:
            self.log.info("MPS control daemon for %s stopped (its last share ended)", gpu)
        else:  # it was not running (died, or a restart of the machine)
            self.log.info("MPS control daemon for %s was not running", gpu)

    @contextmanager
    def _locked(self, gpu: str) -> Iterator[None]:
        base = self.root / _key(gpu)
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        base.mkdir(mode=0o711, exist_ok=True)
        with self._lock:
            fd = os.open(base / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    # ------------------------------------------------------------------ shares
    def acquire(self, gpu: str, holder: str) -> str:
        """``holder`` (a share: e.g. 'workload.attempt') runs on ``gpu``: make sure its daemon
        runs (starting it for the first share, or again if it died) and return the pipe
        directory for the share's ``CUDA_MPS_PIPE_DIRECTORY``."""
        why = self.missing()
        if why is not None:
            raise MpsUnavailable(why)
        with self._locked(gpu):
            if not self.alive(gpu):
                if self.holders(gpu):
                    self.log.warning("MPS control daemon for %s is not running although "
                                     "shares hold it (%s); starting it again", gpu,
                                     ", ".join(sorted(self.holders(gpu))))
                self._start(gpu)
            (self.root / _key(gpu) / "holders" / _key(holder)).touch(mode=0o600)
        return str(self.dirs(gpu)[0])

    def acquire_all(self, holder: str, gpus: list[str]) -> dict[str, str]:
        """:meth:`acquire` each of ``gpus`` for ``holder``: GPU -> pipe directory. All or
        nothing: when one cannot be had, what was acquired is released and the error raised."""
        pipes: dict[str, str] = {}
        try:
            for gpu in gpus:
                pipes[gpu] = self.acquire(gpu, holder)
        except BaseException:
            self.release(holder)
            raise
        return pipes

    def release(self, holder: str) -> list[str]:
        """``holder`` has ended: drop it everywhere; stop the daemons it was the last share
        of. Idempotent. Returns the GPUs whose daemon was stopped."""
        stopped: list[str] = []
        for gpu in self.gpus():
            if _key(holder) not in self.holders(gpu):
                continue
            with self._locked(gpu):
                try:
                    (self.root / _key(gpu) / "holders" / _key(holder)).unlink()
                except FileNotFoundError:
                    continue
                if not self.holders(gpu):
                    self._stop(gpu)
                    stopped.append(gpu)
        return stopped

    def ensure(self, gpu: str) -> bool:
        """Supervision: start ``gpu``'s daemon again when shares hold it and it died.
        Returns True when it had to be restarted."""
        if not self.holders(gpu) or self.alive(gpu):
            return False
        with self._locked(gpu):
            if not self.holders(gpu) or self.alive(gpu):
                return False
            self.log.warning("MPS control daemon for %s died while %d share(s) hold it; "
                             "starting it again", gpu, len(self.holders(gpu)))
            self._start(gpu)
            return True

    def ensure_held(self, holder: str) -> list[str]:
        """Supervision of one share: :meth:`ensure` every GPU ``holder`` holds. Returns the
        GPUs whose daemon had to be started again."""
        return [gpu for gpu in self.held_by(holder) if self.ensure(gpu)]


# ---------------------------------------------------------------------------- the verbs
#: a share holding daemons: the service's 'workload.attempt', the hub's 'session-<id>'
HOLDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,199}$")
#: a whole GPU as NVML names it ('GPU-<uuid>'): MPS runs on whole GPUs only
GPU_ID = re.compile(r"^GPU-[A-Za-z0-9-]{1,96}$")
MAX_GPUS = 64


def _holder(text: str) -> str:
    if not HOLDER.fullmatch(text):
        raise LauncherError(f"holder: {text[:80]!r} is not a share's name "
                            "(letters, digits, '_.@+-')")
    return text


def _daemons(cfg: LauncherConfig) -> MpsDaemons:
    """The daemons under the config's ``mps_root``, run by the config's ``mps_control``. As
    root both must be beyond the reach of anyone else (like the config itself)."""
    secure_path(cfg.mps_root, "mps_root")
    if os.path.exists(cfg.mps_control):
        secure_path(Path(cfg.mps_control), "mps_control", file=True)
    return MpsDaemons(cfg.mps_root, cfg.mps_control, cfg.mps_driver_probe, other_users=True)


def _unavailable(e: MpsUnavailable) -> LauncherError:
    return LauncherError(str(e))


def mps_acquire(cfg: LauncherConfig, args: list[str], stdin: BinaryIO) -> dict[str, Any]:
    """``mps-acquire HOLDER GPU [GPU ...]``: the daemons of these GPUs run (started for the
    first share), held by HOLDER. Answers ``{"pipes": {gpu: pipe directory}}``; nothing is
    held when one of them cannot run."""
    if len(args) < 2:
        raise LauncherError("mps-acquire: expected HOLDER GPU [GPU ...]")
    holder, gpus = _holder(args[0]), args[1:]
    if len(gpus) > MAX_GPUS or len(set(gpus)) != len(gpus):
        raise LauncherError(f"mps-acquire: expected up to {MAX_GPUS} different GPUs")
    for g in gpus:
        if not GPU_ID.fullmatch(g):
            raise LauncherError(f"gpu: {g[:80]!r} is not a GPU's NVML id ('GPU-<uuid>')")
    try:
        return {"pipes": _daemons(cfg).acquire_all(holder, gpus)}
    except MpsUnavailable as e:
        raise _unavailable(e) from None


def mps_release(cfg: LauncherConfig, args: list[str], stdin: BinaryIO) -> dict[str, Any]:
    """``mps-release HOLDER``: the share has ended; daemons it was the last share of stop.
    Answers ``{"stopped": [gpu, ...]}``."""
    if len(args) != 1:
        raise LauncherError("mps-release: expected HOLDER")
    return {"stopped": _daemons(cfg).release(_holder(args[0]))}


def mps_ensure(cfg: LauncherConfig, args: list[str], stdin: BinaryIO) -> dict[str, Any]:
    """``mps-ensure HOLDER``: start again a daemon HOLDER holds that died. Answers
    ``{"restarted": [gpu, ...]}``."""
    if len(args) != 1:
        raise LauncherError("mps-ensure: expected HOLDER")
    try:
        return {"restarted": _daemons(cfg).ensure_held(_holder(args[0]))}
    except MpsUnavailable as e:
        raise _unavailable(e) from None
