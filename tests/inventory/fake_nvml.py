"""A stand-in for the ``pynvml`` module, for machines without an NVIDIA GPU.

It answers the calls ``jupyter_gpubudget.inventory.nvml`` makes from a small description of
a node. The H200 description below is written from NVIDIA's documented MIG geometry for that
model (7 compute slices, 8 memory slots), not captured from a device; ``bench/gpu_check.py``
runs the same discovery against the real library where a GPU exists.
"""

from __future__ import annotations

import ctypes
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


#: H200 GPU instance profiles by NVML profile id: (name, compute slices, memory slots)
GI_PROFILES = {0x0: ("1g.18gb", 1, 1), 0x1: ("2g.35gb", 2, 2), 0x2: ("3g.71gb", 3, 4),
               0x3: ("4g.71gb", 4, 4), 0x4: ("7g.141gb", 7, 8), 0x7: ("1g.18gb+me", 1, 1),
               0x9: ("1g.35gb", 1, 2)}


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):  # noqa: N801 - pynvml's own name
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


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
    c_nvmlGpuInstancePlacement_t = c_nvmlGpuInstancePlacement_t

    def __init__(self, gpus: list[dict] | None, driver: str = "580.65.06") -> None:
        """MIG instances may carry ``gi`` / ``ci`` ids (default: their index, 0) and ``busy``
        (a process uses it: its destruction is refused, as NVML does)."""
        self.gpus = gpus
        for g in gpus or ():
            for j, inst in enumerate(g.get("mig") or ()):
                inst.setdefault("gi", j)
                inst.setdefault("ci", 0)
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
        """A GPU's memory, or a MIG device's own (its instance's ``memory_gib``, default the
        profile's, e.g. 71 for ``3g.71gb``); ``memory_used_gib`` (default 0) is in use."""
        g = self._gpu(h)
        d = g["mig"][h[2]] if h[0] == "mig" else g
        total = d.get("memory_gib") or float(d["profile"].split(".")[1].rstrip("gb"))
        used = d.get("memory_used_gib", 0.0)
        return SimpleNamespace(total=int(total * 2**30), used=int(used * 2**30),
                               free=int((total - used) * 2**30))

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
        if j >= len(instances) or instances[j]["ci"] is None:  # no compute instance yet
            raise NVMLError_NotFound("Not Found")
        return ("mig", h[1], j)

    def nvmlDeviceGetGpuInstanceId(self, mh):
        return self._gpu(mh)["mig"][mh[2]]["gi"]

    def nvmlDeviceGetComputeInstanceId(self, mh):
        return self._gpu(mh)["mig"][mh[2]]["ci"]

    def _instance(self, gih):
        for inst in self._gpu(gih)["mig"] or ():
            if inst["gi"] == gih[2]:
                return inst
        raise NVMLError_NotFound("Not Found")

    def nvmlDeviceGetGpuInstanceById(self, h, gi):
        self._instance(("gi", h[1], gi))
        return ("gi", h[1], gi)

    def nvmlGpuInstanceGetInfo(self, gih):
        inst = self._instance(gih)
        _, size = self._geometry(inst["profile"])
        return SimpleNamespace(id=inst["gi"],
                               placement=SimpleNamespace(start=inst["start"], size=size))

    # --- carving (the launcher's mig-create / mig-destroy) ---------------------------------
    def nvmlDeviceGetHandleByUUID(self, uuid):
        for i, g in enumerate(self.gpus):
            if g["uuid"] == uuid:
                return ("gpu", i)
        raise NVMLError_NotFound("Not Found")

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h, pid, version=2):
        if not self._gpu(h).get("mig") and self._gpu(h).get("mig") != []:
            raise NVMLError_NotSupported("Not Supported")
        if pid not in GI_PROFILES:
            raise NVMLError_NotSupported("Not Supported")
        name, slices, _ = GI_PROFILES[pid]
        return SimpleNamespace(id=pid, sliceCount=slices, name=f"MIG {name}".encode())

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h, pid, placement):
        p = placement._obj  # ctypes.byref(...)
        name, _, size = GI_PROFILES[pid]
        g = self._gpu(h)
        if g.get("mig") is False:
            raise NVMLError("Not Supported")
        if p.size != size or p.start % size:
            raise NVMLError("Invalid Argument")
        taken = set()
        for inst in g["mig"]:
            s0, sz = inst["start"], self._geometry(inst["profile"])[1]
            taken |= set(range(s0, s0 + sz))
        if taken & set(range(p.start, p.start + p.size)) or p.start + p.size > 8:
            raise NVMLError("Insufficient Resources")
        gi = max((inst["gi"] for inst in g["mig"]), default=-1) + 1
        g["mig"].append({"uuid": None, "profile": name.removesuffix("+me"), "start": p.start,
                         "gi": gi, "ci": None})
        return ("gi", h[1], gi)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gih, profile, eng, version=2):
        return SimpleNamespace(id=profile)

    def nvmlGpuInstanceCreateComputeInstance(self, gih, profile_id):
        inst = self._instance(gih)
        if inst["ci"] is not None:
            raise NVMLError("Insufficient Resources")
        inst["ci"] = 0
        inst["uuid"] = f"MIG-fake-{gih[1]}-gi{gih[2]}"
        return ("ci", gih[1], gih[2], 0)

    def nvmlComputeInstanceGetInfo(self, cih):
        return SimpleNamespace(id=cih[3])

    def nvmlGpuInstanceGetComputeInstanceById(self, gih, ci):
        if self._instance(gih)["ci"] != ci:
            raise NVMLError_NotFound("Not Found")
        return ("ci", gih[1], gih[2], ci)

    def nvmlComputeInstanceDestroy(self, cih):
        inst = self._instance(cih)
        if inst.get("busy"):
            raise NVMLError("In use by another client")
        inst["ci"] = None

    def nvmlGpuInstanceDestroy(self, gih):
        inst = self._instance(gih)
        if inst["ci"] is not None:
            raise NVMLError("In use by another client")
        self._gpu(gih)["mig"].remove(inst)

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

    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0
    NVML_P2P_STATUS_NOT_SUPPORTED = 5

    def nvmlDeviceGetP2PStatus(self, h1, h2, cap):
        """NVLink peers: every linked GPU (NVSwitch), or those sharing a ``bridge`` value."""
        assert cap == self.NVML_P2P_CAPS_INDEX_NVLINK
        a, b = self._gpu(h1), self._gpu(h2)
        if not (a.get("nvlinks") and b.get("nvlinks")) or a.get("bridge") != b.get("bridge"):
            return self.NVML_P2P_STATUS_NOT_SUPPORTED
        return self.NVML_P2P_STATUS_OK

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


    # --- utilisation (the busy sampler, ``inventory/busy.py``) -----------------------
    # A GPU may carry ``util`` (percent: its device utilisation), ``gpm`` (False: no GPM
    # on it) and ``procs`` ({pid: SM percent} of MPS clients); a MIG instance ``util``
    # (percent: its GPM graphics activity). None of them: NVML says "Not Supported".
    NVML_GPM_METRIC_GRAPHICS_UTIL = 1
    NVML_GPM_METRICS_GET_VERSION = 1

    def nvmlDeviceGetUtilizationRates(self, h):
        g = self._gpu(h)
        if h[0] != "gpu" or g.get("util") is None or g.get("mig"):
            raise NVMLError_NotSupported("Not Supported")
        return SimpleNamespace(gpu=g["util"], memory=0)

    def nvmlGpmSampleAlloc(self):
        return SimpleNamespace(gpu=None, gi=None, busy_s=None)

    def nvmlGpmSampleFree(self, sample):
        sample.gpu = None

    def nvmlGpmMigSampleGet(self, h, gi, sample):
        g = self._gpu(h)
        if g.get("gpm") is False:
            raise NVMLError_NotSupported("Not Supported")
        inst = self._instance(("gi", h[1], gi))
        if inst.get("util") is None:
            raise NVMLError_NotSupported("Not Supported")
        # a counter of busy time, as GPM's are: what the next sample differs by
        self.gpm_clock = getattr(self, "gpm_clock", 0.0) + 1.0
        inst["_busy"] = inst.get("_busy", 0.0) + inst["util"] / 100
        sample.gpu, sample.gi, sample.busy_s, sample.t = h[1], gi, inst["_busy"], self.gpm_clock
        sample.n = inst.setdefault("_n", 0) + 1
        inst["_n"] = sample.n

    class c_nvmlGpmMetricsGet_t:  # noqa: N801 - pynvml's own name
        def __init__(self):
            self.metrics = [SimpleNamespace(metricId=0, value=0.0) for _ in range(4)]

    def nvmlGpmMetricsGet(self, mg):
        a, b = mg.sample1, mg.sample2
        if a.gpu is None or b.gpu is None or (a.gpu, a.gi) != (b.gpu, b.gi):
            raise NVMLError("Invalid Argument")
        steps = max(1, b.n - a.n)
        for m in mg.metrics[:mg.numMetrics]:
            m.value = 100.0 * (b.busy_s - a.busy_s) / steps
        return mg

    def nvmlDeviceGetProcessUtilization(self, h, last_seen):
        g = self._gpu(h)
        if "procs" not in g:
            raise NVMLError_NotSupported("Not Supported")
        self.proc_clock = getattr(self, "proc_clock", 0) + 1_000_000
        return [SimpleNamespace(pid=pid, smUtil=sm, memUtil=0, encUtil=0, decUtil=0,
                                timeStamp=self.proc_clock)
                for pid, sm in g["procs"].items()]


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

