"""The store on its own: chunks, verification, crash safety, retention, quota, the ledger."""

from __future__ import annotations

import json
import mmap
import os

import numpy as np
import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger.snapshots import (
    mark_snapshot_bad,
    record_snapshot,
    record_snapshot_loss,
    snapshot_bytes_by_project,
    snapshots_of,
)
from jupyter_gpubudget.snapshot import SnapshotError, chunkio
from jupyter_gpubudget.snapshot.store import Store
from tests.fixtures.postgres import db_url, postgres_server  # noqa: F401


def take(store: Store, session: str, data: bytes | memoryview, project: str = "lattice",
         **kw):  # noqa: ANN003, ANN201
    """A snapshot holding ``data`` (what a backend does, without a kernel)."""
    st = store.begin(session, project, "namespace")
    w = chunkio.ChunkWriter(st.chunk_root, fsync=store.fsync)
    refs = w.refs(w.put(data))
    w.close()
    return store.commit(st, {"refs": refs}, refs, raw_bytes=len(data),
                        written_bytes=w.written_bytes, **kw)


def read_back(store: Store, snap) -> bytes:  # noqa: ANN001
    return bytes(chunkio.read_refs(store.chunk_root, store.load(snap.id)["payload"]["refs"]))


def test_chunks_round_trip_are_content_addressed_and_compressed_when_it_pays(tmp_path):
    root = str(tmp_path / "chunks")
    noise = os.urandom(3 * chunkio.CHUNK + 123)
    ramp = np.arange(2 * chunkio.CHUNK // 8, dtype=np.float64)
    w = chunkio.ChunkWriter(root)
    refs_noise, refs_ramp = w.refs(w.put(noise)), w.refs(w.put(ramp))
    w.close()
    assert [r[1] for r in refs_noise] == [chunkio.CHUNK] * 3 + [123]
    assert {r[2] for r in refs_noise} == {"raw"}  # random bytes: not worth compressing
    assert {r[2] for r in refs_ramp} == {"zst"}
    assert w.written_bytes < len(noise) + ramp.nbytes // 2
    assert bytes(chunkio.read_refs(root, refs_noise)) == noise
    back = np.frombuffer(chunkio.read_refs(root, refs_ramp), dtype=np.float64)
    assert np.array_equal(back, ramp)
    # the same content again: hashed, nothing written
    w2 = chunkio.ChunkWriter(root)
    assert w2.refs(w2.put(noise)) == refs_noise
    w2.close()
    assert w2.written_bytes == 0 and w2.reused == 4


def _does_direct(directory) -> bool:  # noqa: ANN001
    page = mmap.mmap(-1, chunkio.ALIGN)  # page-aligned memory
    try:
        fd = os.open(directory / "direct-probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
    except OSError:
        return False
    try:
        os.write(fd, page)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        os.unlink(directory / "direct-probe")


def test_large_buffers_go_straight_from_memory_and_are_checked_when_read(tmp_path):
    root = str(tmp_path / "chunks")
    arr = np.random.default_rng(3).random((2 * chunkio.CHUNK + 40_000) // 8)  # noise: raw
    addr = arr.ctypes.data
    w = chunkio.ChunkWriter(root)
    refs = w.refs(w.put(arr))
    w.close()
    assert sum(r[1] for r in refs) == arr.nbytes and {r[2] for r in refs} == {"raw"}
    head = -addr % chunkio.ALIGN
    # chunks after a short head start at page-aligned addresses: they can go O_DIRECT
    assert [r[1] for r in refs][:1] == ([head] if head else [chunkio.CHUNK])
    starts = np.cumsum([0] + [r[1] for r in refs[:-1]])
    assert all((addr + int(a)) % chunkio.ALIGN == 0 for a in starts[1 if head else 0:])
    if _does_direct(tmp_path):
        assert w.direct_bytes >= 2 * chunkio.CHUNK - chunkio.ALIGN
    else:  # a filesystem without O_DIRECT: noticed once, everything buffered
        assert w.direct_bytes == 0 and not w.direct
    back = np.frombuffer(chunkio.read_refs(root, refs), dtype=np.float64)
    assert np.array_equal(back, arr)
    # the same content again: the same chunks (the same alignment), nothing written
    w2 = chunkio.ChunkWriter(root)
    assert w2.refs(w2.put(arr)) == refs and w2.written_bytes == 0
    w2.close()
    # a flipped byte and a truncated chunk, both written direct, are caught when read into place
    big = max(refs, key=lambda r: r[1])
    path = chunkio.chunk_path(root, big[0], big[2])
    with open(path, "r+b") as f:
        f.seek(chunkio.CHUNK // 2)
        f.write(b"\x00\x01\x02")
    with pytest.raises(chunkio.ChunkError, match="checksum"):
        chunkio.read_refs(root, refs)
    with open(path, "r+b") as f:
        f.truncate(chunkio.CHUNK // 3)
    with pytest.raises(chunkio.ChunkError, match="bytes, expected"):
        chunkio.read_refs(root, refs)
    os.unlink(path)
    with pytest.raises(chunkio.ChunkError, match="missing"):
        chunkio.read_refs(root, refs)


def test_commit_verifies_and_lists(store):
    data = os.urandom(1000) * 3000
    snap = take(store, "w1", data)
    assert snap.id.startswith("w1--") and snap.method == "namespace"
    assert snap.raw_bytes == len(data) and 0 < snap.stored_bytes < len(data)
    assert store.verify(snap.id) == []
    assert [s.id for s in store.list(session="w1")] == [snap.id]
    assert read_back(store, snap) == data
    assert store.load(snap.id)["checksum"] == snap.digest


def test_corrupted_chunk_is_detected_reported_never_used_and_kept(store):
    good = take(store, "w1", b"A" * 100_000 + os.urandom(5000))
    bad = take(store, "w1", b"B" * 100_000 + os.urandom(5000))
    refs = store.load(bad.id)["payload"]["refs"]
    path = chunkio.chunk_path(store.chunk_root, refs[0][0], refs[0][2])
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xfe\xfd")
    assert store.verify(bad.id) != []
    assert store.verify(good.id) == []
    usable, skipped = store.usable("w1")
    assert usable is not None and usable.id == good.id
    assert [s.id for s in skipped] == [bad.id] and skipped[0].status == "bad"
    assert "checksum" in skipped[0].problem or "corrupt" in skipped[0].problem
    # reported bad from now on, still there (never deleted silently), not counted as kept
    listed = {s.id: s for s in store.list(session="w1")}
    assert listed[bad.id].status == "bad" and listed[good.id].status == "ok"
    assert os.path.exists(store.manifest_path(bad.id))
    assert store.gc(min_age=0) == 0  # its chunks stay with it


def test_truncated_manifest_is_listed_bad_and_the_previous_snapshot_is_used(store):
    first = take(store, "w1", b"first" * 10_000)
    second = take(store, "w1", b"second" * 10_000)
    path = store.manifest_path(second.id)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    listed = {s.id: s for s in store.list(session="w1")}
    assert listed[second.id].status == "bad" and "does not load" in listed[second.id].problem
    usable, skipped = store.usable("w1")
    assert usable.id == first.id and skipped[0].id == second.id
    assert read_back(store, usable) == b"first" * 10_000
    # a manifest edited so that it still parses does not match its checksum
    m = store.load(first.id)
    m["raw_bytes"] += 1
    with open(store.manifest_path(first.id), "w") as f:
        json.dump(m, f)
    assert "checksum" in store.verify(first.id)[0]


def test_a_crash_mid_snapshot_leaves_the_previous_one_usable(store):
    first = take(store, "w1", b"x" * 50_000)
    # a snapshot dies half-way: chunks written, a chunk's temporary file, no manifest
    st = store.begin("w1", "lattice", "namespace")
    w = chunkio.ChunkWriter(st.chunk_root)
    w.refs(w.put(os.urandom(20_000)))
    w.close()
    os.makedirs(os.path.join(store.chunk_root, "ab"), exist_ok=True)
    with open(os.path.join(store.chunk_root, "ab", "ab12.zst.tmp.1.2"), "wb") as f:
        f.write(b"partial")
    usable, skipped = store.usable("w1")
    assert usable.id == first.id and skipped == []
    assert [s.id for s in store.list()] == [first.id]
    assert store.gc(min_age=0) >= 2  # the orphan chunk and the temporary file
    assert store.verify(first.id) == []


def test_retention_keeps_the_last_n_good_snapshots(tmp_path):
    store = Store(str(tmp_path / "s"), keep_last=2)
    snaps = [take(store, "w1", f"v{i}".encode() * 1000) for i in range(4)]
    take(store, "w2", b"other" * 1000)
    kept = [s.id for s in store.list(session="w1")]
    assert kept == [snaps[3].id, snaps[2].id]
    assert snaps[3].summary["pruned"] == [snaps[1].id]
    assert len(store.list(session="w2")) == 1


def test_quota_deletes_older_snapshots_then_refuses(tmp_path):
    store = Store(str(tmp_path / "s"), keep_last=5, project_quota={"lattice": 250_000})
    a = take(store, "w1", os.urandom(100_000))
    b = take(store, "w1", os.urandom(100_000))
    c = take(store, "w1", os.urandom(100_000))  # 300 kB > quota: the oldest goes
    assert [s.id for s in store.list(project="lattice")] == [c.id, b.id]
    assert store.usage("lattice") <= 250_000
    with pytest.raises(SnapshotError) as e:
        take(store, "w2", os.urandom(300_000))
    assert e.value.reason == "quota" and "lattice" in e.value.message
    assert store.verify(c.id) == [] and a.id not in {s.id for s in store.list()}
    assert not os.listdir(os.path.join(store.root, "staging"))


@pytest.mark.parametrize("session", ["", "../etc", "a/b", "x" * 49, "-lead"])
def test_bad_session_ids_are_refused_by_name(store, session):
    with pytest.raises(SnapshotError) as e:
        store.begin(session, "lattice", "namespace")
    assert e.value.reason == "bad_input" and "session" in e.value.message


def test_snapshot_ids_cannot_escape_the_store(store):
    with pytest.raises(SnapshotError):
        store.load("../../etc/passwd")


BUDGETS = """
admins: [root]
accounts:
  physics:
    grant: 100
    children:
      lattice: {grant: 60, members: [bob]}
"""


def test_ledger_records_snapshots_bad_ones_and_losses(store, db_url):  # noqa: F811
    upgrade(db_url)
    engine = connect(db_url)
    try:
        led = Ledger(engine)
        led.sync_budgets(load_budgets(BUDGETS), now=1.0)
        w = led.submit(project="lattice", user="bob", kind="interactive", request={}, now=2.0)
        store.keep_last = 1
        s1 = take(store, w.id, b"one" * 1000)
        record_snapshot(led, s1, now=3.0)
        s2 = take(store, w.id, b"two" * 1000)
        row = record_snapshot(led, s2, now=4.0)
        assert row.size == s2.stored_bytes and row.status == "ok" and row.verified
        rows = snapshots_of(led, w.id)
        assert [r.id for r in rows] == [s2.id]  # s1 was pruned by retention
        assert snapshots_of(led, w.id, statuses=("deleted",))[0].problem == "retention"
        mark_snapshot_bad(led, s2.id, "chunk 1234 does not match its checksum", now=5.0)
        r = snapshots_of(led, w.id)[0]
        assert r.status == "bad" and not r.verified and "checksum" in r.problem
        assert snapshot_bytes_by_project(led) == {}
        record_snapshot_loss(led, w.id, "grace period over, no snapshot", now=6.0)
        kinds = [d.kind for d in led.decisions(workloads=[w.id])]
        assert kinds[:3] == ["snapshot_lost", "snapshot_bad", "snapshot"]
        # sizes beyond 32 bits fit
        s2.stored_bytes = 5 << 30
        assert record_snapshot(led, s2, now=7.0).size == 5 << 30
        assert snapshots_of(led, w.id)[0].size == 5 << 30
    finally:
        engine.dispose()
