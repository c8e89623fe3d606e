"""The CRIU backend: the kernel's whole process tree, everything restored as it was.

The privileged steps (:func:`criu.criu_dump`, :func:`criu.criu_restore`) run in-process when
this process is root, else through ``launcher`` (a command prefix such as
``["sudo", "-n", "/path/python", "-m", "jupyter_gpubudget.snapshot.privileged"]``). The images
go through the store like every snapshot (chunked, checksummed, compressed, verified).

A dump ends the kernel (it is preemption's snapshot) unless ``leave_running`` ("snapshot
now"). The kernel is stopped (SIGSTOP) for the dump and killed only after its snapshot is
stored and verified; when that fails it is let go on (SIGCONT), so a failed snapshot never
costs the session its kernel.
Whoever started the kernel must reap it after a dump (the pid must be free for the restore)
and must not restart it meanwhile (a server's kernel restarter must be off for that kernel).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import tempfile
import time

from traitlets import Bool, Float, List, Unicode
from traitlets.config import LoggingConfigurable

from . import chunkio, kernels
from .base import Availability, KernelRef, RestoreReport, Snapshot, SnapshotError
from .criu import (
    CriuError,
    criu_dump,
    criu_finish,
    criu_restore,
    find_criu,
    find_cuda_checkpoint,
)
from .store import Store


def gpu_verdict(kernel: KernelRef, cuda_checkpoint: str | None) -> str | None:
    """Why the kernel's GPU state cannot be captured by CRIU here, or None when it can."""
    if not kernel.gpu_devices and not kernel.mps:
        return None
    if any(d.startswith("MIG-") for d in kernel.gpu_devices):
        return "the kernel runs on a MIG slice: cuda-checkpoint does not support MIG"
    if kernel.mps:
        return "the kernel is an MPS client: cuda-checkpoint cannot capture MPS clients"
    if cuda_checkpoint is None:
        return "the kernel holds a GPU and cuda-checkpoint is not installed: its GPU state " \
               "cannot be captured"
    return None


