"""Batch jobs' checkpoints in the snapshot store (``checkpoint: auto``).

The launcher dumps a preempted job's process tree with the CRIU helper
(:func:`.criu.criu_dump`, every guard of a session's dump) and hands the images to the
service's account; :meth:`JobCheckpoints.save` puts them into the same store as sessions'
snapshots (chunked, checksummed, verified, counted against the project's quota), under the
session id ``job-<workload>``. When the requeued job starts (on whichever node),
:meth:`JobCheckpoints.take` finds the newest one whose chunks are all there and hands the
launcher where they are: the launcher writes the images once, from the store straight into
the private directory CRIU restores from (no directory of images in between, no second copy);
once the job runs again from it, :meth:`drop` removes it.
"""

from __future__ import annotations

import time

from . import imagefiles
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
        files, w = imagefiles.put_images(self.store, staging, images_dir,
                                         on_error=lambda: self.store.abort(staging))
        refs = [r for e in files for r in e["chunks"]]
        snap = self.store.commit(
            staging, {"files": files, "job": True, **info}, refs,
            raw_bytes=sum(e["size"] for e in files), written_bytes=w.written_bytes,
            seconds={"store": time.perf_counter() - t0},
            summary={"job": workload, "attempt": info.get("attempt")}, fresh=w.fresh)
        return snap.id

    def take(self, workload: str) -> tuple[str, dict, dict] | None:
        """(snapshot id, where its images are: ``{"chunks": the store's chunk directory,
        "files": [{name, size, chunks}]}``, its info) for the newest checkpoint of the job
        whose chunks are all there, or None. Its chunks are checked as they are read back."""
        snap, _ = self.store.usable(session_of(workload), deep=False)
        if snap is None:
            return None
        m = self.store.load(snap.id)
        p = m["payload"]
        if not p.get("job"):
            return None
        files = [{"name": e["name"], "size": e["size"], "chunks": e["chunks"]}
                 for e in p["files"]]
        info = {k: v for k, v in p.items() if k not in ("files", "job")}
        return snap.id, {"chunks": self.store.chunk_root, "files": files}, info

    def drop(self, workload: str) -> None:
        """Remove every checkpoint of the job (it runs again from the newest one, or ended)."""
        for item in self.store.list(session=session_of(workload)):
            self.store.delete(item.id, "the job was restored from it")
