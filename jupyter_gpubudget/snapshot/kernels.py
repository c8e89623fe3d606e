"""Starting and talking to kernels that can be snapshotted.

A kernel that CRIU is to dump and restore must be started *independent* of whatever starts it
(its own session, no ``JPY_PARENT_PID``: ipykernel otherwise exits when its parent goes, and a
restored kernel's parent is init), with no terminal or pipe of its parent's (stdin from
/dev/null, stdout and stderr to a log file of its own), and with its IPython history kept in
memory (a history database shared with other kernels changes size under it, and CRIU refuses to
restore an open file whose size changed). :data:`KERNEL_ARGS` carries the last point for other
launchers (phase 2: the single-user server's kernel manager).
"""

from __future__ import annotations

import ast
import os
import subprocess
import time
from dataclasses import dataclass

from jupyter_client import BlockingKernelClient, KernelManager

from .base import KernelRef, SnapshotError

KERNEL_ARGS = ["--HistoryManager.hist_file=:memory:"]


@dataclass(slots=True)
class Reply:
    status: str
    stdout: str
    error: str
    expressions: dict


def start_kernel(workdir: str, *, session: str, project: str = "",
                 env: dict[str, str] | None = None, gpu_devices: tuple[str, ...] = (),
                 timeout: float = 60) -> tuple[KernelManager, KernelRef]:
    """Start an ipykernel in ``workdir`` that can be snapshotted; wait until it answers."""
    os.makedirs(workdir, exist_ok=True)
    conn = os.path.join(workdir, "kernel.json")
    km = KernelManager(connection_file=conn)
    km.kernel_spec  # noqa: B018 - resolve it now: a missing kernel fails here, clearly
    kenv = dict(os.environ if env is None else env)
    if gpu_devices:
        kenv["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_devices)
    log = open(os.path.join(workdir, "kernel.log"), "ab")  # noqa: SIM115 - the kernel's own
    try:
        km.start_kernel(
            independent=True, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=workdir,
            env=kenv, extra_arguments=list(KERNEL_ARGS))
    finally:
        log.close()
    pid = km.provisioner.process.pid  # type: ignore[union-attr]
    ref = KernelRef(pid=pid, connection_file=conn, session=session, project=project,
                    cwd=workdir, gpu_devices=tuple(gpu_devices), uid=os.geteuid())
    kc = client(ref)
    try:
        kc.wait_for_ready(timeout=timeout)
    finally:
        kc.stop_channels()
    return km, ref


def client(kernel: KernelRef) -> BlockingKernelClient:
    """A client on the kernel's connection file (a restored kernel answers on the same one)."""
    kc = BlockingKernelClient(connection_file=kernel.connection_file)
    kc.load_connection_file()
    kc.start_channels()
    return kc


def execute(kc: BlockingKernelClient, code: str, *, timeout: float = 120, silent: bool = False,
            user_expressions: dict[str, str] | None = None) -> Reply:
    """Run code in the kernel; collect what it printed and its error, if any.

    First waits until the kernel answers and its IOPub messages reach this client: a client
    whose IOPub subscription is not yet in place when the kernel reports the run idle (a
    kernel just started, a loaded machine) would wait the whole ``timeout`` for it."""
    try:
        kc.wait_for_ready(timeout=timeout)
    except RuntimeError as e:
        raise SnapshotError("timeout", f"the kernel did not answer within {timeout:.0f} s "
                                       f"({e})") from None
    out: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    try:
        reply = kc.execute_interactive(code, silent=silent, store_history=not silent,
                                       user_expressions=user_expressions or {}, timeout=timeout,
                                       output_hook=hook, allow_stdin=False)
    except TimeoutError:
        raise SnapshotError("timeout", f"the kernel did not answer within {timeout:.0f} s") \
            from None
    c = reply["content"]
    err = ""
    if c["status"] != "ok":
        err = f"{c.get('ename', '')}: {c.get('evalue', '')}"
        tb = c.get("traceback") or []
        if tb:
            import re

            err += "\n" + re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(tb[-3:]))
    exprs = {}
    for k, v in (c.get("user_expressions") or {}).items():
        if v.get("status") == "ok":
            exprs[k] = v["data"].get("text/plain")
        else:
            exprs[k] = None
    return Reply(c["status"], "".join(out), err, exprs)


def expression_str(text: str | None) -> str:
    """A ``str`` value returned as a user expression (its repr) back to the string."""
    if text is None:
        raise SnapshotError("dump_failed", "the kernel returned no result")
    value = ast.literal_eval(text)
    if not isinstance(value, str):
        raise SnapshotError("dump_failed", "the kernel returned an unexpected result")
    return value


def answers(kernel: KernelRef, timeout: float = 10) -> bool:
    """Whether the kernel answers a kernel_info request on its connection file."""
    if not os.path.exists(kernel.connection_file):
        return False
    kc = client(kernel)
    try:
        kc.wait_for_ready(timeout=timeout)
        return True
    except RuntimeError:
        return False
    finally:
        kc.stop_channels()


def stop_kernel(kernel: KernelRef, km: KernelManager | None = None, timeout: float = 5) -> None:
    """Stop a kernel for good (also one restored by CRIU, which no manager started)."""
    if km is not None and km.has_kernel:
        try:
            km.shutdown_kernel(now=True)
        except Exception:  # noqa: BLE001 - it may be gone already
            pass
    try:
        os.kill(kernel.pid, 9)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and os.path.exists(f"/proc/{kernel.pid}"):
        try:
            if os.waitpid(kernel.pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            pass
        time.sleep(0.02)


__all__ = ["KERNEL_ARGS", "Reply", "answers", "client", "execute", "expression_str",
           "start_kernel", "stop_kernel"]
