"""Content-addressed, checksummed, compressed chunks: the one format every snapshot is made of.

This module is deliberately self-contained (standard library, plus ``zstandard`` when it is
importable): the namespace backend sends its source into the kernel, which may run in another
Python environment, and the kernel writes its chunks straight into the store with it.

A chunk is at most ``CHUNK`` bytes of raw data, named by the SHA-256 of those raw bytes, stored
as ``<root>/<hh>/<sha256>.zst`` (zstd) or ``.raw`` (when compression would not save 3%). It is
written to a temporary name, fsynced and renamed (all of a writer's chunks at once, at
``close``, so the disk writes back while the next chunks are hashed), so a chunk file is
always complete; the same
content is never written twice (that is the deduplication between successive snapshots).
A reference to a chunk is the list ``[sha256, raw_length, codec]``.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

try:
    import zstandard as _zstd
except ImportError:  # the kernel's environment may lack it: chunks are then stored raw
    _zstd = None

CHUNK = 8 << 20
LEVEL = 1  # zstd's fastest ordinary level: ~1 GB/s per core, incompressible data costs little
CODECS = ("zst", "raw")


class ChunkError(Exception):
    """A chunk is missing, truncated or does not match its checksum."""


def chunk_path(root: str, digest: str, codec: str) -> str:
    return os.path.join(root, digest[:2], f"{digest}.{codec}")


def existing(root: str, digest: str) -> str | None:
    """The codec of a stored chunk with this content, if any."""
    for codec in CODECS:
        if os.path.exists(chunk_path(root, digest, codec)):
            return codec
    return None


class ChunkWriter:
    """Writes buffers as chunks, hashing and compressing on a small thread pool.

    ``put(buffer)`` returns a list of futures of references, in order; ``refs(futures)`` waits.
    Buffers are sliced with memoryviews: nothing is copied before compression."""

    def __init__(self, root: str, *, threads: int | None = None, compress: bool = True,
                 fsync: bool = True) -> None:
        self.root = root
        self.compress = compress and _zstd is not None
        self.fsync = fsync
        # threads overlap hashing, compressing and writing (they release the GIL)
        self._pool = ThreadPoolExecutor(max_workers=threads or max(2, min(4, os.cpu_count() or 1)))
        self._local = threading.local()
        self._dirs: set[str] = set()
        self._pending: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.raw_bytes = 0
        self.written_bytes = 0  # stored bytes of the chunks this writer wrote (not deduplicated)
        self.reused = 0

    def _compressor(self):  # noqa: ANN202
        c = getattr(self._local, "c", None)
        if c is None:
            c = self._local.c = _zstd.ZstdCompressor(level=LEVEL)
        return c

    def _one(self, view: memoryview) -> list:
        digest = hashlib.sha256(view).hexdigest()
        n = len(view)
        have = existing(self.root, digest)
        if have is not None:
            try:  # refreshed, so garbage collection leaves it to the snapshot reusing it
                os.utime(chunk_path(self.root, digest, have))
            except OSError:
                pass
            with self._lock:
                self.raw_bytes += n
                self.reused += 1
            return [digest, n, have]
        codec, data = "raw", view
        if self.compress and n >= 512 and self._worth_compressing(view):
            z = self._compressor().compress(view)
            if len(z) < 0.97 * n:
                codec, data = "zst", z
        path = chunk_path(self.root, digest, codec)
        d = os.path.dirname(path)
        if d not in self._dirs:
            os.makedirs(d, exist_ok=True)
            with self._lock:
                self._dirs.add(d)
        tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}.{id(view):x}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        try:
            mv = memoryview(data)
            while mv:
                k = os.write(fd, mv)
                mv = mv[k:]
        finally:
            os.close(fd)
        # renamed (and fsynced first) in close(): the page cache writes back meanwhile, and a
        # chunk never has its final name before its bytes are on disk
        with self._lock:
            self._pending.append((tmp, path))
            self.raw_bytes += n
            self.written_bytes += len(data)
        return [digest, n, codec]

    def _worth_compressing(self, view: memoryview) -> bool:
        """A 64 KiB probe from the middle of the chunk: noise (random floats, compressed or
        encrypted data) is stored raw without spending a core on it."""
        n = len(view)
        probe = view[n // 2 - min(n // 2, 32768):n // 2 + min(n // 2, 32768)]
        return len(self._compressor().compress(probe)) < 0.9 * len(probe)

    def put(self, buffer) -> list:  # noqa: ANN001
        view = memoryview(buffer).cast("B")
        return [self._pool.submit(self._one, view[i:i + CHUNK])
                for i in range(0, max(len(view), 1), CHUNK)] if len(view) else []

    @staticmethod
    def refs(futures: list) -> list:
        return [f.result() for f in futures]

    def close(self) -> None:
        """Wait for every chunk, make it durable (fsync), give it its final name, and make
        the renames durable (fsync the directories)."""
        self._pool.shutdown(wait=True)
        pending, self._pending = self._pending, []

        def sync(item: tuple[str, str]) -> None:
            tmp, path = item
            if self.fsync:
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(tmp, path)

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(sync, pending))
        if self.fsync:
            for d in sorted(self._dirs):
                fd = os.open(d, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def abandon(self) -> None:
        """Drop what was written (a dump that failed half-way)."""
        self._pool.shutdown(wait=True)
        for tmp, _ in self._pending:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        self._pending = []


def read_chunk(root: str, ref: list, out: memoryview | None = None) -> bytes | None:
    """Read one chunk, check its length and checksum; into ``out`` when given."""
    digest, n, codec = ref
    if codec not in CODECS:
        raise ChunkError(f"chunk {digest[:12]}: unknown codec {codec!r}")
    path = chunk_path(root, digest, codec)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ChunkError(f"chunk {digest[:12]} is missing ({path})") from None
    if codec == "zst":
        if _zstd is None:
            raise ChunkError("zstandard is not importable here: cannot read zstd chunks")
        try:
            data = _zstd.ZstdDecompressor().decompress(data, max_output_size=n)
        except _zstd.ZstdError as e:
            raise ChunkError(f"chunk {digest[:12]} is corrupt: {e}") from None
    if len(data) != n:
        raise ChunkError(f"chunk {digest[:12]} has {len(data)} bytes, expected {n}")
    if hashlib.sha256(data).hexdigest() != digest:
        raise ChunkError(f"chunk {digest[:12]} does not match its checksum")
    if out is None:
        return data
    out[:n] = data
    return None


def read_refs(root: str, refs: list, *, threads: int | None = None) -> bytearray:
    """Reassemble chunks into one writable buffer (checked chunk by chunk)."""
    total = sum(r[1] for r in refs)
    buf = bytearray(total)
    mv = memoryview(buf)
    offsets, pos = [], 0
    for r in refs:
        offsets.append(pos)
        pos += r[1]
    if len(refs) <= 1:
        for r, o in zip(refs, offsets, strict=True):
            read_chunk(root, r, mv[o:o + r[1]])
        return buf
    with ThreadPoolExecutor(max_workers=threads or min(4, os.cpu_count() or 1)) as pool:
        for f in [pool.submit(read_chunk, root, r, mv[o:o + r[1]])
                  for r, o in zip(refs, offsets, strict=True)]:
            f.result()
    return buf


def verify_refs(root: str, refs: list, *, deep: bool = True,
                threads: int | None = None) -> list[str]:
    """Problems with these chunks (empty when all are present and, if ``deep``, intact)."""
    if not deep:
        return [f"chunk {r[0][:12]} is missing" for r in refs if existing(root, r[0]) is None]

    def one(ref: list) -> str | None:
        try:
            read_chunk(root, ref)
        except ChunkError as e:
            return str(e)
        return None

    with ThreadPoolExecutor(max_workers=threads or min(4, os.cpu_count() or 1)) as pool:
        return [p for p in pool.map(one, refs) if p is not None]
