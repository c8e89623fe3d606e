"""Batch jobs' checkpoints in the snapshot store (``checkpoint: auto``).

The launcher dumps a preempted job's process tree with the CRIU helper
(:func:`.criu.criu_dump`, every guard of a session's dump) and hands the images to the
service's account; :meth:`JobCheckpoints.save` puts them into the same store as sessions'
snapshots (chunked, checksummed, verified, counted against the project's quota), under the
session id ``job-<workload>``. When the requeued job starts (on whichever node),
:meth:`JobCheckpoints.take` writes the newest one that verifies back into a directory for
the launcher to restore from; once the job runs again from it, :meth:`drop` removes it.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import time

from . import chunkio
from .base import SnapshotError
from .store import Store


def session_of(workload: str) -> str:
    return f"job-{workload}"[:48]


class JobCheckpoints:
    def __init__(self, store: Store, images_tmp: str = "/dev/shm") -> None:
        self.store = store
        self.images_tmp = images_tmp

    def save(self, workload: str, project: str, images_dir: str, info: dict) -> str:
        """Store a job's dump images (``info``: what the restore needs besides them: the old
        ``log`` path, ``gpu``, ``attempt``); the snapshot's id."""
        staging = self.store.begin(session_of(workload), project, "criu")
        t0 = time.perf_counter()
        w = chunkio.ChunkWriter(staging.chunk_root, fsync=self.store.fsync,
                                compress=self.store.compress_arg)
        files, futures, maps = [], [], []
        try:
            for name in sorted(os.listdir(images_dir)):
                if name.endswith(".log") or name == "restored.pid":
                    continue
                path = os.path.join(images_dir, name)
                size = os.path.getsize(path)
                with open(path, "rb") as f:
                    if size:  # as a session's images: private pages the writer may O_DIRECT
                        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
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
            self.store.abort(staging)
            raise
        finally:
            w._pool.shutdown(wait=True)
            for m in maps:
                m.close()
        w.close()
        refs = [r for e in files for r in e["chunks"]]
        snap = self.store.commit(
            staging, {"files": files, "job": True, **info}, refs,
            raw_bytes=sum(e["size"] for e in files), written_bytes=w.written_bytes,
            seconds={"store": time.perf_counter() - t0},
            summary={"job": workload, "attempt": info.get("attempt")}, fresh=w.fresh)
        return snap.id

    def take(self, workload: str) -> tuple[str, str, dict] | None:
        """(snapshot id, a fresh directory holding its images, its info) for the newest
        checkpoint of the job that verifies, or None. The caller removes the directory."""
        snap, _ = self.store.usable(session_of(workload), deep=False)
        if snap is None:
            return None
        m = self.store.load(snap.id)
        p = m["payload"]
        if not p.get("job"):
            return None
        need = sum(e["size"] for e in p["files"])
        base = self.images_tmp if self.images_tmp and os.path.isdir(self.images_tmp) and \
            shutil.disk_usage(self.images_tmp).free > 2 * need + (64 << 20) else None
        images = tempfile.mkdtemp(prefix="gpubudget-job-", dir=base)
        try:
            for e in p["files"]:
                try:
                    chunkio.read_refs_to_file(self.store.chunk_root, e["chunks"],
                                              os.path.join(images, e["name"]),
                                              e["mode"] or 0o600)
                except chunkio.ChunkError as err:
                    self.store.mark_bad(snap.id, str(err))
                    raise SnapshotError("verify_failed", f"snapshot {snap.id}: {err}") \
                        from None
        except BaseException:
            shutil.rmtree(images, ignore_errors=True)
            raise
        os.chmod(images, 0o700)
        info = {k: v for k, v in p.items() if k not in ("files", "job")}
        return snap.id, images, info

    def drop(self, workload: str) -> None:
        """Remove every checkpoint of the job (it runs again from the newest one, or ended)."""
        for item in self.store.list(session=session_of(workload)):
            self.store.delete(item.id, "the job was restored from it")
