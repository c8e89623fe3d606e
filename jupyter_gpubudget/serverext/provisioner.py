"""A kernel provisioner for snapshots (``jupyter_client.kernel_provisioners`` entry point
``gpubudget-snapshot-ready``).

It launches kernels exactly like jupyter_client's ``LocalProvisioner``, except that CRIU can
dump them and restore them later, under another server process, possibly on another node:

- *independent* of the server: their own session, and no ``JPY_PARENT_PID`` (ipykernel
  exits when its parent changes, and a restored kernel's parent is not this server);
- no file or pipe of the server's: stdin, stdout and stderr are ``/dev/null`` (ipykernel sends
  all output through its channels; an appended log file would change size under a snapshot
  and CRIU refuses to restore an open file whose size changed), or, with
  ``GpuBudgetSnapshots.kernel_log_dir``, a log file of their own;
- IPython's history in memory (``KERNEL_ARGS``: a history database shared with other kernels
  changes size under a snapshot too; the cell history travels in namespace snapshots).

It also *adopts* a kernel that CRIU restored: started with ``gpubudget_adopt={"pid",
"connection"}``, it launches nothing, answers on the restored kernel's own ports and key, and
manages the process by its pid (it is not this server's child: it is watched, signalled and
waited for through ``/proc``, guarded against pid reuse by the process's start time).

The server extension makes it the default provisioner of the server (when the admin has not
chosen another); a kernel spec that names its own provisioner keeps it, and such a kernel is
saved by the namespace backend only (the CRIU backend says why).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from typing import Any

from jupyter_client.provisioning import LocalProvisioner

from jupyter_gpubudget.snapshot.kernels import KERNEL_ARGS

NAME = "gpubudget-snapshot-ready"
#: where kernel logs go (set by the server extension from GpuBudgetSnapshots.kernel_log_dir)
LOG_DIR: list[str] = [""]


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


class AdoptedProcess:
    """A ``Popen``-like handle on a process that is not this one's child."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._started = _start_time(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            st = _start_time(self.pid)
            if st is None or st != self._started:
                self.returncode = -signal.SIGKILL  # gone (its exit status is init's to see)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class SnapshotReadyProvisioner(LocalProvisioner):  # type: ignore[misc]
    """See the module's docstring."""

    _adopt: dict | None = None
    _adopted = False  # a restart of an adopted kernel launches a fresh one

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        adopt = kwargs.pop("gpubudget_adopt", None)
        if adopt is None or self._adopted:
            self._adopt = None
            kwargs["extra_arguments"] = list(kwargs.get("extra_arguments") or []) + [
                a for a in KERNEL_ARGS if a not in (kwargs.get("extra_arguments") or [])]
            return await super().pre_launch(**kwargs)
        self._adopt = adopt
        km = self.parent
        info = dict(adopt["connection"])
        for name in ("shell_port", "iopub_port", "stdin_port", "hb_port", "control_port"):
            setattr(km, name, int(info[name]))
        km.load_connection_info(info)
        km.write_connection_file()
        self.connection_info = km.get_connection_info()
        kwargs.pop("extra_arguments", None)
        return {**kwargs, "cmd": ["true"]}  # nothing is run: the kernel is already there

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        if self._adopt is not None:
            pid = int(self._adopt["pid"])
            self._adopted = True
            self.process = AdoptedProcess(pid)
            self.pid, self.pgid = pid, pid
            self.cwd = kwargs.get("cwd")
            return self.connection_info
        env = dict(kwargs.get("env") or os.environ)
        env.pop("JPY_PARENT_PID", None)
        kwargs["env"] = env
        kwargs["independent"] = True
        kwargs["stdin"] = subprocess.DEVNULL
        log_dir = LOG_DIR[0]
        if log_dir:
            os.makedirs(log_dir, mode=0o700, exist_ok=True)
            kid = str(kwargs.get("kernel_id") or self.kernel_id)
            log = open(os.path.join(log_dir, f"kernel-{kid}.log"), "ab")  # noqa: SIM115
            kwargs["stdout"] = kwargs["stderr"] = log
            try:
                return await super().launch_kernel(cmd, **kwargs)
            finally:
                log.close()
        kwargs["stdout"] = kwargs["stderr"] = subprocess.DEVNULL
        return await super().launch_kernel(cmd, **kwargs)

    async def wait(self) -> int | None:
        if isinstance(self.process, AdoptedProcess):
            while self.process.poll() is None:
                await asyncio.sleep(0.1)
            ret = self.process.returncode
            self.process = None
            return ret
        return await super().wait()

    async def cleanup(self, restart: bool = False) -> None:
        if self._adopted:
            self.ports_cached = False  # the ports came with the kernel, not from the cache
        await super().cleanup(restart)
