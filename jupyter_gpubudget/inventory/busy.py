"""How busy a running workload's devices are, through NVML (``nvidia-ml-py``, ``pynvml``).

One reading per workload per tick, as a fraction 0..1 of its slices' time spent computing:

- a whole GPU: ``nvmlDeviceGetUtilizationRates(...).gpu`` (percent of the driver's last
  sample period in which a kernel ran);
- a MIG instance: GPM samples of its GPU instance (``nvmlGpmMigSampleGet``, metric
  ``NVML_GPM_METRIC_GRAPHICS_UTIL`` between this tick's sample and the last one) where the GPU
  offers GPM (Hopper and later); the first tick only takes the first sample;
- an MPS share: per-process utilisation (``nvmlDeviceGetProcessUtilization``) of the
  workload's own processes, as a share of the SMs its share holds (so a process using 45 % of
  a GPU's SMs from a 50 % share is 90 % busy).

A slice NVML cannot tell about gives no reading, and a workload with any such slice gives
none at all: its time stays unmeasured (unknown), never 0. Without an NVIDIA driver the
sampler is off (:attr:`BusySampler.off` says why) and measures nothing.

:meth:`BusySampler.tick` turns readings into samples ``(workload, start, end, fraction,
source)`` for ``Ledger.record_busy``: the span runs from the workload's previous reading (or
its start) to now, at most ``max_gap`` seconds back (a longer gap stays unmeasured).

Each tick also reads the memory its GPUs use (``nvmlDeviceGetMemoryInfo``: a whole GPU's, or a
MIG instance's own through its MIG device handle; an MPS share sees its whole GPU's), kept
per workload for the sidebar (:meth:`BusySampler.memory_of`), not in the ledger. Memory is
read whether or not utilisation is: one figure does not wait for the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .nvml import NoNvidiaDriver, _import_nvml

#: pynvml's ids, for stand-ins that do not define them
GPM_GRAPHICS_UTIL = 1
GPM_METRICS_GET_VERSION = 1


@dataclass(frozen=True, slots=True)
class Running:
    """A workload running on this machine: its id, placement (the ledger's list of slices),
    when its current attempt started and its process ids (None: not known here)."""

    workload: str
    placement: list[dict]
    started_at: float
    pids: frozenset[int] | None = None


class BusySampler:
    def __init__(self, nvml: Any = None, node: str | None = None, max_gap: float = 300.0
                 ) -> None:
        """``nvml``: an NVML module object (default: ``pynvml``); ``node``: the inventory
        node whose GPUs are this machine's (None: every placement's slices are local)."""
        self._nvml = nvml
        self.node = node
        self.max_gap = max_gap
        self.off: str | None = None
        self._nv: Any = None
        self._last: dict[str, float] = {}
        self._gpm: dict[tuple[int, int], Any] = {}  # (gpu, GPU instance) -> last GPM sample
        self._proc_seen: dict[int, int] = {}  # gpu -> last per-process sample's timestamp
        self._handles: dict[int, Any] = {}
        self._mig_gi: dict[tuple[int, int], int | None] = {}
        self._mig_dev: dict[tuple[int, int], Any] = {}  # (gpu, MIG start) -> MIG handle
        #: workload -> (when, memory per local slice) of the latest tick (:meth:`memory`)
        self.memory_seen: dict[str, tuple[float, list[dict]]] = {}

    # ------------------------------------------------------------------ library
    def open(self) -> bool:
        """Initialise NVML once; False (and :attr:`off` set) without a driver."""
        if self._nv is not None:
            return True
        if self.off is not None:
            return False
        try:
            nv = self._nvml or _import_nvml()
            nv.nvmlInit()
        except NoNvidiaDriver as e:
            self.off = str(e)
            return False
        except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, driver errors
            self.off = f"no NVIDIA driver ({e})"
            return False
        self._nv = nv
        return True

    def close(self) -> None:
        if self._nv is not None:
            for s in self._gpm.values():
                try:
                    self._nv.nvmlGpmSampleFree(s)
                except Exception:  # noqa: BLE001
                    pass
            try:
                self._nv.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
        self._nv, self._gpm = None, {}

    def _handle(self, gpu: int) -> Any:
        h = self._handles.get(gpu)
        if h is None:
            h = self._handles[gpu] = self._nv.nvmlDeviceGetHandleByIndex(gpu)
        return h

    # ------------------------------------------------------------------ readings
    def _whole(self, gpu: int) -> float | None:
        try:
            return float(self._nv.nvmlDeviceGetUtilizationRates(self._handle(gpu)).gpu) / 100
        except Exception:  # noqa: BLE001 - not supported, GPU lost
            return None

    def _gi_of(self, gpu: int, mig_start: int) -> int | None:
        key = (gpu, mig_start)
        if key not in self._mig_gi:
            nv, h, found = self._nv, self._handle(gpu), None
            try:
                for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    except Exception:  # noqa: BLE001 - an empty MIG slot
                        continue
                    gi = nv.nvmlDeviceGetGpuInstanceId(mh)
                    info = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(h, gi))
                    if info.placement.start == mig_start:
                        found = gi
                        self._mig_dev[key] = mh
                        break
            except Exception:  # noqa: BLE001
                found = None
            self._mig_gi[key] = found
        return self._mig_gi[key]

    def _mig(self, gpu: int, mig_start: int) -> float | None:
        nv = self._nv
        gi = self._gi_of(gpu, mig_start)
        if gi is None:
            return None
        try:
            h = self._handle(gpu)
            sample = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmMigSampleGet(h, gi, sample)
        except Exception:  # noqa: BLE001 - no GPM on this GPU
            return None
        prev = self._gpm.get((gpu, gi))
        self._gpm[(gpu, gi)] = sample
        if prev is None:
            return None
        try:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = getattr(nv, "NVML_GPM_METRICS_GET_VERSION", GPM_METRICS_GET_VERSION)
            mg.numMetrics = 1
            mg.sample1, mg.sample2 = prev, sample
            mg.metrics[0].metricId = getattr(nv, "NVML_GPM_METRIC_GRAPHICS_UTIL",
                                             GPM_GRAPHICS_UTIL)
            nv.nvmlGpmMetricsGet(mg)
            return min(1.0, max(0.0, float(mg.metrics[0].value) / 100))
        except Exception:  # noqa: BLE001
            return None
        finally:
            try:
                nv.nvmlGpmSampleFree(prev)
            except Exception:  # noqa: BLE001
                pass

    def _mps(self, gpu: int, milli: int, pids: frozenset[int] | None,
             per_gpu: dict[int, list]) -> float | None:
        if not pids or milli <= 0:
            return None
        samples = per_gpu.get(gpu)
        if samples is None:
            try:
                samples = list(self._nv.nvmlDeviceGetProcessUtilization(
                    self._handle(gpu), self._proc_seen.get(gpu, 0)))
            except Exception:  # noqa: BLE001 - not supported; none since (NotFound)
                samples = []
            per_gpu[gpu] = samples
        mine = [s for s in samples if s.pid in pids]
        if not mine:
            return 0.0 if samples else None
        # the mean SM use of each process over its samples, summed over the processes
        by_pid: dict[int, list[float]] = {}
        for s in mine:
            by_pid.setdefault(s.pid, []).append(float(s.smUtil))
        sm = sum(sum(v) / len(v) for v in by_pid.values()) / 100
        return min(1.0, sm / (milli / 1000))

    def measure(self, placement: list[dict], pids: frozenset[int] | None = None,
                per_gpu: dict[int, list] | None = None) -> tuple[float, str] | None:
        """The fraction of the placement's slice time spent computing (weighted by each
        slice's size) and what measured it; None if any local slice cannot be measured."""
        if not self.open():
            return None
        per_gpu = {} if per_gpu is None else per_gpu
        total = busy = 0.0
        sources: set[str] = set()
        for sl in placement or []:
            if not isinstance(sl, dict) or (self.node is not None
                                            and str(sl.get("node")) != self.node):
                continue
            gpu = sl.get("gpu", -1)
            if not isinstance(gpu, int) or gpu < 0:
                continue
            milli = int(sl.get("milli", 1000))
            ms = sl.get("mig_start", -1)
            if isinstance(ms, int) and ms >= 0:
                f, src = self._mig(gpu, ms), "gpm"
            elif milli < 1000:
                f, src = self._mps(gpu, milli, pids, per_gpu), "process"
            else:
                f, src = self._whole(gpu), "device"
            if f is None:
                return None
            total += milli
            busy += milli * f
            sources.add(src)
        if total <= 0:
            return None
        return busy / total, "+".join(sorted(sources))

    def memory(self, placement: list[dict]) -> list[dict] | None:
        """Memory used and total per local slice of ``placement`` (bytes): ``gpu`` (index),
        ``mig_start`` (a MIG instance's, else None), ``shared`` (an MPS share: the figures
        are its whole GPU's); None when any local slice's memory cannot be read."""
        if not self.open():
            return None
        out = []
        for sl in placement or []:
            if not isinstance(sl, dict) or (self.node is not None
                                            and str(sl.get("node")) != self.node):
                continue
            gpu = sl.get("gpu", -1)
            if not isinstance(gpu, int) or gpu < 0:
                continue
            ms = sl.get("mig_start", -1)
            mig = isinstance(ms, int) and ms >= 0
            try:
                if mig:
                    if self._gi_of(gpu, ms) is None:
                        return None
                    h = self._mig_dev[(gpu, ms)]
                else:
                    h = self._handle(gpu)
                info = self._nv.nvmlDeviceGetMemoryInfo(h)
                used, total = int(info.used), int(info.total)
            except Exception:  # noqa: BLE001 - not supported, GPU lost
                return None
            out.append({"gpu": gpu, "mig_start": ms if mig else None,
                        "shared": not mig and int(sl.get("milli", 1000)) < 1000,
                        "used_bytes": used, "total_bytes": total})
        return out or None

    def memory_of(self, workload: str) -> tuple[float, list[dict]] | None:
        """The latest tick's memory reading of ``workload``: (when, per slice), or None."""
        return self.memory_seen.get(workload)

    def tick(self, running: Iterable[Running], now: float
             ) -> list[tuple[str, float, float, float, str]]:
        """One reading of every running workload: the samples to record."""
        running = list(running)
        if not running or not self.open():
            self._last.clear()
            self.memory_seen.clear()
            return []
        per_gpu: dict[int, list] = {}
        out = []
        seen = set()
        for r in running:
            seen.add(r.workload)
            mem = self.memory(r.placement)
            if mem is None:
                self.memory_seen.pop(r.workload, None)
            else:
                self.memory_seen[r.workload] = (now, mem)
            m = self.measure(r.placement, r.pids, per_gpu)
            since = max(self._last.get(r.workload, r.started_at), r.started_at,
                        now - self.max_gap)
            if m is None:
                self._last.pop(r.workload, None)
                continue
            self._last[r.workload] = now
            if now > since:
                out.append((r.workload, since, now, m[0], m[1]))
        for gpu, samples in per_gpu.items():  # the next read starts after these
            stamps = [int(s.timeStamp) for s in samples]
            if stamps:
                self._proc_seen[gpu] = max(stamps)
        for w in set(self._last) - seen:
            del self._last[w]
        for w in set(self.memory_seen) - seen:
            del self.memory_seen[w]
        return out


def sample_into(ledger: Any, sampler: BusySampler, running: Callable[[], Iterable[Running]],
                now: float) -> int:
    """One tick: read the running workloads, sample them, record the samples."""
    samples = sampler.tick(running(), now)
    return ledger.record_busy(samples) if samples else 0


def running_here(ledger: Any, backend: Any = None) -> list[Running]:
    """The running workloads with an open charge interval, with their processes where the
    backend can tell (``LocalBackend.pids``)."""
    opens = {c.workload: c for c in ledger.open_charges()}
    pids_of = getattr(backend, "pids", None)
    out = []
    for w in ledger.workloads(states=("running",)):
        c = opens.get(w.id)
        if c is None:
            continue
        pids = None
        if pids_of is not None:
            try:
                pids = pids_of(w.id, c.seq)
            except Exception:  # noqa: BLE001 - records unreadable: per-process unknown
                pids = None
        out.append(Running(w.id, list(w.placement or []), float(c.start), pids))
    return out
