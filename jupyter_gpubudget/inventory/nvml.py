"""GPU discovery through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Reads what the core needs to place work: GPUs with model and memory, MIG mode and the MIG
instances that exist (UUID, profile, start slot), and which GPUs share NVLink. Without an
NVIDIA driver, :func:`load_inventory` falls back to a declared YAML inventory and says so —
never a crash. The ``nvml`` argument lets tests pass a recorded fake of the module.
"""

from __future__ import annotations

import logging
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ..core import mig as migtab
from ..core.inventory import GpuSpec, Inventory, NodeSpec
from ..core.inventory import load_inventory as load_declared

log = logging.getLogger(__name__)


class NoNvidiaDriver(RuntimeError):
    """NVML is not usable here (no library, no driver, or no GPU)."""


@dataclass(frozen=True, slots=True)
class MigInstance:
    gpu: int
    uuid: str
    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class Discovery:
    inventory: Inventory
    driver: str = ""
    mig_instances: tuple[MigInstance, ...] = ()
    gpu_uuids: dict[int, str] = field(default_factory=dict)

    def mig_uuid(self, gpu: int, profile: str, start: int) -> str | None:
        """UUID of the MIG instance a placement refers to (for CUDA_VISIBLE_DEVICES)."""
        for m in self.mig_instances:
            if m.gpu == gpu and m.profile == profile and m.start == start:
                return m.uuid
        return None


_MODELS = [  # (regex on the NVML name, memory floor in GiB, core model name)
    (r"H200", 0, "H200-141GB"),
    (r"H100", 0, "H100-80GB"),
    (r"A100.*80\s?GB|A100", 70, "A100-80GB"),
    (r"A100", 0, "A100-40GB"),
]


def model_name(nvml_name: str, memory_bytes: int) -> str:
    """Map an NVML product name to the core's model name (MIG tables key on it)."""
    gib = memory_bytes / 2**30
    for pattern, floor, model in _MODELS:
        if re.search(pattern, nvml_name) and gib >= floor:
            return model
    return re.sub(r"^NVIDIA\s+", "", nvml_name).strip().replace(" ", "-")


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _import_nvml() -> ModuleType:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as e:  # pragma: no cover - dependency of the hub extra
        raise NoNvidiaDriver("nvidia-ml-py is not installed") from e
    return pynvml


def discover(nvml: Any = None, node_name: str | None = None,
             dynamic_mig: bool = False) -> Discovery:
    """Inventory of this node from NVML; raises :class:`NoNvidiaDriver` when there is none.

    A MIG GPU's instances as they exist are its fixed layout: the only MIG slices the core
    places on (the admin, mig-parted or the GPU operator decided them). ``dynamic_mig``: the
    core may carve MIG GPUs itself instead (the privileged launcher creates the instances on
    an idle GPU)."""
    nv = nvml or _import_nvml()
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        raise NoNvidiaDriver(f"no NVIDIA driver ({e})") from e
    try:
        count = nv.nvmlDeviceGetCount()
        if count == 0:
            raise NoNvidiaDriver("the NVIDIA driver reports no GPUs")
        driver = _text(nv.nvmlSystemGetDriverVersion())
        gpus, migs, uuids, handles = [], [], {}, []
        for i in range(count):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = _text(nv.nvmlDeviceGetName(h))
            mem = nv.nvmlDeviceGetMemoryInfo(h).total
            uuid = _text(nv.nvmlDeviceGetUUID(h))
            model = model_name(name, mem)
            try:
                current, _pending = nv.nvmlDeviceGetMigMode(h)
            except nv.NVMLError:  # not supported on this GPU
                current = 0
            mig_on = bool(current) and model in migtab.MIG_TABLES
            found = _mig_instances(nv, h, i, model) if mig_on else []
            layout = (None if dynamic_mig or not mig_on else
                      tuple(sorted((m.profile, m.start) for m in found)))
            gpus.append(GpuSpec(i, model, mem // 2**20, mig_on, uuid, layout,
                                tuple((m.profile, m.start, m.uuid) for m in found)))
            uuids[i] = uuid
            migs.extend(found)
            handles.append(h)
        node = NodeSpec(node_name or socket.gethostname(), tuple(gpus), "default", 0, 0,
                        nvlink_domains(nv, handles))
        return Discovery(Inventory((node,), "nvml"), driver, tuple(migs), uuids)
    finally:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:  # pragma: no cover
            pass


