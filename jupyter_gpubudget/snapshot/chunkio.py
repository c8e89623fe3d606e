"""Content-addressed, checksummed, compressed chunks: the one format every snapshot is made of.

This module is deliberately self-contained (standard library, plus ``zstandard`` when it is
importable): the namespace backend sends its source into the kernel, which may run in another
Python environment, and the kernel writes its chunks straight into the store with it.

A chunk is at most ``CHUNK`` bytes of raw data, named by the SHA-256 of those raw bytes, stored
as ``<root>/<hh>/<sha256>.zst`` (zstd) or ``.raw`` (when compression would not save 3%; a 64 KiB
probe decides first, so noise costs no compression; and, by default, only when compressing
saves more disk time than it costs CPU time, as measured while writing: see
``ChunkWriter._pays``). Each is written to a temporary name,
fdatasynced and renamed by the thread that made it, so the disk writes while other threads
hash and compress, and a chunk never has its final name before its bytes are durable; the
directories are fsynced once, at ``close``. The same content is never written twice (that is
the deduplication between successive snapshots).
A reference to a chunk is the list ``[sha256, raw_length, codec, stored_length]`` (the last
was added later: references without it are read the same; with it, a missing or truncated
chunk is found without reading it).

Reading checks every chunk: its length, and its content against its SHA-256 — or, for zstd
chunks written with a frame checksum (every chunk since this format carries one), zstd's own
XXH64 of the content, checked while decompressing (a truncated or corrupted chunk fails
either way; it saves hashing the data a second time on restore).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import mmap
import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor

try:
    import zstandard as _zstd
except ImportError:  # the kernel's environment may lack it: chunks are then stored raw
    _zstd = None

CHUNK = 32 << 20  # fewer, larger files: 1 GiB in 32 fdatasyncs (8 MiB chunks: ~20% slower)
# Raw chunks of large writable buffers are written with O_DIRECT, straight from the buffer's
# memory to the disk: no copy into the page cache (that copy costs as much CPU as hashing
# does, and a GiB of dirty pages gets the writer throttled). O_DIRECT needs the memory
# address, file offset and length aligned: chunks of such a buffer start at ALIGN-aligned
# addresses (a short head chunk first), and a chunk's unaligned tail is written buffered.
ALIGN = 4096
DIRECT_MIN = 1 << 20  # buffers smaller than this are chunked from their start, written buffered
_O_DIRECT = getattr(os, "O_DIRECT", 0)
#: chunks read from or written to the disk at once, per process (reads) or writer (writes).
#: A thread waits for its turn before its I/O and hashes or compresses outside it: the threads
#: then fall into a pipeline (while two read or write, the others hash) instead of all reading
#: at once and then all hashing at once, which left the disk idle half of the time.
IO_AT_ONCE = 2
_READS = threading.BoundedSemaphore(IO_AT_ONCE)
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

    def __init__(self, root: str, *, threads: int | None = None,
                 compress: bool | str = "auto", fsync: bool = True,
                 direct: bool = True) -> None:
        self.root = root
        # O_DIRECT for aligned raw chunks; off for good once the filesystem refuses it
        self.direct = bool(direct and _O_DIRECT)
        self.direct_bytes = 0
        self.compress = bool(compress) and _zstd is not None
        self.adaptive = compress == "auto"
        # measured while writing (EWMA, bytes per second of a worker's own time): whether
        # compressing a chunk saves more disk time than it costs CPU time
        self.cpu_rate: float | None = None
        self.disk_rate: float | None = None
        self.compressed_chunks = self.raw_chunks = 0
        self.fsync = fsync
        # threads overlap hashing, compressing and writing (they release the GIL)
        self._pool = ThreadPoolExecutor(max_workers=_threads(threads))
        self._local = threading.local()
        self._dirs: set[str] = set()
        self._pending: list[str] = []  # temporary files being written
        self._lock = threading.Lock()
        self._io = threading.BoundedSemaphore(IO_AT_ONCE)
        #: chunks this writer wrote and made durable: digest -> stored size
        self.fresh: dict[str, int] = {}
        self.raw_bytes = 0
        self.written_bytes = 0  # stored bytes of the chunks this writer wrote (not deduplicated)
        self.reused = 0
        #: seconds the workers spent, summed over threads: where a dump's time goes
        self.busy = {"hash": 0.0, "compress": 0.0, "write": 0.0, "sync": 0.0}

    def _busy(self, what: str, seconds: float) -> None:
        with self._lock:
            self.busy[what] += seconds

    def _compressor(self):  # noqa: ANN202
        c = getattr(self._local, "c", None)
        if c is None:
            c = self._local.c = _zstd.ZstdCompressor(level=LEVEL, write_checksum=True,
                                                     write_content_size=True)
        return c

    def _one(self, view: memoryview, aligned: bool = False) -> list:
        t0 = time.perf_counter()
        digest = hashlib.sha256(view).hexdigest()
        self._busy("hash", time.perf_counter() - t0)
        n = len(view)
        have = existing(self.root, digest)
        if have is not None:
            try:  # refreshed, so garbage collection leaves it to the snapshot reusing it
                os.utime(chunk_path(self.root, digest, have))
            except OSError:
                pass
            try:
                stored = os.path.getsize(chunk_path(self.root, digest, have))
            except OSError:
                stored = -1
            with self._lock:
                self.raw_bytes += n
                self.reused += 1
            return [digest, n, have, stored] if stored >= 0 else [digest, n, have]
        codec, data = "raw", view
        t0 = time.perf_counter()
        ratio = self._probe(view) if self.compress and n >= 512 else 1.0
        self._busy("compress", time.perf_counter() - t0)
        if ratio < 0.9 and self._pays(n, ratio):
            t0 = time.perf_counter()
            z = self._compressor().compress(view)
            self._learn("cpu_rate", n, time.perf_counter() - t0)
            self._busy("compress", time.perf_counter() - t0)
            if len(z) < 0.97 * n:
                codec, data = "zst", z
        path = chunk_path(self.root, digest, codec)
        d = os.path.dirname(path)
        if d not in self._dirs:
            os.makedirs(d, exist_ok=True)
            with self._lock:
                self._dirs.add(d)
        tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}.{id(view):x}"
        with self._lock:
            self._pending.append(tmp)
        t0 = time.perf_counter()
        fd, direct = self._open(tmp, aligned and codec == "raw" and n >= ALIGN)
        try:
            mv = memoryview(data)
            with self._io:  # the disk's turn (IO_AT_ONCE); the wait counts as writing
                if direct:
                    mv = self._write_direct(fd, mv)
                while mv:
                    k = os.write(fd, mv)
                    mv = mv[k:]
            t1 = time.perf_counter()
            self._busy("write", t1 - t0)
            if self.fsync:  # durable before it has its name; other threads work meanwhile
                os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self._busy("sync", time.perf_counter() - t1)
        self._learn("disk_rate", len(data), time.perf_counter() - t0)
        with self._lock:
            self._pending.remove(tmp)
            self.raw_bytes += n
            self.written_bytes += len(data)
            self.fresh[digest] = len(data)
            if codec == "zst":
                self.compressed_chunks += 1
            else:
                self.raw_chunks += 1
        return [digest, n, codec, len(data)]

    def _open(self, tmp: str, direct: bool) -> tuple[int, bool]:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        if direct and self.direct:
            try:
                return os.open(tmp, flags | _O_DIRECT, 0o640), True
            except OSError:  # this filesystem does not do O_DIRECT: buffered from now on
                self.direct = False
        return os.open(tmp, flags, 0o640), False

    def _write_direct(self, fd: int, mv: memoryview) -> memoryview:
        """Write the aligned body of ``mv`` with O_DIRECT; return what is left (its unaligned
        tail, or more if the device refused), with O_DIRECT cleared for the buffered rest."""
        body = len(mv) - len(mv) % ALIGN
        done = 0
        try:
            while done < body:
                k = os.write(fd, mv[done:body])
                done += k
                if k % ALIGN:
                    break  # a short, unaligned write: the rest goes buffered
        except OSError:  # alignment this device does not accept: buffered from now on
            self.direct = False
        with self._lock:
            self.direct_bytes += done
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_DIRECT)
        return mv[done:]

    def _learn(self, what: str, nbytes: int, seconds: float) -> None:
        if nbytes < (256 << 10):
            return  # too small to time
        rate = nbytes / max(seconds, 1e-6)
        with self._lock:
            old = getattr(self, what)
            setattr(self, what, rate if old is None else 0.7 * old + 0.3 * rate)

    def _pays(self, n: int, ratio: float) -> bool:
        """Compress when it saves more time writing than it costs compressing: per byte,
        ``1/cpu_rate + ratio/disk_rate < 1/disk_rate`` (rates as this writer measured them,
        under whatever else runs; until it has measured both, it compresses). A slow disk
        gets compressed chunks, a fast one (or a page cache without fsync) raw ones."""
        if not self.adaptive:
            return True
        cpu, disk = self.cpu_rate, self.disk_rate
        if cpu is None or disk is None:
            return True
        return 1.0 / cpu + ratio / disk < 1.0 / disk

    def _probe(self, view: memoryview) -> float:
        """The compressed/raw ratio of a 64 KiB probe from the middle of the chunk: noise
        (random floats, compressed or encrypted data) is stored raw without spending a core
        on it."""
        n = len(view)
        probe = view[n // 2 - min(n // 2, 32768):n // 2 + min(n // 2, 32768)]
        return len(self._compressor().compress(probe)) / max(1, len(probe))

    def put(self, buffer) -> list:  # noqa: ANN001
        view = memoryview(buffer).cast("B")
        n = len(view)
        if not n:
            return []
        addr = _address(view) if self.direct and n >= DIRECT_MIN else None
        head = 0 if addr is None else -addr % ALIGN
        starts = ([0] if head else []) + list(range(head, n, CHUNK))
        ends = starts[1:] + [n]
        return [self._pool.submit(self._one, view[a:b],
                                  addr is not None and (addr + a) % ALIGN == 0)
                for a, b in zip(starts, ends, strict=True)]

    @staticmethod
    def refs(futures: list) -> list:
        return [f.result() for f in futures]

    def close(self) -> None:
        """Wait for every chunk (each already durable under its final name) and make the
        renames durable (fsync the directories)."""
        self._pool.shutdown(wait=True)
        if self.fsync:
            for d in sorted(self._dirs):
                fd = os.open(d, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def abandon(self) -> None:
        """Stop: what is being written is dropped (chunks already complete stay, for gc)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            pending, self._pending = list(self._pending), []
        for tmp in pending:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass


