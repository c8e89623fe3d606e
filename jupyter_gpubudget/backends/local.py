"""Local backend: a batch job's command runs as a subprocess on this machine.

The placement becomes ``CUDA_VISIBLE_DEVICES`` (GPU UUIDs, or MIG UUIDs for MIG slices) and,
for MPS shares, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``.
Each attempt gets a directory ``<state_dir>/<workload>/<attempt>/`` holding its pid, exit
record and output; jobs survive a restart of the service and are found again there.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

from traitlets import Dict, Float, List, Unicode

from .base import Backend, BackendStatus, Launch, LogChunk
from .local_run import proc_starttime, write_atomic


def cuda_env(placement: list[dict], uuids: dict[tuple[str, int], str] | None = None) -> dict[str, str]:
    """Environment selecting the placed devices. ``uuids`` maps (node, gpu index) to a UUID."""
    uuids = uuids or {}
    devices: list[str] = []
    env: dict[str, str] = {}
    for s in placement:
        if s.get("gpu", -1) < 0:
            continue
        gpu_id = uuids.get((s["node"], s["gpu"]), str(s["gpu"]))
        if s.get("kind") == "mig":
            devices.append(f"MIG-{gpu_id}/{s.get('profile')}/{s.get('mig_start')}")
        else:
            devices.append(gpu_id)
        if s.get("kind") == "mps":
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(s.get("milli", 0) / 10)))
            if s.get("gpu_memory_mib"):
                env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={s['gpu_memory_mib']}M"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    return env


class LocalBackend(Backend):
    name = "local"

    state_dir = Unicode("gpubudget-jobs", help="Directory holding one folder per job attempt "
                        "(pid, exit record, output.log).").tag(config=True)
    stop_grace = Float(10.0, help="Seconds between SIGTERM and SIGKILL when a job is stopped "
                       "(preemption or cancel).").tag(config=True)
    start_grace = Float(5.0, help="Seconds an attempt directory without a pid file counts as "
                        "starting (a launch interrupted by a service restart).").tag(config=True)
    extra_env = Dict({}, help="Extra environment variables for every job.").tag(config=True)
    gpu_uuids = Dict({}, help="Map 'node/index' to the GPU UUID put in CUDA_VISIBLE_DEVICES "
                     "(default: the index).").tag(config=True)

    allowed_commands = List(Unicode(), [], help="Regular expressions; when set, a job is "
                            "accepted only if its command (the shell string, or argv joined "
                            "by spaces) fully matches one. Empty: any command.").tag(config=True)

    def check_command(self, command: list[str]) -> str | None:
        """None if the command may run here, else the reason it may not."""
        if not self.allowed_commands:
            return None
        text = command[2] if command[:2] == ["/bin/sh", "-c"] else " ".join(command)
        if any(re.fullmatch(p, text) for p in self.allowed_commands):
            return None
        return "not allowed on this service (see LocalBackend.allowed_commands)"

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self._children: dict[tuple[str, int], subprocess.Popen] = {}

    def _dir(self, workload: str, attempt: int) -> Path:
        return Path(self.state_dir) / workload / str(attempt)

    def launch(self, launch: Launch) -> str:
        d = self._dir(launch.workload, launch.attempt)
        d.mkdir(parents=True, exist_ok=True)
        uuids = {tuple(k.split("/", 1)): v for k, v in self.gpu_uuids.items()}
        uuids = {(n, int(i)): v for (n, i), v in uuids.items()}
        env = dict(os.environ)
        env.update(self.extra_env)
        env.update(launch.env)
        env.update(cuda_env(launch.placement, uuids))
        env.update({"GPUBUDGET_WORKLOAD": launch.workload, "GPUBUDGET_PROJECT": launch.project,
                    "GPUBUDGET_USER": launch.user, "GPUBUDGET_ATTEMPT": str(launch.attempt),
                    "GPUBUDGET_PLACEMENT": json.dumps(launch.placement)})
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_gpubudget.backends.local_run", str(d), "--",
             *launch.command], env=env, start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=open(d / "wrapper.log", "ab"))  # noqa: SIM115
        # record the pid now (the wrapper writes the same line once it runs): a restarted
        # service must find the attempt even if the wrapper has not started yet
        start = proc_starttime(proc.pid)
        if start is not None and not (d / "pid").exists():
            write_atomic(d / "pid", f"{proc.pid} {start}\n")
        self._children[(launch.workload, launch.attempt)] = proc
        threading.Thread(target=self._watch, args=(proc,), daemon=True,
                         name=f"watch-{launch.workload}").start()
        self.log.info("launched %s attempt %d as pid %d", launch.workload, launch.attempt, proc.pid)
        return str(proc.pid)

    def _watch(self, proc: subprocess.Popen) -> None:
        proc.wait()
        if self.on_exit is not None:
            try:
                self.on_exit()
            except RuntimeError:  # the service is shutting down
                pass

    def _pid(self, d: Path) -> int | None:
        try:
            pid_s, start = (d / "pid").read_text().split()
        except (OSError, ValueError):
            return None
        pid = int(pid_s)
        return pid if proc_starttime(pid) == start else None

    def status(self, workload: str, attempt: int) -> BackendStatus:
        key = (workload, attempt)
        child = self._children.get(key)
        if child is not None and child.poll() is not None:
            self._children.pop(key, None)  # reaped; the exit record tells the rest
        d = self._dir(workload, attempt)
        try:
            rec = json.loads((d / "exit").read_text())
            return BackendStatus(False, rec["exit_code"], rec["ended_at"])
        except (OSError, ValueError, KeyError):
            pass
        if self._pid(d) is not None:
            return BackendStatus(True)
        if child is not None and child.poll() is None:
            return BackendStatus(True)  # wrapper starting: pid file not written yet
        try:
            age = time.time() - d.stat().st_mtime
        except OSError:
            return BackendStatus(False, launched=False)
        if not (d / "pid").exists() and age < self.start_grace:
            return BackendStatus(True)  # launched moments before a restart: not known yet
        return BackendStatus(False)

    def stop(self, workload: str, attempt: int) -> BackendStatus:
        d = self._dir(workload, attempt)
        pid = self._pid(d)
        child = self._children.get((workload, attempt))
        pgid = pid if pid is not None else (child.pid if child is not None else None)
        if pgid is not None:
            self._signal(pgid, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_grace
            while time.monotonic() < deadline and self.status(workload, attempt).alive:
                time.sleep(0.05)
            if self.status(workload, attempt).alive:
                self._signal(pgid, signal.SIGKILL)
                while child is not None and child.poll() is None:
                    time.sleep(0.01)
        st = self.status(workload, attempt)
        return st if not st.alive else BackendStatus(False)

    def read_log(self, workload: str, attempt: int, offset: int, limit: int) -> LogChunk | None:
        """From the attempt's ``output.log`` (a regular file only: a link or a pipe put there
        by the job is not followed)."""
        path = self._dir(workload, attempt) / "output.log"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return LogChunk(b"", 0, 0)
        except OSError as e:
            raise OSError(f"the job's output cannot be read ({e.strerror})") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise OSError("the job's output.log is not a regular file")
            size = st.st_size
            start = max(0, size + offset) if offset < 0 else min(offset, size)
            f.seek(start)
            data = f.read(max(0, min(limit, size - start)))
        return LogChunk(data, start, size)

    @staticmethod
    def _signal(pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def orphans(self, running: set[tuple[str, int]]) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        root = Path(self.state_dir)
        if not root.is_dir():
            return out
        for wdir in root.iterdir():
            for adir in wdir.iterdir() if wdir.is_dir() else ():
                if not adir.name.isdigit():
                    continue
                key = (wdir.name, int(adir.name))
                if key not in running and self.status(*key).alive:
                    out.append(key)
        return out
