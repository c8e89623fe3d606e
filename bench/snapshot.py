"""Snapshot costs of a kernel holding 1 GiB (and 4 GiB) of numpy data, end to end.

For each size and data kind, in real ipykernel kernels:

- **CRIU** (root, ``make criu``): dump = ``criu dump`` (kernel stopped) + storing the images as
  chunks (hashed, compressed where it pays, each chunk fdatasynced) + the commit that verifies
  and publishes the manifest; restore = chunks back into images (checked), ``criu restore``,
  until the kernel answers on its ports.
- **namespace**: dump = everything from the request to the committed manifest (pickling with
  out-of-band buffers in the kernel, hashing, compressing, writing, fdatasync, commit);
  restore = reading and checking the chunks, unpickling, re-imports, in a fresh kernel.
- **dill** on the same state (the same data, made the same way in its own kernel):
  ``dill.dump_session`` to a file then ``fsync``; ``dill.load_session`` in a fresh kernel.
- The disk's sequential write speed (1 GiB of incompressible data, fsync) is measured just
  before each size, on the store's filesystem, through the page cache and with O_DIRECT; the
  faster of the two is the physical limit of writing these bytes (``disk_write_mb_s``).

The comparison is fair: every dump ends with its bytes durable (fsync) and is measured from
outside the work it does. ``--no-fsync`` measures both without it (then page-cache speed).

Data (``--data``): ``random`` (float64 noise: no codec shrinks it, every byte goes to disk —
the worst case for every method) and ``structured`` (integers stored as float64 with a little
noise, like most arrays of counts or ids: zstd shrinks it ~9x). Each figure names its kind.

``--job``: a batch job's transparent checkpoint instead (root, CRIU): a job of a test account
holding 1 GiB resident (``--job-gib``) of noise and counting, run by the local backend through
the real launcher in its cgroup; ``job_dump_s`` is the backend's ``stop`` of it (the launcher's
CRIU dump, the images into the snapshot store, the tree ended), ``job_restore_s`` its next
attempt's ``launch`` on a second backend (another jobs root: another node) until the restored
job prints its next number. The last line is JSON with those two and their parts: the dump's
CRIU step (``job_criu_dump_s``) and storing the images (``job_store_s``: hashed, written,
committed); the restore's images written from the store's
chunks into CRIU's private directory (``job_restore_images_s``, every chunk checked) and CRIU's
restore (``job_restore_criu_s``), as the launcher's log of the restored attempt says.

The last line is JSON with the headline keys for the first data kind and size, plus the same
for every kind and size under ``by_data``, the load average at start and end, and the disk
speeds measured. The machine is shared: the figures vary with its load (printed).
"""

from __future__ import annotations

import argparse
import json
import mmap
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


def load() -> str:
    a, b, c = os.getloadavg()
    return f"{a:.1f} {b:.1f} {c:.1f}"