def _mig_instances(nv: Any, h: Any, gpu: int, model: str) -> list[MigInstance]:
    out = []
    table = migtab.profiles_for(model)
    for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
        except nv.NVMLError:  # an empty MIG slot
            continue
        uuid = _text(nv.nvmlDeviceGetUUID(mh))
        gi = nv.nvmlDeviceGetGpuInstanceId(mh)
        info = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(h, gi))
        size = info.placement.size
        slices = nv.nvmlDeviceGetAttributes(mh).gpuInstanceSliceCount
        profile = next((p.name for p in table.values()
                        if p.size == size and p.compute == slices), None)
        if profile is None:
            log.warning("GPU %d: MIG instance %s (%d slices, %d memory slots) matches no "
                        "%s profile; ignored", gpu, uuid, slices, size, model)
            continue
        out.append(MigInstance(gpu, uuid, profile, info.placement.start))
    return out


def nvlink_domains(nv: Any, handles: list[Any]) -> tuple[tuple[int, ...], ...]:
    """The node's NVLink domains: groups of GPUs that reach each other over NVLink (all of
    them on NVSwitch, pairs on NVLink bridges), every other GPU a domain of its own. A node
    with no active link (PCIe only) is one domain per GPU, never one domain of all: a gang
    that declared ``nvlink`` must not be placed there as if it had links.

    Peers come from NVML's peer-to-peer status over NVLink; a driver that cannot say puts
    every GPU with an active link in one domain."""
    linked = [i for i, h in enumerate(handles) if _nvlink_active(nv, h)]
    group = list(range(len(handles)))

    def root(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    try:
        nvlink_cap, ok = nv.NVML_P2P_CAPS_INDEX_NVLINK, nv.NVML_P2P_STATUS_OK
        for k, a in enumerate(linked):
            for b in linked[k + 1:]:
                if nv.nvmlDeviceGetP2PStatus(handles[a], handles[b], nvlink_cap) == ok:
                    group[root(b)] = root(a)
    except (AttributeError, nv.NVMLError):  # an old driver or library: one NVLink domain
        for a in linked:
            group[a] = linked[0]
    domains: dict[int, list[int]] = {}
    for i in range(len(handles)):
        domains.setdefault(root(i), []).append(i)
    return tuple(tuple(d) for d in sorted(domains.values()))


def _nvlink_active(nv: Any, h: Any) -> bool:
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if nv.nvmlDeviceGetNvLinkState(h, link):
                return True
        except nv.NVMLError:
            return False
    return False


def load_inventory(declared: str | Path | None, nvml: Any = None,
                   prefer_declared: bool = False, dynamic_mig: bool = False
                   ) -> tuple[Inventory, str]:
    """The inventory to schedule on, and one line saying where it came from.

    NVML first (unless ``prefer_declared``); without a driver, the declared YAML file.
    """
    if not prefer_declared:
        try:
            found = discover(nvml, dynamic_mig=dynamic_mig)
            msg = (f"inventory from NVML (driver {found.driver}): "
                   f"{found.inventory.gpu_count} GPUs")
            log.info(msg)
            return found.inventory, msg
        except NoNvidiaDriver as e:
            if declared is None:
                raise
            reason = str(e)
    else:
        reason = "declared inventory requested"
    if declared is None:
        raise NoNvidiaDriver("no inventory: no NVIDIA driver and no declared inventory file")
    path = Path(declared)
    inv = load_declared(path.read_text(), str(path))
    msg = f"{reason}: using the declared inventory {path} ({inv.gpu_count} GPUs)"
    log.warning(msg)
    return inv, msg
