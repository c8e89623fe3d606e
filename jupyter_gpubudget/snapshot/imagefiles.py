"""CRIU's image files into the snapshot store and back (a session's dump and a batch job's).

:func:`put_images` chunks a directory of images into a staging snapshot;
:func:`get_images` writes a stored snapshot's images back into a fresh directory.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from collections.abc import Callable

from . import chunkio
from .base import SnapshotError
from .store import Store


def put_images(store: Store, staging, images_dir: str,  # noqa: ANN001
               on_error: Callable[[], None] | None = None
               ) -> tuple[list[dict], chunkio.ChunkWriter]:
    """Write every image in ``images_dir`` (not CRIU's logs nor ``restored.pid``) into
    ``staging``'s chunks: the files' entries (name, size, mode, chunks) and the closed writer
    (``written_bytes``, ``fresh``). On an error the writer is abandoned and ``on_error``
    called before the error goes on."""
    w = chunkio.ChunkWriter(staging.chunk_root, fsync=store.fsync,
                            compress=store.compress_arg)
    files, futures, maps = [], [], []
    try:
        for name in sorted(os.listdir(images_dir)):
            if name.endswith(".log") or name == "restored.pid":
                continue
            path = os.path.join(images_dir, name)
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                if size:
                    # private and writable (never written): the chunk writer can send
                    # it to the disk with O_DIRECT, as it does a kernel's arrays, instead
                    # of through the page cache (where a GiB of dirty pages is throttled)
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
        if on_error is not None:
            on_error()
        raise
    finally:
        w._pool.shutdown(wait=True)
        for m in maps:
            m.close()
    w.close()
    return files, w


def get_images(store: Store, snap_id: str, files: list[dict], images_tmp: str | None,
               prefix: str) -> str:
    """A fresh directory (in ``images_tmp`` when it has room for them twice over, else the
    default temporary one) holding the snapshot's image ``files``; a chunk that does not
    read back marks the snapshot bad (``verify_failed``). The caller removes the directory;
    on an error it is removed here."""
    need = sum(e["size"] for e in files)
    base = images_tmp if images_tmp and os.path.isdir(images_tmp) and \
        shutil.disk_usage(images_tmp).free > 2 * need + (64 << 20) else None
    images = tempfile.mkdtemp(prefix=prefix, dir=base)
    try:
        for e in files:
            try:
                chunkio.read_refs_to_file(store.chunk_root, e["chunks"],
                                          os.path.join(images, e["name"]),
                                          e["mode"] or 0o600)
            except chunkio.ChunkError as err:
                store.mark_bad(snap_id, str(err))
                raise SnapshotError("verify_failed", f"snapshot {snap_id}: {err}") \
                    from None
    except BaseException:
        shutil.rmtree(images, ignore_errors=True)
        raise
    return images
