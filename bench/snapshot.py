"""Snapshot costs of a kernel holding 1 GiB (and 4 GiB) of numpy data.

For each size, in real ipykernel kernels: the CRIU backend (dump, restore), the namespace
backend (dump, restore into a fresh kernel), and ``dill.dump_session`` / ``load_session`` on
the same state, inside the kernel. The disk's sequential write speed (fsync included) is
measured in the same run, on the store's filesystem: the physical limit of any dump.

What the figures include (every dump ends with its bytes durable on disk, fsynced):
- CRIU dump: ``criu dump`` (kernel stopped) plus storing its images as chunks; restore:
  chunks back into images, ``criu restore``, until the kernel answers on its ports.
- namespace dump: everything inside the kernel (pickling with out-of-band buffers, hashing,
  compressing, writing, fsync); restore: reading and checking the chunks, unpickling,
  re-imports, in a kernel already started.
- dill: ``dill.dump_session`` to a file, then fsync; ``dill.load_session`` in a fresh kernel.
The verification a commit does (reading every chunk back) is reported on its own line.

Data: ``--data random`` (default: float64 noise, which no codec shrinks: the worst case for
every method) or ``--data structured`` (integers stored as float64 with some noise; zstd
shrinks it ~4x). The last line is JSON with the issue's keys, for the first size.
Run on a quiet machine; the figures vary with the other load (shared machines).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpubudget.snapshot import kernels  # noqa: E402
from jupyter_gpubudget.snapshot.criu import find_criu  # noqa: E402
from jupyter_gpubudget.snapshot.criusnap import CriuSnapshotter  # noqa: E402
from jupyter_gpubudget.snapshot.namespace import NamespaceSnapshotter  # noqa: E402
from jupyter_gpubudget.snapshot.store import Store  # noqa: E402

GIB = 1 << 30


def disk_write_mb_s(directory: str, nbytes: int) -> float:
    block = os.urandom(16 << 20)
    path = os.path.join(directory, "disk-probe.bin")
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for _ in range(nbytes // len(block)):
            f.write(block)
        os.fsync(f.fileno())
    dt = time.perf_counter() - t0
    os.unlink(path)
    return nbytes / dt / 1e6


def run(ref, code: str, timeout: float = 900) -> str:  # noqa: ANN001
    kc = kernels.client(ref)
    try:
        r = kernels.execute(kc, code, timeout=timeout)
    finally:
        kc.stop_channels()
    if r.status != "ok":
        raise RuntimeError(r.error)
    return r.stdout


def fill(ref, gib: int, data: str) -> float:  # noqa: ANN001
    n = gib * GIB // 8
    if data == "random":
        code = f"import numpy as np\nbig = np.random.default_rng(1).random({n})"
    else:
        code = (f"import numpy as np\nbig = (np.arange({n}) % 100003).astype(np.float64)\n"
                "big[::4097] = np.random.default_rng(1).random(big[::4097].shape[0])")
    run(ref, code + "\nbig_sum = float(big.sum())\nprint(big_sum)")
    return float(run(ref, "print(big_sum)"))


def check(ref, expect: float) -> None:  # noqa: ANN001
    got = float(run(ref, "print(float(big.sum()))"))
    if got != expect:
        raise RuntimeError(f"restored array differs: sum {got} != {expect}")


def one_size(gib: int, work: Path, data: str, disk: float, criu_ok: bool) -> dict:
    out: dict = {}
    store = Store(str(work / f"store-{gib}g"), keep_last=1)
    k = 0

    def fresh():  # noqa: ANN202
        nonlocal k
        k += 1
        return kernels.start_kernel(str(work / f"k{gib}-{k}"), session=f"bench{gib}g",
                                    project="bench")

    # ---- CRIU
    if criu_ok:
        km, ref = fresh()
        expect = fill(ref, gib, data)
        cs = CriuSnapshotter(store)
        t0 = time.perf_counter()
        snap = cs.dump(ref)
        dump_s = time.perf_counter() - t0 - snap.seconds.get("verify", 0.0)
        km.provisioner.process.wait(30)
        t0 = time.perf_counter()
        rep = cs.restore(snap)
        restore_s = time.perf_counter() - t0
        check(rep.kernel, expect)
        kernels.stop_kernel(rep.kernel)
        out.update(criu_dump_s=dump_s, criu_restore_s=restore_s,
                   criu_dump_only_s=snap.seconds["criu_dump"], criu_store_s=snap.seconds["store"],
                   criu_verify_s=snap.seconds["verify"], criu_images_bytes=snap.raw_bytes,
                   criu_restore_only_s=rep.seconds["criu_restore"],
                   criu_materialise_s=rep.seconds["images"])
        print(f"{gib} GiB  CRIU       dump {dump_s:6.2f} s (criu {snap.seconds['criu_dump']:.2f}"
              f" + store {snap.seconds['store']:.2f}; verify after: "
              f"{snap.seconds['verify']:.2f})  restore {restore_s:6.2f} s (images "
              f"{rep.seconds['images']:.2f} + criu {rep.seconds['criu_restore']:.2f} + answer "
              f"{rep.seconds['answer']:.2f})  stored {snap.stored_bytes / 1e6:.0f} MB",
              flush=True)
        shutil.rmtree(store.root)
        store = Store(str(work / f"store-{gib}g"), keep_last=1)
    # ---- namespace
    km, ref = fresh()
    expect = fill(ref, gib, data)
    ns = NamespaceSnapshotter(store)
    snap = ns.dump(ref)
    dump_s = snap.seconds["kernel_total"]
    _, ref2 = fresh()
    t0 = time.perf_counter()
    rep = ns.restore(snap, ref2)
    restore_s = time.perf_counter() - t0
    check(ref2, expect)
    kernels.stop_kernel(ref2)
    raw = snap.raw_bytes
    out.update(ns_dump_s=dump_s, ns_restore_s=restore_s, ns_verify_s=snap.seconds["verify"],
               ns_bytes=raw, ns_stored=snap.stored_bytes,
               ns_roundtrip_s=snap.seconds["kernel"])
    print(f"{gib} GiB  namespace  dump {dump_s:6.2f} s (pickle {snap.seconds['kernel_pickle']:.2f};"
          f" verify after: {snap.seconds['verify']:.2f})  restore {restore_s:6.2f} s  stored "
          f"{snap.stored_bytes / 1e6:.0f} of {raw / 1e6:.0f} MB  "
          f"disk time for these bytes {raw / 1e6 / disk:.2f} s", flush=True)
    shutil.rmtree(store.root)
    # ---- dill, same state, same kernel
    path = str(work / f"dill-{gib}g.pkl")
    t = run(ref, f"""
