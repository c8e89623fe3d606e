"""The CRIU backend: the kernel's whole process tree, everything restored as it was.

The privileged steps (:func:`criu.criu_dump`, :func:`criu.criu_restore`) go through
:class:`~.privcall.Privileged` (in-process when this process is root, else a command prefix
such as ``sudo -n``). The images go through the store like every snapshot (chunked,
checksummed, compressed, verified); for an unprivileged caller the dump's seal travels in the
manifest and is handed back to the restore.

A dump ends the kernel (it is preemption's snapshot) unless ``leave_running`` ("snapshot
now"). The kernel is stopped (SIGSTOP) for the dump and killed only after its snapshot is
stored and verified; when that fails it is let go on (SIGCONT), so a failed snapshot never
costs the session its kernel.
Whoever started the kernel must reap it after a dump (the pid must be free for the restore)
and must not restart it meanwhile (a server's kernel restarter must be off for that kernel).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

from traitlets import Bool, Float, Instance, Unicode
from traitlets.config import LoggingConfigurable

from . import imagefiles, kernels
from .base import Availability, KernelRef, RestoreReport, Snapshot, SnapshotError
from .criu import find_criu, find_cuda_checkpoint, uses_gpu
from .privcall import Privileged, PrivilegedError
from .store import Store


def gpu_verdict(kernel: KernelRef, cuda_checkpoint: str | None,
                in_use: bool | None = None) -> str | None:
    """Why the kernel's GPU state cannot be captured by CRIU here, or None when it can.
    ``in_use``: whether the kernel's processes have a GPU open (None: unknown, assume they
    may); a kernel that was given a slice but never touched it has no GPU state to lose."""
    if not kernel.gpu_devices and not kernel.mps:
        return None
    if in_use is False:
        return None
    if any(d.startswith("MIG-") for d in kernel.gpu_devices):
        return "the kernel runs on a MIG slice: cuda-checkpoint does not support MIG"
    if kernel.mps:
        return "the kernel is an MPS client: cuda-checkpoint cannot capture MPS clients"
    if cuda_checkpoint is None:
        return "the kernel holds a GPU and cuda-checkpoint is not installed: its GPU state " \
               "cannot be captured"
    return None


def _uses_gpu_tree(pid: int) -> bool | None:
    """Whether any process of the kernel's tree has a GPU open; None when this account may
    not look (another user's kernel)."""
    try:
        pids, todo = [], [pid]
        while todo:
            p = todo.pop()
            pids.append(p)
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        os.listdir(f"/proc/{pid}/fd")
    except PermissionError:
        return None
    except (FileNotFoundError, ProcessLookupError):
        return False
    return any(uses_gpu(p) for p in pids)


def _parent_bound(pid: int) -> bool:
    """Whether the kernel exits when its parent goes (ipykernel's ``JPY_PARENT_PID``): it
    would die as soon as CRIU restores it under another parent."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any(v.startswith(b"JPY_PARENT_PID=") and v != b"JPY_PARENT_PID=1"
                       for v in f.read().split(b"\0"))
    except OSError:
        return False


class CriuSnapshotter(LoggingConfigurable):
    method = "criu"
    privileged = Instance(Privileged, allow_none=True, help="How CRIU's privileged steps "
                          "are run (see Privileged.command_prefix; default: configured "
                          "from this object's config).")
    leave_running = Bool(False, help="Keep the kernel running after a dump (a snapshot on "
                         "request); preemption's dump stops it.").tag(config=True)
    keep_stopped = Bool(False, help="After a dump that is stored and verified, leave the "
                        "kernel stopped (SIGSTOP) instead of ending it: whoever took the "
                        "snapshot ends it (or lets it go on) once everything else it saves "
                        "with it is safe too. Ignored with leave_running.").tag(config=True)
    images_tmp = Unicode("/dev/shm", help="Where CRIU's images are written before they go "
                         "into the store (a tmpfs saves a disk round trip); the store's "
                         "staging directory when this has too little room.").tag(config=True)
    timeout = Float(600.0, help="Seconds a CRIU dump or restore may take.").tag(config=True)
    ready_timeout = Float(30.0, help="Seconds a restored kernel has to answer.").tag(config=True)

    def __init__(self, store: Store, **kw) -> None:  # noqa: ANN003
        super().__init__(**kw)
        self.store = store
        if self.privileged is None:
            self.privileged = Privileged(parent=self)

    # ------------------------------------------------------------ privileged calls
    def _privileged(self, cmd: str, **args: object) -> dict:
        if cmd in ("criu-dump", "criu-restore") and self.privileged.in_process:
            args["timeout"] = self.timeout
        try:
            return self.privileged.call(cmd, **args)
        except PrivilegedError as e:
            raise self._error(cmd, e.reason, e.message, e.log) from None

    @staticmethod
    def _error(cmd: str, reason: str, message: str, log: str) -> SnapshotError:
        mapped = {"no_criu": "unavailable", "gpu_state": "unavailable",
                  "not_a_kernel": "unavailable", "pid_in_use": "pid_in_use",
                  "launcher": "unavailable"}.get(
            reason, "dump_failed" if cmd == "criu-dump" else "restore_failed")
        return SnapshotError(mapped, message + (f"\n{log}" if log else ""))

    # ------------------------------------------------------------ Snapshotter
    def criu_binary(self) -> str | None:
        """The CRIU that the dumps would run: found here when the verbs run in this process;
        otherwise the privileged side's answer (root has its own environment and home, where
        ``make criu`` builds it), asked once a minute at most."""
        if self.privileged.in_process:
            return find_criu()
        now = time.monotonic()
        cached = getattr(self, "_criu_seen", None)
        if cached is not None and now - cached[0] < 60.0:
            return cached[1]
        try:
            found = self.privileged.call("criu-check").get("criu")
        except PrivilegedError as e:
            self.log.info("criu-check through %s: %s", self.privileged.command_prefix,
                          e.message)
            found = None
        self._criu_seen = (now, found if isinstance(found, str) else None)
        return self._criu_seen[1]

    def capabilities(self) -> dict:
        criu = self.criu_binary()
        return {"method": self.method, "whole_process": True, "criu": criu,
                "cuda_checkpoint": find_cuda_checkpoint(), "mig": False, "mps": False,
                "other_node": "same pids must be free there", "restores_into": "the same process"}

    def available(self, kernel: KernelRef) -> Availability:
        problem = self.privileged.problem()
        if problem:
            return Availability(False, problem)
        if self.criu_binary() is None:
            return Availability(False, "no CRIU >= 4.1 on this machine")
        why = gpu_verdict(kernel, find_cuda_checkpoint(), _uses_gpu_tree(kernel.pid))
        if why:
            return Availability(False, why)
        try:
            if os.getsid(kernel.pid) != kernel.pid:
                return Availability(False, "the kernel was not started independent of its "
                                    "launcher (own session)")
        except ProcessLookupError:
            return Availability(False, f"no kernel process {kernel.pid}")
        if _parent_bound(kernel.pid):
            return Availability(False, "the kernel exits when its parent does "
                                "(JPY_PARENT_PID): it would not survive a restore")
        return Availability(True)

    def dump(self, kernel: KernelRef) -> Snapshot:
        staging = self.store.begin(kernel.session, kernel.project, self.method)
        uid = kernel.uid
        if uid is None and self.privileged.in_process:  # as root: the kernel's own owner
            try:
                uid = os.stat(f"/proc/{kernel.pid}").st_uid
            except FileNotFoundError:
                uid = None
        t0 = time.perf_counter()
        # the kernel is stopped, dumped, and ended only once its snapshot is stored and
        # verified; if that fails it simply goes on: a failed snapshot never costs the kernel
        try:
            res = self._privileged("criu-dump", pid=kernel.pid, keep_stopped=True,
                                   owner=(os.geteuid(), os.getegid()), expect_uid=uid)
        except SnapshotError:
            self.store.abort(staging)
            raise
        images = res["images_dir"]
        t_dump = time.perf_counter() - t0
        # from here the kernel is stopped: every way out of this method either ends it, hands
        # it stopped to a caller that asked for that (keep_stopped, after a stored snapshot),
        # or lets it go on; and the images directory never outlives it
        handed = False
        try:
            if self.leave_running:
                try:
                    self._resume(kernel.pid, uid)
                except SnapshotError:
                    self.store.abort(staging)
                    raise
            try:
                snap = self._store_images(kernel, staging, images, res, t_dump)
            except Exception as e:
                msg = f"the CRIU dump could not be stored: {e}"
                if not self.leave_running:
                    msg += "; the kernel was not stopped and runs on"
                self.store.abort(staging)
                raise SnapshotError("verify_failed" if isinstance(e, SnapshotError) else
                                    "dump_failed", msg) from None
            if not self.leave_running and not self.keep_stopped:
                self._privileged("criu-finish", pid=kernel.pid, kill=True, expect_uid=uid)
            handed = True
            return snap
        finally:
            shutil.rmtree(images, ignore_errors=True)
            if not handed and not self.leave_running:
                self._resume(kernel.pid, uid)

    def _resume(self, pid: int, uid: int | None) -> None:
        """Let a kernel stopped for its dump go on: through the privileged side, or with a
        plain SIGCONT when it is this account's own process (the privileged call may be
        what failed)."""
        try:
            self._privileged("criu-finish", pid=pid, kill=False, expect_uid=uid)
            return
        except SnapshotError as e:
            why = e.message
        try:
            os.killpg(pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        except PermissionError:
            self.log.error("criu: kernel %s stays stopped: %s", pid, why)
            raise SnapshotError("dump_failed", f"the kernel (pid {pid}) could not be resumed "
                                f"after its dump: {why}") from None

    def _store_images(self, kernel: KernelRef, staging, images: str, res: dict,  # noqa: ANN001
                      t_dump: float) -> Snapshot:
        t0 = time.perf_counter()
        files, w = imagefiles.put_images(self.store, staging, images)
        conn = None
        try:
            with open(kernel.connection_file) as f:
                conn = json.load(f)
        except (OSError, ValueError):
            pass
        payload = {"files": files, "pid": kernel.pid, "gpu": res["gpu"],
                   "connection_file": kernel.connection_file, "connection": conn,
                   "cwd": kernel.cwd, "gpu_devices": list(kernel.gpu_devices),
                   "uid": kernel.uid, "seal": res.get("seal")}
        refs = [r for e in files for r in e["chunks"]]
        return self.store.commit(
            staging, payload, refs, raw_bytes=sum(e["size"] for e in files),
            written_bytes=w.written_bytes,
            seconds={"criu_dump": t_dump, "store": time.perf_counter() - t0},
            summary={"pid": kernel.pid, "gpu": res["gpu"], "left_running": self.leave_running},
            fresh=w.fresh)

    def restore(self, snapshot: Snapshot, target: KernelRef | None = None) -> RestoreReport:
        if target is not None:
            raise SnapshotError("bad_input", "target: CRIU restores the kernel's own processes; "
                                "no target kernel is used")
        m = self.store.load(snapshot.id)
        problems = self.store.verify(snapshot.id, deep=False)
        if problems:
            self.store.mark_bad(snapshot.id, "; ".join(problems[:5]))
            raise SnapshotError("verify_failed", f"snapshot {snapshot.id}: {problems[0]}")
        p = m["payload"]
        t0 = time.perf_counter()
        images = imagefiles.get_images(self.store, snapshot.id, p["files"], self.images_tmp,
                                       "gpubudget-criu-")
        try:
            t_images = time.perf_counter() - t0
            if p.get("connection") and not os.path.exists(p["connection_file"]):
                os.makedirs(os.path.dirname(p["connection_file"]), exist_ok=True)
                with open(p["connection_file"], "w") as f:
                    json.dump(p["connection"], f)
                os.chmod(p["connection_file"], 0o600)
            t1 = time.perf_counter()
            pid = self._privileged("criu-restore", images_dir=images, gpu=p["gpu"],
                                   seal=p.get("seal"))["pid"]
            t_criu = time.perf_counter() - t1
        finally:
            shutil.rmtree(images, ignore_errors=True)
        kernel = KernelRef(pid=pid, connection_file=p["connection_file"],
                           session=snapshot.session, project=snapshot.project, cwd=p.get("cwd"),
                           gpu_devices=tuple(p.get("gpu_devices", ())), uid=p.get("uid"))
        t2 = time.perf_counter()
        if not kernels.answers(kernel, timeout=self.ready_timeout):
            raise SnapshotError("restore_failed", f"the restored kernel (pid {pid}) does not "
                                "answer on its connection file")
        notes = [] if pid == p["pid"] else [f"restored as pid {pid}"]
        return RestoreReport(snapshot_id=snapshot.id, method=self.method, kernel=kernel,
                             everything=True, notes=notes,
                             seconds={"images": t_images, "criu_restore": t_criu,
                                      "answer": time.perf_counter() - t2,
                                      "total": time.perf_counter() - t0})
