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
  changes size under a snapshot too; the cell history travels in namespace snapshots);
- a *watchdog* instead of ipykernel's parent poller: the kernel ends itself when the server
  that owns it has been gone for ``GpuBudgetSnapshots.kernel_watchdog`` seconds (a server killed outright leaves
  no orphaned kernel holding memory or a GPU), and a server that adopts a restored kernel
  makes itself its owner (``adopt_code``) well within that time.

The ipykernel-only parts (history, watchdog) are added for ipykernel kernel specs only; other
kernels are launched as they are (without them, only the namespace backend can save them).

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
#: seconds a kernel outlives its server (a restore re-owns it sooner); set by the server
#: extension from GpuBudgetSnapshots.kernel_watchdog
WATCHDOG_GRACE: list[float] = [30.0]
OWNER_ENV = "GPUBUDGET_KERNEL_OWNER"

#: run in the kernel at start-up (``IPKernelApp.exec_lines``): binds no name of the user's;
#: the module ``_gpubudget_watchdog`` holds the owner (pid, start time), which a server that
#: adopts the kernel after a CRIU restore replaces
_WATCHDOG = (
    "exec(compile(" + repr("""
import os, sys, threading, time, types
m = types.ModuleType('_gpubudget_watchdog')
sys.modules[m.__name__] = m
def start_time(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            fields = f.read().rsplit(')', 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == 'Z' else fields[19]
raw = os.environ.get('OWNER_ENV', '')
pid, _, st = raw.partition(':')
m.owner = (int(pid), st) if pid.isdigit() else None
# a restored kernel may live in a time namespace of its own (CRIU keeps its clocks going),
# where start times read differently: its new owner is named by pid, its start time read here
m.own = lambda pid: setattr(m, 'owner', (pid, start_time(pid)))
def watch():
    dead = None
    while True:
        time.sleep(2)
        owner = m.owner
        if owner is None or not os.path.isdir('/proc'):
            continue
        if start_time(owner[0]) == owner[1]:
            dead = None
        elif dead is None:
            dead = time.monotonic()
        elif time.monotonic() - dead > GRACE:
            os._exit(0)
if m.owner is not None:
    threading.Thread(target=watch, name='gpubudget-watchdog', daemon=True).start()
""".replace("OWNER_ENV", "GPUBUDGET_KERNEL_OWNER"))
    + ", '<gpubudget-watchdog>', 'exec'), {'__name__': '_gpubudget_watchdog_init', "
    "'GRACE': GRACE_S})")


def watchdog_code() -> str:
    return _WATCHDOG.replace("GRACE_S", repr(float(WATCHDOG_GRACE[0])))


def owner_id(pid: int | None = None) -> str:
    """``pid:start-time`` of a process (this server by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_time(pid)}"


def adopt_code() -> str:
    """Code that makes this server the owner of a kernel it adopted (binds no user name)."""
    return (f"(lambda m: m is not None and m.own({os.getpid()}))"
            f"(__import__('sys').modules.get('_gpubudget_watchdog'))")


def is_ipykernel(spec: Any) -> bool:
    argv = list(getattr(spec, "argv", None) or [])
    return getattr(spec, "language", "").lower() == "python" and any(
        "ipykernel" in a for a in argv)
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
            if is_ipykernel(self.kernel_spec):
                extra = list(kwargs.get("extra_arguments") or [])
                extra += [a for a in KERNEL_ARGS if a not in extra]
                extra.append(f"--IPKernelApp.exec_lines={watchdog_code()}")
                kwargs["extra_arguments"] = extra
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
        env[OWNER_ENV] = owner_id()
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
