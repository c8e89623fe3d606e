"""The namespace backend with real ipykernel kernels: dump one, restore into a fresh one."""

from __future__ import annotations

import os

import pytest

from jupyter_gpubudget.snapshot import SnapshotError, chunkio
from jupyter_gpubudget.snapshot.namespace import NamespaceSnapshotter
from jupyter_gpubudget.snapshot.nskernel import replay_verdict

from .state import CHECKS, cells


def define(kernelset, ref, tmp, mib) -> None:  # noqa: ANN001
    for c in cells(str(tmp), mib):
        r = kernelset.run(ref, c)
        assert r.status == "ok", r.error


def test_namespace_dump_and_restore_every_value(kernelset, store, tmp_path):
    _, k1 = kernelset.start("k1")
    define(kernelset, k1, tmp_path, 32)
    kernelset.run(k1, "import threading\nguard = threading.Lock()")
    ns = NamespaceSnapshotter(store)
    snap = ns.dump(k1)
    assert snap.method == "namespace" and store.verify(snap.id) == []
    assert snap.raw_bytes >= 32 << 20 and snap.stored_bytes < snap.raw_bytes
    unsaved = snap.summary["unsaved"]
    assert set(unsaved) == {"handle", "squares", "guard"}, unsaved
    assert "big" in snap.summary["variables"] and snap.summary["modules"]["np"] == "numpy"
    # the snapshot left no trace in the user's kernel: no new names, no history entry
    r = kernelset.run(k1, "print(sorted(k for k in globals() if 'gpubudget' in k), len(In))")
    assert r.stdout.split() == ["[]", str(len(cells(str(tmp_path), 32)) + 3)]

    _, k2 = kernelset.start("k2")
    report = ns.restore(snap, k2)
    assert {"big", "frame", "scaled", "offset", "Counter", "counter"} <= set(report.restored)
    assert set(report.reimported) == {"np", "pd", "threading"}
    assert report.recomputed == {"squares": "by replaying cell 9",
                                 "guard": "by replaying cell 10"}
    assert set(report.lost) == {"handle"}
    assert "opens a file for writing" in report.lost["handle"]
    assert "not opened for reading" in report.lost["handle"]
    assert "lost handle" in report.summary()
    r = kernelset.run(k2, CHECKS + "\nassert list(squares) == [0, 1, 4, 9, 16, 25]\n"
                      "assert guard.acquire(blocking=False)\nprint('replayed ok')\n"
                      "print('handle' in globals(), In[2].splitlines()[0])")
    assert r.status == "ok", r.error
    lines = r.stdout.splitlines()
    assert lines[0] == f"big ok {32 << 20}" and "replayed ok" in lines
    assert lines[-1] == "False big = np.arange(4194304, dtype=np.float64) % 2147483647"
    # the execution count goes on where it was
    r = kernelset.run(k2, "print(get_ipython().execution_count)")
    assert int(r.stdout) >= 12


def test_a_corrupted_snapshot_is_reported_not_used_and_the_previous_one_restores(
        kernelset, store, tmp_path):
    _, k1 = kernelset.start("k1")
    kernelset.run(k1, "import numpy as np\nv = np.full(3 << 20, 1.0)\ntag = 'first'")
    ns = NamespaceSnapshotter(store)
    first = ns.dump(k1)
    kernelset.run(k1, "v = np.full(3 << 20, 2.0)\ntag = 'second'")
    second = ns.dump(k1)
    # bytes of the second snapshot's own chunk (its array) flipped on disk
    own = {r[0] for r in store.load(second.id)["chunks"]} - {
        r[0] for r in store.load(first.id)["chunks"]}
    ref = next(r for r in store.load(second.id)["chunks"] if r[0] in own and r[1] > 1 << 20)
    path = chunkio.chunk_path(store.chunk_root, ref[0], ref[2])
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\x00garbage\x00")
    _, k2 = kernelset.start("k2")
    with pytest.raises(SnapshotError) as e:
        ns.restore(second, k2)
    assert e.value.reason == "verify_failed"
    listed = {s.id: s for s in store.list(session="w1")}
    assert listed[second.id].status == "bad" and listed[second.id].problem
    r = kernelset.run(k2, "print('v' in globals(), 'tag' in globals())")
    assert r.stdout.split() == ["False", "False"]  # nothing half-restored
    usable, skipped = store.usable("w1")
    assert usable.id == first.id and [s.id for s in skipped] == [second.id]
    _, k3 = kernelset.start("k3")
    ns.restore(usable, k3)
    r = kernelset.run(k3, "print(tag, float(v.sum()) == float(3 << 20))")
    assert r.stdout.split() == ["first", "True"]


def test_a_dump_that_fails_in_the_kernel_publishes_nothing(kernelset, store):
    _, k1 = kernelset.start("k1")
    kernelset.run(k1, "x = 1")
    ns = NamespaceSnapshotter(store)
    first = ns.dump(k1)
    # the chunk directory is a plain file for a moment: every chunk write fails (even as root)
    os.rename(store.chunk_root, store.chunk_root + ".away")
    with open(store.chunk_root, "w") as f:
        f.write("not a directory")
    kernelset.run(k1, "y = 2")
    try:
        with pytest.raises(SnapshotError) as e:
            ns.dump(k1)
    finally:
        os.unlink(store.chunk_root)
        os.rename(store.chunk_root + ".away", store.chunk_root)
    assert e.value.reason == "dump_failed" and "NotADirectoryError" in e.value.message
    assert [s.id for s in store.list()] == [first.id]
    assert os.listdir(os.path.join(store.root, "staging")) == []
    r = kernelset.run(k1, "print(x, y)")  # the kernel is untouched
    assert r.stdout.split() == ["1", "2"]


@pytest.mark.parametrize("code,restored,why", [
    ("x = 1", set(), None),
    ("import os\nx = os.getcwd()", {"os"}, None),
    ("f = open('data.csv')", set(), None),
    ("f = open('out.csv', 'w')", set(), "opens a file for writing"),
    ("f = open('out.csv', mode=m)", set(), "opens a file for writing"),
    ("df.to_csv('x.csv')\ny = 2", set(), "to_csv"),
    ("y = df.to_csv('x.csv')", set(), "to_csv"),
    ("y = os.remove('x')", set(), "os.remove"),
    ("y = subprocess.run(['ls'])", set(), "subprocess.run"),
    ("for i in range(3):\n    y = i", set(), "for loop"),
    ("a = 1\nb = 2", {"a"}, "would overwrite restored variables a"),
    ("y = get_ipython().run_line_magic('time', '1')", set(), "magic"),
    ("def f(:", set(), "does not parse"),
])
def test_replay_verdicts(code, restored, why):
    verdict = replay_verdict(code, restored)
    if why is None:
        assert verdict is None
    else:
        assert verdict is not None and why in verdict