def _address(view: memoryview) -> int | None:
    """The memory address of a writable buffer (None for a read-only one)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError):
        return None


def _open_chunk(path: str, digest: str, flags: int, owner: int | None) -> int:
    """Open a chunk for reading. ``owner``: the account the store belongs to, for a reader
    with more rights than that account (root restoring a job from the service's store): the
    name must be no symlink and the file that account's, so a store's owner can never point
    such a reader at a file it could not read itself."""
    if owner is not None:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ChunkError(f"chunk {digest[:12]} is missing ({path})") from None
    except OSError as e:
        if owner is not None and e.errno == errno.ELOOP:
            raise ChunkError(f"chunk {digest[:12]} is a symlink ({path}): refused") from None
        raise
    if owner is not None:
        st = os.fstat(fd)
        if st.st_uid != owner or not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ChunkError(f"chunk {digest[:12]} ({path}) is not a file of uid {owner}: "
                             "refused")
    return fd


def _read_raw_into(path: str, digest: str, n: int, out: memoryview,
                   owner: int | None = None, check: bool = True) -> None:
    """A raw chunk read straight into its place in ``out`` (no intermediate copy; with
    O_DIRECT, not even through the page cache, when ``out`` is page-aligned), then checked
    there against its SHA-256."""
    addr = _address(out) if _O_DIRECT and n >= ALIGN else None
    fd = -1
    if addr is not None and addr % ALIGN == 0:
        try:
            fd = _open_chunk(path, digest, os.O_RDONLY | _O_DIRECT, owner)
        except ChunkError:
            raise
        except OSError:  # no O_DIRECT on this filesystem
            fd = -1
    direct = fd >= 0
    if not direct:
        fd = _open_chunk(path, digest, os.O_RDONLY, owner)
    try:
        size = os.fstat(fd).st_size
        if size != n:
            raise ChunkError(f"chunk {digest[:12]} has {size} bytes, expected {n}")
        with _READS:  # the disk's turn (IO_AT_ONCE); checked outside it
            got = _read_fd_into(fd, n, out, direct)
    finally:
        os.close(fd)
    if got != n:
        raise ChunkError(f"chunk {digest[:12]} has {got} bytes, expected {n}")
    if check and hashlib.sha256(out).hexdigest() != digest:
        raise ChunkError(f"chunk {digest[:12]} does not match its checksum")


def _read_fd_into(fd: int, n: int, out: memoryview, direct: bool) -> int:
    """Read ``n`` bytes of ``fd`` into ``out`` (its aligned body with O_DIRECT when
    ``direct``, the rest buffered); how many were read."""
    got = 0
    if direct:
        body = n - n % ALIGN
        try:
            while got < body:
                k = os.readv(fd, [out[got:body]])
                got += k
                if not k or k % ALIGN:
                    break
        except OSError:  # alignment this device refuses: the rest buffered
            pass
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_DIRECT)
        os.lseek(fd, got, os.SEEK_SET)
    while got < n:
        k = os.readv(fd, [out[got:n]])
        if not k:
            break
        got += k
    return got


def read_chunk(root: str, ref: list, out: memoryview | None = None,
               owner: int | None = None, check: bool = True) -> bytes | None:
    """Read one chunk, check its length and its content (SHA-256, or the zstd frame's own
    checksum when it has one); into ``out`` when given. ``owner``: see :func:`_open_chunk`.
    ``check`` False: a raw chunk read into ``out`` is not hashed here (its reader checks it
    later: :func:`check_file`); a compressed one is always checked."""
    digest, n, codec = ref[0], ref[1], ref[2]
    if codec not in CODECS:
        raise ChunkError(f"chunk {digest[:12]}: unknown codec {codec!r}")
    path = chunk_path(root, digest, codec)
    if codec == "raw" and out is not None:
        _read_raw_into(path, digest, n, out[:n], owner, check)
        return None
    with os.fdopen(_open_chunk(path, digest, os.O_RDONLY, owner), "rb") as f, _READS:
        data = f.read()
    checked = False
    if codec == "zst":
        if _zstd is None:
            raise ChunkError("zstandard is not importable here: cannot read zstd chunks")
        try:
            params = _zstd.get_frame_parameters(data)
            checked = bool(params.has_checksum) and params.content_size == n
            data = _zstd.ZstdDecompressor().decompress(data, max_output_size=n)
        except _zstd.ZstdError as e:
            raise ChunkError(f"chunk {digest[:12]} is corrupt: {e}") from None
    if len(data) != n:
        raise ChunkError(f"chunk {digest[:12]} has {len(data)} bytes, expected {n}")
    if not checked and hashlib.sha256(data).hexdigest() != digest:
        raise ChunkError(f"chunk {digest[:12]} does not match its checksum")
    if out is None:
        return data
    out[:n] = data
    return None


def _threads(threads: int | None) -> int:
    """Hashing and (de)compressing release the GIL and every chunk ends in a write and an
    fdatasync that wait on the disk: twice as many threads as CPUs (4..8) keep both busy."""
    return threads or max(4, min(8, 2 * (os.cpu_count() or 1)))


def read_refs(root: str, refs: list, *,
              threads: int | None = None) -> bytearray | memoryview:
    """Reassemble chunks into one writable buffer (checked chunk by chunk).

    A large one is anonymous memory (huge pages where the kernel gives them: fewer page
    faults), placed so that the chunks that were written from page-aligned memory land on
    page-aligned addresses again: they are read with O_DIRECT, straight from the disk."""
    total = sum(r[1] for r in refs)
    if total < DIRECT_MIN:
        buf = bytearray(total)
        _read_into(root, refs, memoryview(buf), threads)
        return buf
    first = refs[0][1]
    pad = -first % ALIGN if len(refs) > 1 and first < ALIGN else 0  # a short head chunk
    m = mmap.mmap(-1, total + pad)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    view = memoryview(m)[pad:pad + total]
    _read_into(root, refs, view, threads)
    return view


def _read_into(root: str, refs: list, mv: memoryview, threads: int | None) -> None:
    offsets, pos = [], 0
    for r in refs:
        offsets.append(pos)
        pos += r[1]
    _each(lambda r, o: read_chunk(root, r, mv[o:o + r[1]]), refs, offsets, threads)


def _each(fn, refs: list, offsets: list[int], threads: int | None) -> None:  # noqa: ANN001
    """``fn(ref, offset)`` for every chunk: in this thread for one chunk, else in a pool
    (the first failure is raised, what has not started yet is cancelled)."""
    if len(refs) <= 1:
        for r, o in zip(refs, offsets, strict=True):
            fn(r, o)
        return
    with ThreadPoolExecutor(max_workers=_threads(threads)) as pool:
        futures = [pool.submit(fn, r, o) for r, o in zip(refs, offsets, strict=True)]
        try:
            for f in futures:
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def read_refs_to_file(root: str, refs: list, path: str, mode: int = 0o600, *,
                      threads: int | None = None) -> None:
    """Reassemble chunks straight into a new file: several threads each read, check and
    ``pwrite`` their chunks at their offsets (no copy of the whole content in memory)."""
    offsets, pos = [], 0
    for r in refs:
        offsets.append(pos)
        pos += r[1]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def one(ref: list, offset: int) -> None:
        data = memoryview(read_chunk(root, ref))  # type: ignore[arg-type]
        while data:
            k = os.pwrite(fd, data, offset)
            data, offset = data[k:], offset + k

    try:
        _each(one, refs, offsets, threads)
    finally:
        os.close(fd)


def fill_file(root: str, refs: list, dir_fd: int, name: str, *, owner: int | None = None,
              threads: int | None = None, check: bool = True) -> None:
    """Reassemble chunks into the new file ``name`` (created, mode 0600, never through a
    symlink) in the directory ``dir_fd``, in one copy: the file is sized first and mapped, and
    every chunk is read, in parallel, straight into its place (raw chunks with O_DIRECT: from
    the disk into the file's pages, not through the page cache) and checked there.
    ``owner``: see :func:`_open_chunk`. ``check`` False: raw chunks are not hashed yet (the
    caller checks the file with :func:`check_file` before it is used). On an error the file
    is left for the caller to remove with its directory."""
    offsets, pos = [], 0
    for r in refs:
        offsets.append(pos)
        pos += r[1]
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                 dir_fd=dir_fd)
    try:
        if not pos:
            return
        os.ftruncate(fd, pos)
        m = mmap.mmap(fd, pos, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        view = memoryview(m)
        err = None
        try:
            _each(lambda r, o: read_chunk(root, r, view[o:o + r[1]], owner, check), refs,
                  offsets, threads)
        except BaseException as e:  # noqa: BLE001 - raised below, once the map is let go
            # its traceback's frames hold slices of the map, which could not be closed
            err = e.with_traceback(None)
        try:
            view.release()
            m.close()
        except BufferError:  # a slice still held somewhere: the map goes with it
            pass
        if err is not None:
            raise err
    finally:
        os.close(fd)


def check_file(dir_fd: int, name: str, refs: list, *, threads: int | None = None) -> None:
    """Check the raw chunks of a file :func:`fill_file` wrote with ``check=False`` against
    their SHA-256 (a ``ChunkError`` for the first that differs); compressed ones were checked
    as they were read."""
    offsets, pos = [], 0
    for r in refs:
        offsets.append(pos)
        pos += r[1]
    raw = [(r, o) for r, o in zip(refs, offsets, strict=True) if r[2] == "raw"]
    if not raw:
        return
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        m = mmap.mmap(fd, pos, mmap.MAP_SHARED, mmap.PROT_READ)
        view = memoryview(m)

        def one(r: list, o: int) -> None:
            if hashlib.sha256(view[o:o + r[1]]).hexdigest() != r[0]:
                raise ChunkError(f"chunk {r[0][:12]} does not match its checksum")

        err = None
        try:
            _each(one, [r for r, _ in raw], [o for _, o in raw], threads)
        except BaseException as e:  # noqa: BLE001 - raised below, once the map is let go
            err = e.with_traceback(None)
        try:
            view.release()
            m.close()
        except BufferError:  # a slice still held somewhere: the map goes with it
            pass
        if err is not None:
            raise err
    finally:
        os.close(fd)


def verify_refs(root: str, refs: list, *, deep: bool = True,
                threads: int | None = None) -> list[str]:
    """Problems with these chunks (empty when all are present and, if ``deep``, intact)."""
    if not deep:
        out = []
        for r in refs:
            try:
                size = os.path.getsize(chunk_path(root, r[0], r[2]))
            except (OSError, IndexError):
                out.append(f"chunk {r[0][:12]} is missing")
                continue
            if len(r) > 3 and size != r[3]:
                out.append(f"chunk {r[0][:12]} has {size} bytes stored, {r[3]} were written "
                           "(truncated or damaged)")
        return out

    def one(ref: list) -> str | None:
        try:
            read_chunk(root, ref)
        except ChunkError as e:
            return str(e)
        return None

    with ThreadPoolExecutor(max_workers=_threads(threads)) as pool:
        return [p for p in pool.map(one, refs) if p is not None]
