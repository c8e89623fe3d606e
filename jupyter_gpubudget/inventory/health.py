"""GPU health from NVML (``nvidia-ml-py``, imported as ``pynvml``): what makes a node need repair.

:class:`NvmlHealthReader` keeps NVML initialised and an event set registered for critical XID
errors, and on every :meth:`~NvmlHealthReader.read` reports per GPU:

- XID errors that arrived since the last read (``nvmlEventSetWait_v2``), except the ones that
  an application causes by itself (``ignored_xids``: 13 graphics engine exception, 31 memory
  page fault, 43 GPU stopped processing, 45 preemptive cleanup);
- retired pages pending a reset (``nvmlDeviceGetRetiredPagesPendingStatus``) and, on GPUs with
  row remapping, rows pending remapping or a remapping failure (``nvmlDeviceGetRemappedRows``);
- uncorrected (double-bit) ECC errors since the driver loaded
  (``nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)``);
- the temperature at or above the slowdown threshold (``nvmlDeviceGetTemperature``,
  ``nvmlDeviceGetTemperatureThreshold(SLOWDOWN)``);
- a GPU fallen off the bus: NVML answers "GPU is lost", or fewer GPUs than when it opened.

A check the GPU does not support is recorded as ``None`` and is no problem. Without a driver
:meth:`open` raises :class:`NoNvidiaDriver`. The ``nvml`` argument takes a stand-in module
(the tests' fake); ``bench/gpu_check.py`` reads the real fields on a GPU machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .nvml import NoNvidiaDriver, _import_nvml, _text

APPLICATION_XIDS = (13, 31, 43, 45)


@dataclass
class GpuHealth:
    index: int
    uuid: str = ""
    xids: list[int] = field(default_factory=list)  # critical XIDs since the last read
    retired_pages_pending: bool | None = None
    remapped_rows: dict[str, int] | None = None  # correctable, uncorrectable, pending, failure
    ecc_uncorrected: int | None = None  # volatile (since the driver loaded)
    temperature_c: int | None = None
    slowdown_c: int | None = None
    lost: bool = False
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "xids": self.xids,
                "retired_pages_pending": self.retired_pages_pending,
                "remapped_rows": self.remapped_rows, "ecc_uncorrected": self.ecc_uncorrected,
                "temperature_c": self.temperature_c, "slowdown_c": self.slowdown_c,
                "lost": self.lost, "problems": self.problems}


def _is(nv: Any, e: Exception, name: str, code: int) -> bool:
    cls = getattr(nv, name, None)
    return (isinstance(cls, type) and isinstance(e, cls)) or getattr(e, "value", None) == code


NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15


class NvmlHealthReader:
    def __init__(self, nvml: Any = None, ignored_xids: tuple[int, ...] = APPLICATION_XIDS,
                 temperature_margin: float = 0.0) -> None:
        self._nvml = nvml
        self.ignored_xids = frozenset(ignored_xids)
        self.temperature_margin = temperature_margin
        self.nv: Any = None
        self.count = 0
        self.uuids: dict[int, str] = {}
        self.events: Any = None

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        nv = self._nvml or _import_nvml()
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise NoNvidiaDriver(f"no NVIDIA driver ({e})") from e
        self.nv = nv
        self.count = nv.nvmlDeviceGetCount()
        try:
            self.events = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            self.events = None
        for i in range(self.count):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            self.uuids[i] = _text(nv.nvmlDeviceGetUUID(h))
            if self.events is not None:
                try:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError,
                                                self.events)
                except nv.NVMLError:  # not supported on this GPU (or MIG mode): no XIDs
                    pass

    def close(self) -> None:
        nv = self.nv
        if nv is None:
            return
        try:
            if self.events is not None:
                nv.nvmlEventSetFree(self.events)
        except nv.NVMLError:
            pass
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
        self.nv = self.events = None

    # ------------------------------------------------------------------ reading
    def _xids(self) -> dict[int, list[int]]:
        """Critical XID events waiting in the event set, by GPU index."""
        nv, out = self.nv, {}
        if self.events is None:
            return out
        by_uuid = {u: i for i, u in self.uuids.items()}
        for _ in range(1000):  # never spin forever on a flood
            try:
                ev = nv.nvmlEventSetWait_v2(self.events, 0)
            except nv.NVMLError as e:
                if _is(nv, e, "NVMLError_Timeout", NVML_ERROR_TIMEOUT):
                    break
                raise
            xid = int(getattr(ev, "eventData", 0))
            try:
                idx = by_uuid.get(_text(nv.nvmlDeviceGetUUID(ev.device)), -1)
            except nv.NVMLError:
                idx = -1
            out.setdefault(idx, []).append(xid)
        return out

    def read(self) -> list[GpuHealth]:
        """Every GPU's health now (call :meth:`open` first)."""
        nv = self.nv
        assert nv is not None, "open() first"
        xids = self._xids()
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError:
            count = 0
        out = []
        for i in range(self.count):
            g = GpuHealth(i, self.uuids.get(i, ""))
            g.xids = [x for x in xids.get(i, []) if x not in self.ignored_xids]
            if i >= count:
                g.lost = True
            else:
                try:
                    self._read_one(nv, i, g)
                except nv.NVMLError as e:
                    if not _is(nv, e, "NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST):
                        raise
                    g.lost = True
            g.problems = self._problems(g)
            out.append(g)
        for x in xids.get(-1, []):  # an event whose GPU could not be told (lost already)
            if x not in self.ignored_xids and out:
                out[0].problems.append(f"XID {x} on an unidentified GPU")
        return out

    def _read_one(self, nv: Any, i: int, g: GpuHealth) -> None:
        h = nv.nvmlDeviceGetHandleByIndex(i)

        def opt(fn: Any, *args: Any) -> Any:
            try:
                return fn(*args)
            except nv.NVMLError as e:
                if _is(nv, e, "NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST):
                    raise
                return None  # not supported here

        pending = opt(nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
        g.retired_pages_pending = None if pending is None else bool(pending)
        rows = opt(nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            g.remapped_rows = dict(zip(("correctable", "uncorrectable", "pending", "failure"),
                                       (int(x) for x in rows), strict=True))
        ecc = opt(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                  nv.NVML_VOLATILE_ECC)
        g.ecc_uncorrected = None if ecc is None else int(ecc)
        t = opt(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        g.temperature_c = None if t is None else int(t)
        slow = opt(nv.nvmlDeviceGetTemperatureThreshold, h,
                   nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        g.slowdown_c = None if slow is None or int(slow) <= 0 else int(slow)

    def _problems(self, g: GpuHealth) -> list[str]:
        p = []
        name = f"GPU {g.index}"
        if g.lost:
            p.append(f"{name} has fallen off the bus (NVML: GPU is lost)")
        if g.xids:
            p.append(f"{name}: XID error{'s' if len(g.xids) > 1 else ''} "
                     + ", ".join(str(x) for x in g.xids))
        if g.retired_pages_pending:
            p.append(f"{name}: retired memory pages pending a GPU reset")
        rr = g.remapped_rows or {}
        if rr.get("failure"):
            p.append(f"{name}: memory row remapping failed")
        elif rr.get("pending"):
            p.append(f"{name}: memory row remapping pending a GPU reset")
        if g.ecc_uncorrected:
            p.append(f"{name}: {g.ecc_uncorrected} uncorrected (double-bit) ECC "
                     f"error{'s' if g.ecc_uncorrected > 1 else ''}")
        if g.temperature_c is not None and g.slowdown_c is not None and \
                g.temperature_c >= g.slowdown_c - self.temperature_margin:
            p.append(f"{name}: {g.temperature_c} °C, at or above the slowdown threshold "
                     f"({g.slowdown_c} °C)")
        return p