import dill, os, time
_t0 = time.perf_counter()
dill.dump_session({path!r})
_t1 = time.perf_counter()
_fd = os.open({path!r}, os.O_RDONLY); os.fsync(_fd); os.close(_fd)
print(_t1 - _t0, time.perf_counter() - _t0)
""")
    dill_nosync, dill_dump = map(float, t.split())
    kernels.stop_kernel(ref, km)
    _, ref3 = fresh()
    t = run(ref3, f"import dill, time\n_t0 = time.perf_counter()\ndill.load_session({path!r})\n"
                  "print(time.perf_counter() - _t0)")
    dill_load = float(t)
    check(ref3, expect)
    kernels.stop_kernel(ref3)
    os.unlink(path)
    out.update(dill_dump_s=dill_dump, dill_dump_nosync_s=dill_nosync, dill_load_s=dill_load)
    print(f"{gib} GiB  dill       dump {dill_dump:6.2f} s (before fsync {dill_nosync:.2f})  "
          f"load {dill_load:6.2f} s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,4", help="GiB per kernel, comma separated")
    ap.add_argument("--data", choices=("random", "structured"), default="random")
    ap.add_argument("--dir", default=None, help="where the stores go (default: a new "
                    "temporary directory)")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",") if x]
    work = Path(tempfile.mkdtemp(prefix="gpubudget-bench-", dir=a.dir))
    criu_ok = os.geteuid() == 0 and find_criu() is not None
    if not criu_ok:
        print("CRIU: not measured (needs root and CRIU >= 4.1: make criu)")
    try:
        disk = disk_write_mb_s(str(work), GIB)
        print(f"disk: sequential write {disk:.0f} MB/s (1 GiB, fsync) in {work}", flush=True)
        results = {}
        for gib in sizes:
            with open("/proc/meminfo") as f:
                avail = int(next(ln for ln in f if ln.startswith("MemAvailable")).split()[1]) << 10
            if avail < 3.5 * gib * GIB:
                print(f"{gib} GiB  skipped: {avail / GIB:.1f} GiB of memory available, "
                      f"{3.5 * gib:.1f} needed")
                continue
            try:
                results[gib] = one_size(gib, work, a.data, disk, criu_ok)
            except Exception as e:  # noqa: BLE001 - report it, measure the other sizes
                print(f"{gib} GiB  FAILED: {type(e).__name__}: {str(e).splitlines()[0]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if sizes[0] not in results:
        sys.exit(f"the {sizes[0]} GiB case failed: no figures")
    first = results[sizes[0]]
    disk_time = first["ns_bytes"] / 1e6 / disk
    for gib, r in results.items():
        print(f"{gib} GiB  namespace vs dill: {r['dill_dump_s'] / r['ns_dump_s']:.2f}x faster "
              f"dump, {r['dill_load_s'] / r['ns_restore_s']:.2f}x faster restore; namespace dump "
              f"= {r['ns_dump_s'] / (r['ns_bytes'] / 1e6 / disk):.2f}x the disk's write time")
    print(json.dumps({
        "criu_dump_1g_s": round(first.get("criu_dump_s", float("nan")), 3),
        "criu_restore_1g_s": round(first.get("criu_restore_s", float("nan")), 3),
        "ns_dump_1g_s": round(first["ns_dump_s"], 3),
        "ns_restore_1g_s": round(first["ns_restore_s"], 3),
        "dill_dump_1g_s": round(first["dill_dump_s"], 3),
        "ns_vs_dill_speedup": round(first["dill_dump_s"] / first["ns_dump_s"], 2),
        "disk_write_mb_s": round(disk, 1),
        "ns_dump_vs_disk": round(first["ns_dump_s"] / disk_time, 2),
    }))


if __name__ == "__main__":
    main()
