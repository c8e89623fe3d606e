"""The CRIU backend with real ipykernel kernels and a real CRIU (root; ``make criu``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jupyter_gpubudget.snapshot import KernelRef, SnapshotError, choose, chunkio, kernels
from jupyter_gpubudget.snapshot.criusnap import CriuSnapshotter
from jupyter_gpubudget.snapshot.namespace import NamespaceSnapshotter
from jupyter_gpubudget.snapshot.privcall import Privileged
from jupyter_gpubudget.snapshot.store import Store

from .state import CHECKS, cells

LAUNCHER = [sys.executable, "-m", "jupyter_gpubudget.snapshot.privileged"]


def reap(km) -> None:  # noqa: ANN001
    """The dumped kernel's parent (here: this test) reaps it, freeing its pid."""
    km.provisioner.process.wait(10)


def test_criu_dumps_and_restores_a_1gib_kernel_with_every_value(criu_bin, kernelset, store,
                                                                 tmp_path):
    km, k1 = kernelset.start("k1")
    for c in cells(str(tmp_path), 1024):
        r = kernelset.run(k1, c, timeout=120)
        assert r.status == "ok", r.error
    cs = CriuSnapshotter(store)
    assert cs.available(k1).ok
    snap = cs.dump(k1)
    assert snap.method == "criu" and snap.raw_bytes > 1 << 30
    assert store.verify(snap.id, deep=False) == []
    assert not kernels.answers(k1, timeout=1)  # preemption's dump: the kernel is gone
    reap(km)
    report = cs.restore(snap)
    kernelset.adopt(report.kernel)
    assert report.everything and report.kernel.pid == k1.pid and not report.lost
    assert report.summary().startswith("restored everything")
    # the same connection file answers; every value is there, the open file too
    r = kernelset.run(report.kernel, CHECKS + "\nassert list(squares) == [0, 1, 4, 9, 16, 25]\n"
                      "handle.write(' and still writable'); handle.close()\nprint('handle ok')")
    assert r.status == "ok", r.error
    assert r.stdout.splitlines()[0] == f"big ok {1 << 30}"
    assert "handle ok" in r.stdout
    with open(tmp_path / "notes.txt") as f:
        assert f.read() == "kept open and still writable"


def test_leave_running_snapshot_then_a_corrupted_one_falls_back(criu_bin, kernelset, store):
    km, k1 = kernelset.start("k1")
    kernelset.run(k1, "import numpy as np\nv = np.full(1 << 20, 1.0)\ntag = 'first'")
    cs = CriuSnapshotter(store, leave_running=True)
    first = cs.dump(k1)
    assert kernels.answers(k1)  # "snapshot now": the kernel runs on
    kernelset.run(k1, "v[:] = 2.0\ntag = 'second'")
    cs.leave_running = False
    second = cs.dump(k1)
    reap(km)
    chunks = store.load(second.id)["chunks"]
    own = {r[0] for r in chunks} - {r[0] for r in store.load(first.id)["chunks"]}
    ref = max((r for r in chunks if r[0] in own), key=lambda r: r[1])
    path = chunkio.chunk_path(store.chunk_root, ref[0], ref[2])
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)  # a truncated chunk
    with pytest.raises(SnapshotError) as e:
        cs.restore(second)
    assert e.value.reason == "verify_failed"
    usable, skipped = store.usable("w1")
    assert usable.id == first.id and skipped[0].id == second.id
    assert skipped[0].status == "bad" and skipped[0].problem
    report = cs.restore(usable)
    kernelset.adopt(report.kernel)
    r = kernelset.run(report.kernel, "print(tag, float(v.sum()) == float(1 << 20))")
    assert r.stdout.split() == ["first", "True"]


def test_a_dump_that_cannot_be_stored_gives_the_kernel_back(criu_bin, kernelset, tmp_path):
    store = Store(str(tmp_path / "tiny"), project_quota={"lattice": 1000})
    km, k1 = kernelset.start("k1")
    kernelset.run(k1, "x = 42")
    cs = CriuSnapshotter(store)
    with pytest.raises(SnapshotError) as e:
        cs.dump(k1)
    assert "quota" in e.value.message and "runs on" in e.value.message
    r = kernelset.run(k1, "x += 1\nprint(x)")
    assert r.stdout.strip() == "43"
    assert store.list() == []


def test_through_the_privileged_launcher_command(criu_bin, kernelset, store):
    p = subprocess.run([*LAUNCHER, "criu-check"], capture_output=True, text=True, check=True)
    info = json.loads(p.stdout)
    assert info["criu"] and info["version"].startswith("4.") and info["root"] is True
    # hostile input gets a clear error naming the field, and nothing happens
    for args in (["--pid", "1", "--images-dir", "/tmp/x"],
                 ["--pid", str(os.getpid()), "--images-dir", "relative/dir"]):
        p = subprocess.run([*LAUNCHER, "criu-dump", *args], capture_output=True, text=True)
        out = json.loads(p.stdout)
        assert p.returncode == 2 and out["error"] in ("bad_input", "not_a_kernel")
        assert out["message"].split(":")[0] in ("pid", "images_dir")
    km, k1 = kernelset.start("k1")
    kernelset.run(k1, "word = 'through sudo, one day'")
    cs = CriuSnapshotter(store, privileged=Privileged(command_prefix=["env"]))
    k1.uid = os.geteuid()
    snap = cs.dump(k1)
    reap(km)
    report = cs.restore(snap)
    kernelset.adopt(report.kernel)
    r = kernelset.run(report.kernel, "print(word)")
    assert r.stdout.strip() == "through sudo, one day"


def test_criu_declines_gpu_kernels_it_cannot_capture_and_namespace_takes_over(
        criu_bin, kernelset, store, tmp_path):
    _, k1 = kernelset.start("k1")
    cs, ns = CriuSnapshotter(store), NamespaceSnapshotter(store)
    assert choose(k1, [cs, ns])[0] is cs

    def given(**kw):  # noqa: ANN003, ANN202
        return KernelRef(**{**{f: getattr(k1, f) for f in k1.__slots__}, **kw})

    mig = given(gpu_devices=("MIG-4f1c6a2e-0000-5000-8000-000000000001",))
    whole = given(gpu_devices=("GPU-4f1c6a2e-0000-5000-8000-000000000002",))
    mps = given(mps=True)
    # given a slice but never touched it: no GPU state, CRIU captures it whole
    for k in (mig, whole, mps):
        assert cs.available(k).ok
    # once the kernel has the CUDA driver mapped (a stand-in library: no GPU here), its GPU
    # state must be captured, which only cuda-checkpoint does, for whole GPUs only
    fake = tmp_path / "libcuda.so.1"
    fake.write_bytes(b"\0" * 4096)
    r = kernelset.run(k1, f"import mmap\n_f = open({str(fake)!r}, 'rb')\n"
                          "_m = mmap.mmap(_f.fileno(), 0, prot=mmap.PROT_READ)")
    assert r.status == "ok", r.error
    chosen, why = choose(mig, [cs, ns])
    assert chosen is ns and "MIG" in why[0]
    if cs.capabilities()["cuda_checkpoint"] is None:  # detected, not assumed
        chosen, why = choose(whole, [cs, ns])
        assert chosen is ns and "cuda-checkpoint is not installed" in why[0]
    assert "MPS" in cs.available(mps).reason
    dependent = given(pid=os.getpid())
    assert not cs.available(dependent).ok