def disk_write_mb_s(directory: str, nbytes: int, direct: bool = False) -> float | None:
    """Sequential write of ``nbytes`` of noise, then fsync: through the page cache, or with
    O_DIRECT from page-aligned memory (None where the filesystem refuses O_DIRECT)."""
    block = mmap.mmap(-1, 16 << 20)  # page-aligned, as O_DIRECT needs
    block[:] = os.urandom(len(block))
    path = os.path.join(directory, "disk-probe.bin")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:
        return None
    t0 = time.perf_counter()
    try:
        for _ in range(nbytes // len(block)):
            os.write(fd, block)
        os.fsync(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
        os.unlink(path)
    return nbytes / (time.perf_counter() - t0) / 1e6


def run(ref, code: str, timeout: float = 1800) -> str:  # noqa: ANN001
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
    return float(run(ref, code + "\nbig_sum = float(big.sum())\nprint(big_sum)"))


def check(ref, expect: float) -> None:  # noqa: ANN001
    got = float(run(ref, "print(float(big.sum()))"))
    if got != expect:
        raise RuntimeError(f"restored array differs: sum {got} != {expect}")


class Case:
    def __init__(self, work: Path, gib: int, data: str, fsync: bool) -> None:
        self.work, self.gib, self.data, self.fsync = work, gib, data, fsync
        self.k = 0
        self.live: list = []

    def fresh(self):  # noqa: ANN201
        self.k += 1
        km, ref = kernels.start_kernel(str(self.work / f"k{self.gib}{self.data}-{self.k}"),
                                       session=f"bench{self.gib}g", project="bench")
        self.live.append((ref, km))
        return km, ref

    def stop(self, ref, km=None) -> None:  # noqa: ANN001
        kernels.stop_kernel(ref, km)

    def store(self, name: str) -> Store:
        return Store(str(self.work / f"store-{name}"), keep_last=0, fsync=self.fsync)

    def close(self) -> None:
        for ref, km in self.live:
            kernels.stop_kernel(ref, km)
        self.live = []


def one(case: Case, criu_ok: bool, disk: float) -> dict:
    out: dict = {"disk_mb_s": disk}
    gib, tag = case.gib, f"{case.gib} GiB {case.data:<10}"
    # ---- CRIU
    if criu_ok:
        store = case.store("criu")
        km, ref = case.fresh()
        expect = fill(ref, gib, case.data)
        cs = CriuSnapshotter(store)
        t0 = time.perf_counter()
        snap = cs.dump(ref)
        dump_s = time.perf_counter() - t0
        km.provisioner.process.wait(30)  # its parent reaps it: the pid is free to restore
        t1 = time.perf_counter()
        full = store.verify(snap.id, deep=True)
        full_s = time.perf_counter() - t1
        assert not full, full
        t0 = time.perf_counter()
        rep = cs.restore(snap)
        restore_s = time.perf_counter() - t0
        check(rep.kernel, expect)
        case.stop(rep.kernel)
        out.update(criu_dump_s=dump_s, criu_restore_s=restore_s,
                   criu_dump_only_s=snap.seconds["criu_dump"], criu_store_s=snap.seconds["store"],
                   criu_verify_s=snap.seconds["verify"], criu_full_verify_s=full_s,
                   criu_images_bytes=snap.raw_bytes, criu_stored_bytes=snap.stored_bytes,
                   criu_restore_only_s=rep.seconds["criu_restore"],
                   criu_materialise_s=rep.seconds["images"])
        print(f"{tag} CRIU       dump {dump_s:6.2f} s (criu {snap.seconds['criu_dump']:.2f} + "
              f"store {snap.seconds['store']:.2f} + commit {snap.seconds['verify']:.2f}; a full "
              f"read-back check would add {full_s:.2f})  restore {restore_s:6.2f} s (images "
              f"{rep.seconds['images']:.2f} + criu {rep.seconds['criu_restore']:.2f} + answer "
              f"{rep.seconds['answer']:.2f})  {snap.raw_bytes / 1e6:.0f} MB of images, "
              f"{snap.stored_bytes / 1e6:.0f} MB stored", flush=True)
        shutil.rmtree(store.root)
    # ---- namespace: dump in one kernel, restore into a fresh one (the first one is gone
    # by then, as after a preemption: one copy of the state in memory at a time)
    store = case.store("ns")
    km, ref = case.fresh()
    expect = fill(ref, gib, case.data)
    ns = NamespaceSnapshotter(store)
    t0 = time.perf_counter()
    snap = ns.dump(ref)
    dump_s = time.perf_counter() - t0
    # a second snapshot of the unchanged state (as "snapshot now" then a preemption): its
    # chunks are already stored, so only hashing remains
    t0 = time.perf_counter()
    again = ns.dump(ref)
    again_s = time.perf_counter() - t0
    out.update(ns_again_s=again_s, ns_again_written=again.written_bytes)
    store.delete(again.id, "bench")
    case.stop(ref, km)
    _, ref2 = case.fresh()
    t0 = time.perf_counter()
    rep = ns.restore(snap, ref2)
    restore_s = time.perf_counter() - t0
    check(ref2, expect)
    case.stop(ref2)
    raw = snap.raw_bytes
    disk_s = raw / 1e6 / disk
    out.update(ns_dump_s=dump_s, ns_restore_s=restore_s, ns_verify_s=snap.seconds["verify"],
               ns_bytes=raw, ns_stored=snap.stored_bytes, ns_disk_time_s=disk_s)
    print(f"{tag} namespace  dump {dump_s:6.2f} s (in the kernel "
          f"{snap.seconds['kernel_total']:.2f}; commit {snap.seconds['verify']:.2f})  restore "
          f"{restore_s:6.2f} s  {raw / 1e6:.0f} MB, {snap.stored_bytes / 1e6:.0f} MB stored; "
          f"the disk writes {raw / 1e6:.0f} MB in {disk_s:.2f} s; a second snapshot of the "
          f"same state {again_s:.2f} s ({out['ns_again_written'] / 1e6:.0f} MB written)",
          flush=True)
    shutil.rmtree(store.root)
    # ---- dill, the same state in its own kernel
    path = str(case.work / f"dill-{gib}g.pkl")
    km, ref = case.fresh()
    expect = fill(ref, gib, case.data)
    sync = (f"_fd = os.open({path!r}, os.O_RDONLY); os.fsync(_fd); os.close(_fd)"
            if case.fsync else "")
    t = run(ref, f"""
import dill, os, time
_t0 = time.perf_counter()
dill.dump_session({path!r})
_t1 = time.perf_counter()
{sync}
print(_t1 - _t0, time.perf_counter() - _t0)
""")
    dill_nosync, dill_dump = map(float, t.split())
    case.stop(ref, km)
    _, ref3 = case.fresh()
    t = run(ref3, f"import dill, time\n_t0 = time.perf_counter()\ndill.load_session({path!r})\n"
                  "print(time.perf_counter() - _t0)")
    dill_load = float(t)
    check(ref3, expect)
    case.stop(ref3)
    dill_bytes = os.path.getsize(path)
    os.unlink(path)
    out.update(dill_dump_s=dill_dump, dill_dump_nosync_s=dill_nosync, dill_load_s=dill_load,
               dill_bytes=dill_bytes)
    print(f"{tag} dill       dump {dill_dump:6.2f} s (pickled in {dill_nosync:.2f}, then "
          f"fsync)  load {dill_load:6.2f} s  {dill_bytes / 1e6:.0f} MB written", flush=True)
    print(f"{tag} namespace vs dill: {dill_dump / dump_s:.2f}x faster dump "
          f"({dill_dump / again_s:.2f}x for a second snapshot of the same state), "
          f"{dill_load / restore_s:.2f}x faster restore; namespace dump = "
          f"{dump_s / disk_s:.2f}x the disk's time for the same bytes; load {load()}",
          flush=True)
    return out


JOB_CODE = ("import os, sys, time\n"
            "data = bytearray(os.urandom({nbytes}))\n"
            "i = 0\n"
            "while True:\n"
            "    print(i, flush=True)\n"
            "    i += 1\n"
            "    time.sleep(0.01)\n")


def job_bench(gib: float, where: str | None) -> dict:
    """A batch job's checkpoint and restore through the local backend (see the docstring)."""
    import re

    from jupyter_gpubudget.backends.base import Launch
    from jupyter_gpubudget.backends.local import LocalBackend
    from jupyter_gpubudget.hub import demo_setup

    account = "gbt-bench"
    demo_setup.ensure_user(account)
    work = Path(tempfile.mkdtemp(prefix="gpubudget-bench-job-", dir=where))
    work.chmod(0o755)
    nbytes = int(gib * GIB)
    code = JOB_CODE.format(nbytes=nbytes)

    def node(name: str) -> LocalBackend:
        return LocalBackend(state_dir=str(work / name), checkpoint_store=str(work / "store"),
                            unix_users={"bench": account}, stop_grace=2)

    def numbers(path: Path) -> list[int]:
        try:
            return [int(x) for x in re.findall(r"^(\d+)$", path.read_text(), re.M)]
        except OSError:
            return []

    def wait(cond, timeout: float = 120.0) -> None:  # noqa: ANN001
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise RuntimeError("the job did not get there in time")
            time.sleep(0.005)

    a, b = node("a"), node("b")
    wid = f"bench{os.getpid():x}"
    try:
        a.launch(Launch(wid, 1, "bench", "bench", ["/usr/bin/python3", "-c", code], [],
                        resumable=True))
        log1 = work / "a" / wid / "1" / "output.log"
        wait(lambda: len(numbers(log1)) > 10)
        pid = json.loads((work / "a" / wid / "1" / "pid").read_text())["pid"]
        with open(f"/proc/{pid}/status") as f:
            resident = next(int(ln.split()[1]) << 10 for ln in f if ln.startswith("VmRSS"))
        t0 = time.perf_counter()
        st = a.stop(wid, 1)
        dump_s = time.perf_counter() - t0
        ex = json.loads((work / "a" / wid / "1" / "exit").read_text())
        if not ex.get("checkpointed"):
            why = (work / "a" / wid / "1" / "launcher.log").read_text()[-500:]
            raise RuntimeError(f"not checkpointed: {why}")
        snaps = a._checkpoints.store.list(session=f"job-{wid}")
        stored = a._checkpoints.store.get(snaps[0].id)
        criu_s = a._checkpoints.store.load(snaps[0].id)["payload"].get("dump_seconds")
        store_s = stored.seconds.get("store", float("nan"))
        last = numbers(log1)[-1]
        log2 = work / "b" / wid / "2" / "output.log"
        t0 = time.perf_counter()
        b.launch(Launch(wid, 2, "bench", "bench", ["/usr/bin/python3", "-c", code], [],
                        resumable=True))
        launch_s = time.perf_counter() - t0
        wait(lambda: len(numbers(log2)) > 0)
        restore_s = time.perf_counter() - t0
        first = numbers(log2)[0]
        parts = re.search(r"images written in ([\d.]+) s, CRIU restored them in ([\d.]+) s",
                          (work / "b" / wid / "2" / "launcher.log").read_text())
        images_s, restore_criu_s = (float(parts[1]), float(parts[2])) if parts else \
            (float("nan"), float("nan"))

        return {"job_dump_s": round(dump_s, 3), "job_restore_s": round(restore_s, 3),
                "job_criu_dump_s": round(criu_s or float("nan"), 3),
                "job_store_s": round(store_s, 3),
                "job_restore_images_s": round(images_s, 3),
                "job_restore_criu_s": round(restore_criu_s, 3),
                "job_launch_call_s": round(launch_s, 3),
                "job_resident_gib": round(resident / GIB, 3),
                "job_images_gib": round(stored.raw_bytes / GIB, 3),
                "job_stored_gib": round(stored.stored_bytes / GIB, 3),
                "job_resumed_at": first, "job_stopped_at": last,
                "job_resumed_where_stopped": first == last + 1, "ended_at_known":
                st.ended_at is not None}
    finally:
        for node_, attempt in ((a, 1), (b, 2)):  # ended plainly: not checkpointed again
            try:
                node_._launcher("signal", wid, str(attempt), "1")
            except Exception:  # noqa: BLE001, S110 - not started or ended already
                pass
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", action="store_true", help="a batch job's transparent checkpoint "
                    "and restore (root, CRIU) instead of the kernels")
    ap.add_argument("--job-gib", type=float, default=1.0, help="GiB the --job job holds")
    ap.add_argument("--sizes", default="1,4", help="GiB per kernel, comma separated")
    ap.add_argument("--data", default="random,structured",
                    help="data kinds, comma separated: random, structured")
    ap.add_argument("--no-fsync", action="store_true",
                    help="no fsync anywhere (snapshots and dill): page-cache speed")
    ap.add_argument("--no-criu", action="store_true", help="leave CRIU out")
    ap.add_argument("--dir", default=None, help="where the stores go (default: a new "
                    "temporary directory)")
    a = ap.parse_args()
    if a.job:
        if os.geteuid() != 0 or find_criu() is None:
            sys.exit("--job needs root and CRIU >= 4.1 (make criu)")
        start_load = load()
        print(f"load average {start_load} on {os.cpu_count()} CPUs", flush=True)
        out = job_bench(a.job_gib, a.dir)
        print(f"batch job of {out['job_resident_gib']} GiB resident: dump (stop) "
              f"{out['job_dump_s']:.2f} s (CRIU {out['job_criu_dump_s']:.2f} s + store "
              f"{out['job_store_s']:.2f} s; goal <= 3 s), restore (launch until it counts) "
              f"{out['job_restore_s']:.2f} s (images {out['job_restore_images_s']:.2f} s + "
              f"CRIU {out['job_restore_criu_s']:.2f} s; goal <= 2.5 s); stopped at "
              f"{out['job_stopped_at']}, resumed at {out['job_resumed_at']}; load {load()}")
        print(json.dumps({**out, "load_start": start_load, "load_end": load()}))
        return
    sizes = [int(x) for x in a.sizes.split(",") if x]
    kinds = [x for x in a.data.split(",") if x]
    bad = [k for k in kinds if k not in ("random", "structured")]
    if bad:
        sys.exit(f"--data: unknown kind {bad[0]!r} (random, structured)")
    work = Path(tempfile.mkdtemp(prefix="gpubudget-bench-", dir=a.dir))
    criu_ok = not a.no_criu and os.geteuid() == 0 and find_criu() is not None
    if not criu_ok and not a.no_criu:
        print("CRIU: not measured (needs root and CRIU >= 4.1: make criu)")
    start_load = load()
    print(f"load average {start_load} on {os.cpu_count()} CPUs; fsync "
          f"{'off' if a.no_fsync else 'on'}; stores in {work}", flush=True)
    results: dict[str, dict] = {}
    disks: list[float] = []
    try:
        for gib in sizes:
            for kind in kinds:
                with open("/proc/meminfo") as f:
                    avail = int(next(ln for ln in f if ln.startswith("MemAvailable"))
                                .split()[1]) << 10
                if avail < 2.6 * gib * GIB:
                    print(f"{gib} GiB {kind}: skipped: {avail / GIB:.1f} GiB of memory "
                          f"available, {2.6 * gib:.1f} needed")
                    continue
                # the physical limit: the faster of a page-cache write and an O_DIRECT one
                # (the namespace backend writes large buffers O_DIRECT; a shared machine's
                # dirty-page throttling can slow buffered writers far below the device)
                buffered = disk_write_mb_s(str(work), GIB)
                direct = disk_write_mb_s(str(work), GIB, direct=True)
                disk = max(buffered, direct or 0.0)
                disks.append(disk)
                print(f"disk: sequential write {disk:.0f} MB/s (1 GiB, fsync; buffered "
                      f"{buffered:.0f}, O_DIRECT "
                      f"{'refused' if direct is None else f'{direct:.0f}'}); load {load()}",
                      flush=True)
                case = Case(work, gib, kind, fsync=not a.no_fsync)
                try:
                    results[f"{kind}_{gib}g"] = one(case, criu_ok, disk)
                except Exception as e:  # noqa: BLE001 - report it, measure the others
                    print(f"{gib} GiB {kind}: FAILED: {type(e).__name__}: "
                          f"{str(e).splitlines()[0]}", flush=True)
                finally:
                    case.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    key = f"{kinds[0]}_{sizes[0]}g"
    if key not in results:
        sys.exit(f"the {sizes[0]} GiB {kinds[0]} case failed: no figures")

    def keys(r: dict, tag: str = "_1g") -> dict:
        nan = float("nan")
        return {
            f"criu_dump{tag}_s": round(r.get("criu_dump_s", nan), 3),
            f"criu_restore{tag}_s": round(r.get("criu_restore_s", nan), 3),
            f"ns_dump{tag}_s": round(r["ns_dump_s"], 3),
            f"ns_restore{tag}_s": round(r["ns_restore_s"], 3),
            f"dill_dump{tag}_s": round(r["dill_dump_s"], 3),
            "ns_vs_dill_speedup": round(r["dill_dump_s"] / r["ns_dump_s"], 2),
            "disk_write_mb_s": round(r["disk_mb_s"], 1),
            "ns_dump_vs_disk": round(r["ns_dump_s"] / r["ns_disk_time_s"], 2),
            "ns_again_vs_dill_speedup": round(r["dill_dump_s"] / r["ns_again_s"], 2),
        }

    print(json.dumps({**keys(results[key]), "data": kinds[0], "gib": sizes[0],
                      "fsync": not a.no_fsync, "load_start": start_load, "load_end": load(),
                      "disk_mb_s_all": [round(d) for d in disks],
                      "by_data": {k: keys(r, "") for k, r in results.items()}}))


if __name__ == "__main__":
    main()