class CriuSnapshotter(LoggingConfigurable):
    method = "criu"
    launcher = List(Unicode(), help="Command prefix that runs "
                    "`python -m jupyter_gpubudget.snapshot.privileged` as root (e.g. sudo -n "
                    "...). Empty: call CRIU in-process (this process must be root).").tag(
        config=True)
    leave_running = Bool(False, help="Keep the kernel running after a dump (a snapshot on "
                         "request); preemption's dump stops it.").tag(config=True)
    images_tmp = Unicode("/dev/shm", help="Where CRIU's images are written before they go "
                         "into the store (a tmpfs saves a disk round trip); the store's "
                         "staging directory when this has too little room.").tag(config=True)
    timeout = Float(600.0, help="Seconds a CRIU dump or restore may take.").tag(config=True)
    ready_timeout = Float(30.0, help="Seconds a restored kernel has to answer.").tag(config=True)

    def __init__(self, store: Store, **kw) -> None:  # noqa: ANN003
        super().__init__(**kw)
        self.store = store

    # ------------------------------------------------------------ privileged calls
    def _privileged(self, cmd: str, **args: object) -> dict:
        if not self.launcher:
            if os.geteuid() != 0:
                raise SnapshotError("unavailable", "CRIU needs root: configure "
                                    "CriuSnapshotter.launcher")
            try:
                if cmd == "criu-dump":
                    return criu_dump(timeout=self.timeout, **args)  # type: ignore[arg-type]
                if cmd == "criu-finish":
                    return criu_finish(**args)  # type: ignore[arg-type]
                return {"pid": criu_restore(timeout=self.timeout, **args)}  # type: ignore[arg-type]
            except CriuError as e:
                raise self._error(cmd, e.reason, e.message, e.log) from None
        argv = [*self.launcher, cmd]
        for k, v in args.items():
            flag = "--" + k.replace("_", "-")
            if isinstance(v, bool):
                argv += [flag] if v else []
            elif isinstance(v, tuple):
                argv += [flag, ":".join(map(str, v))]
            elif v is not None:
                argv += [flag, str(v)]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout + 30)
        try:
            out = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise SnapshotError("unavailable", f"the privileged launcher failed (exit "
                                f"{p.returncode}): {p.stderr.strip()[-500:]}") from None
        if "error" in out:
            raise self._error(cmd, out["error"], out["message"], out.get("log", ""))
        return out

    @staticmethod
    def _error(cmd: str, reason: str, message: str, log: str) -> SnapshotError:
        mapped = {"no_criu": "unavailable", "gpu_state": "unavailable",
                  "not_a_kernel": "unavailable", "pid_in_use": "pid_in_use"}.get(
            reason, "dump_failed" if cmd == "criu-dump" else "restore_failed")
        return SnapshotError(mapped, message + (f"\n{log}" if log else ""))

    # ------------------------------------------------------------ Snapshotter
    def capabilities(self) -> dict:
        criu = find_criu()
        return {"method": self.method, "whole_process": True, "criu": criu,
                "cuda_checkpoint": find_cuda_checkpoint(), "mig": False, "mps": False,
                "other_node": "same pids must be free there", "restores_into": "the same process"}

    def available(self, kernel: KernelRef) -> Availability:
        if not self.launcher and os.geteuid() != 0:
            return Availability(False, "CRIU needs root and no privileged launcher is set")
        if find_criu() is None:
            return Availability(False, "no CRIU >= 4.1 on this machine")
        why = gpu_verdict(kernel, find_cuda_checkpoint())
        if why:
            return Availability(False, why)
        try:
            if os.getsid(kernel.pid) != kernel.pid:
                return Availability(False, "the kernel was not started independent of its "
                                    "launcher (own session)")
        except ProcessLookupError:
            return Availability(False, f"no kernel process {kernel.pid}")
        return Availability(True)

    def _images_dir(self, fallback: str, need: int) -> str:
        """A directory (not yet created) for ``need`` bytes of images: in ``images_tmp`` when
        it has twice that free, else ``fallback``."""
        base = self.images_tmp
        if base and os.path.isdir(base) and shutil.disk_usage(base).free > 2 * need:
            return os.path.join(base, f"gpubudget-criu-{os.getpid()}-{time.time_ns():x}")
        return fallback

    @staticmethod
    def _rss(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 1 << 30

    def dump(self, kernel: KernelRef) -> Snapshot:
        staging = self.store.begin(kernel.session, kernel.project, self.method)
        images = self._images_dir(os.path.join(staging.dir, "images"),
                                  self._rss(kernel.pid) + (64 << 20))
        owner = (os.geteuid(), os.getegid())
        uid = kernel.uid
        if uid is None and not self.launcher:  # in-process, as root: the kernel's own owner
            try:
                uid = os.stat(f"/proc/{kernel.pid}").st_uid
            except FileNotFoundError:
                uid = None
        t0 = time.perf_counter()
        # the kernel is stopped, dumped, and ended only once its snapshot is stored and
        # verified; if that fails it simply goes on: a failed snapshot never costs the kernel
        try:
            res = self._privileged("criu-dump", pid=kernel.pid, images_dir=images,
                                   keep_stopped=True, owner=owner, expect_uid=uid)
        except SnapshotError:
            self.store.abort(staging)
            shutil.rmtree(images, ignore_errors=True)
            raise
        t_dump = time.perf_counter() - t0
        if self.leave_running:
            self._privileged("criu-finish", pid=kernel.pid, kill=False, expect_uid=uid)
        try:
            snap = self._store_images(kernel, staging, images, res, t_dump)
        except Exception as e:
            msg = f"the CRIU dump could not be stored: {e}"
            if not self.leave_running:
                self._privileged("criu-finish", pid=kernel.pid, kill=False, expect_uid=uid)
                msg += "; the kernel was not stopped and runs on"
            self.store.abort(staging)
            raise SnapshotError("verify_failed" if isinstance(e, SnapshotError) else
                                "dump_failed", msg) from None
        finally:
            shutil.rmtree(images, ignore_errors=True)
        if not self.leave_running:
            self._privileged("criu-finish", pid=kernel.pid, kill=True, expect_uid=uid)
        return snap

    def _store_images(self, kernel: KernelRef, staging, images: str, res: dict,  # noqa: ANN001
                      t_dump: float) -> Snapshot:
        t0 = time.perf_counter()
        w = chunkio.ChunkWriter(staging.chunk_root, fsync=self.store.fsync)
        files, futures, maps = [], [], []
        try:
            for name in sorted(os.listdir(images)):
                if name.endswith(".log") or name == "restored.pid":
                    continue
                path = os.path.join(images, name)
                size = os.path.getsize(path)
                with open(path, "rb") as f:
                    if size:
                        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
                        maps.append(m)
                        futures.append(w.put(m))
                    else:
                        futures.append([])
                files.append({"name": name, "size": size,
                              "mode": os.stat(path).st_mode & 0o777})
            for entry, fut in zip(files, futures, strict=True):
                entry["chunks"] = w.refs(fut)
        except BaseException:
            w.abandon()
            raise
        finally:
            w._pool.shutdown(wait=True)
            for m in maps:
                m.close()
        w.close()
        conn = None
        try:
            with open(kernel.connection_file) as f:
                conn = json.load(f)
        except (OSError, ValueError):
            pass
        payload = {"files": files, "pid": kernel.pid, "gpu": res["gpu"],
                   "connection_file": kernel.connection_file, "connection": conn,
                   "cwd": kernel.cwd, "gpu_devices": list(kernel.gpu_devices),
                   "uid": kernel.uid}
        refs = [r for e in files for r in e["chunks"]]
        return self.store.commit(
            staging, payload, refs, raw_bytes=sum(e["size"] for e in files),
            written_bytes=w.written_bytes,
            seconds={"criu_dump": t_dump, "store": time.perf_counter() - t0},
            summary={"pid": kernel.pid, "gpu": res["gpu"], "left_running": self.leave_running})

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
        need = sum(e["size"] for e in p["files"])
        images = self._images_dir("", need) or tempfile.mkdtemp(prefix="gpubudget-criu-")
        os.makedirs(images, mode=0o700, exist_ok=True)
        try:
            for e in p["files"]:
                path = os.path.join(images, e["name"])
                try:
                    data = chunkio.read_refs(self.store.chunk_root, e["chunks"])
                except chunkio.ChunkError as err:
                    self.store.mark_bad(snapshot.id, str(err))
                    raise SnapshotError("verify_failed", f"snapshot {snapshot.id}: {err}") \
                        from None
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, e["mode"] or 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                del data
            t_images = time.perf_counter() - t0
            if p.get("connection") and not os.path.exists(p["connection_file"]):
                os.makedirs(os.path.dirname(p["connection_file"]), exist_ok=True)
                with open(p["connection_file"], "w") as f:
                    json.dump(p["connection"], f)
                os.chmod(p["connection_file"], 0o600)
            t1 = time.perf_counter()
            pid = self._privileged("criu-restore", images_dir=images, gpu=p["gpu"])["pid"]
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
