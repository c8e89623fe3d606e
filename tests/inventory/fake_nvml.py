"""A stand-in for the ``pynvml`` module, for machines without an NVIDIA GPU.

It answers the calls ``jupyter_gpubudget.inventory.nvml`` makes from a small description of
a node. The H200 description below is written from NVIDIA's documented MIG geometry for that
model (7 compute slices, 8 memory slots), not captured from a device; ``bench/gpu_check.py``
runs the same discovery against the real library where a GPU exists.
"""

from __future__ import annotations

from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's own name
    pass


class NVMLError_NotFound(NVMLError):  # noqa: N801
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801
    value = 10


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    value = 15


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    value = 3


PROFILE_GEOMETRY = {"1g": (1, 1), "1g.35gb": (1, 2), "2g": (2, 2), "3g": (3, 4), "4g": (4, 4),
                    "7g": (7, 8)}


class FakeNvml:
    """Health fields a GPU description may carry (all optional): ``retired_pending`` (bool),
    ``remapped`` ((correctable, uncorrectable, pending, failure)), ``ecc_dbe`` (int),
    ``temperature`` / ``slowdown`` (°C), ``lost`` (True: every call on it says "GPU is lost").
    :meth:`inject_xid` queues an XID event, as the driver does."""

    NVMLError = NVMLError
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_NVLINK_MAX_LINKS = 18
    nvmlEventTypeXidCriticalError = 8
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_TEMPERATURE_GPU = 0
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1

    def __init__(self, gpus: list[dict] | None, driver: str = "580.65.06") -> None:
        self.gpus = gpus
        self.driver = driver
        self.initialised = False
        self.events: list[tuple[int, int]] = []  # (gpu index, xid) not yet delivered
        self.registered: set[int] = set()

    def inject_xid(self, gpu: int, xid: int) -> None:
        self.events.append((gpu, xid))

    # --- library ---------------------------------------------------------------
    def nvmlInit(self):
        if self.gpus is None:
            raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    # --- devices ---------------------------------------------------------------
    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def _gpu(self, h):
        g = self.gpus[h[1]]
        if g.get("lost"):
            raise NVMLError_GpuIsLost("GPU is lost")
        return g

    def nvmlDeviceGetName(self, h):
        return self._gpu(h)["name"].encode()

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=self._gpu(h)["memory_gib"] * 2**30)

    def nvmlDeviceGetUUID(self, h):
        if h[0] == "mig":
            return self._gpu(h)["mig"][h[2]]["uuid"]
        return self.gpus[h[1]]["uuid"]  # known even for a lost GPU (from the event)

    def nvmlDeviceGetMigMode(self, h):
        g = self._gpu(h)
        if "mig" not in g:
            raise NVMLError("Not Supported")
        return (1 if g["mig"] is not False else 0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        instances = self._gpu(h)["mig"] or []
        if j >= len(instances):
            raise NVMLError_NotFound("Not Found")
        return ("mig", h[1], j)

    def nvmlDeviceGetGpuInstanceId(self, mh):
        return mh[2]

    def nvmlDeviceGetGpuInstanceById(self, h, gi):
        return ("gi", h[1], gi)

    def nvmlGpuInstanceGetInfo(self, gih):
        inst = self.gpus[gih[1]]["mig"][gih[2]]
        _, size = self._geometry(inst["profile"])
        return SimpleNamespace(placement=SimpleNamespace(start=inst["start"], size=size))

    def nvmlDeviceGetAttributes(self, mh):
        inst = self._gpu(mh)["mig"][mh[2]]
        slices, _ = self._geometry(inst["profile"])
        return SimpleNamespace(gpuInstanceSliceCount=slices)

    @staticmethod
    def _geometry(profile):
        return PROFILE_GEOMETRY.get(profile) or PROFILE_GEOMETRY[profile.split(".")[0]]

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= self._gpu(h).get("nvlinks", 0):
            raise NVMLError("Not Supported")
        return 1

    # --- health (events, retired pages, row remapping, ECC, temperature) -----------------
    def nvmlEventSetCreate(self):
        return ("eventset",)

    def nvmlEventSetFree(self, es):
        pass

    def nvmlDeviceRegisterEvents(self, h, types, es):
        if types & self.nvmlEventTypeXidCriticalError:
            self.registered.add(h[1])

    def nvmlEventSetWait_v2(self, es, timeout_ms):
        while self.events:
            gpu, xid = self.events.pop(0)
            if gpu in self.registered:
                return SimpleNamespace(device=("gpu", gpu), eventType=8, eventData=xid)
        raise NVMLError_Timeout("Timeout")

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        g = self._gpu(h)
        if "retired_pending" not in g:
            raise NVMLError_NotSupported("Not Supported")
        return 1 if g["retired_pending"] else 0

    def nvmlDeviceGetRemappedRows(self, h):
        g = self._gpu(h)
        if "remapped" not in g:
            raise NVMLError_NotSupported("Not Supported")
        return tuple(g["remapped"])

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return self._gpu(h).get("ecc_dbe", 0)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._gpu(h).get("temperature", 40)

    def nvmlDeviceGetTemperatureThreshold(self, h, which):
        return self._gpu(h).get("slowdown", 90)


def hgx_h200(mig_gpus=(6, 7)) -> list[dict]:
    """Eight H200s on NVSwitch; the given ones in MIG mode with a mixed layout."""
    gpus = []
    for i in range(8):
        g = {"name": "NVIDIA H200", "memory_gib": 141, "uuid": f"GPU-fake-{i:02d}",
             "nvlinks": 18, "mig": False}
        if i in mig_gpus:
            g["mig"] = [
                {"uuid": f"MIG-fake-{i}-a", "profile": "3g.71gb", "start": 0},
                {"uuid": f"MIG-fake-{i}-b", "profile": "2g.35gb", "start": 4},
                {"uuid": f"MIG-fake-{i}-c", "profile": "1g.18gb", "start": 6},
            ]
        gpus.append(g)
    return gpus

