"""A granted placement -> the devices a process may use: the one builder behind every
``CUDA_VISIBLE_DEVICES`` the project sets (the hub spawner's sessions, the local backend's
jobs; Kubernetes and Slurm take the MPS variables only, their device plugin / gres pick the
devices).

Device ids:

- an inventory discovered through NVML knows its GPUs' and MIG instances' UUIDs: a whole GPU
  or an MPS share is ``GPU-<uuid>``, a MIG slice is the instance's ``MIG-<uuid>``. A slice the
  inventory does not know (a GPU that is not there, a MIG instance that does not exist) is a
  :class:`DeviceError`, never a made-up id;
- a declared inventory (YAML: demo, tests, a machine without a driver) has no CUDA ids:
  stable derived ids stand in, ``GPU-<node>-<gpu>`` and ``MIG-<node>-<gpu>-<profile>-<start>``
  (CUDA sees no device through them). :attr:`DeviceEnv.declared` says so, and callers log
  :data:`DECLARED_NOTE` once.

An MPS share adds ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (its fraction of the GPU's SMs),
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` when a memory limit was asked for (per visible device
index) and, when the caller runs the GPU's MPS control daemon, ``CUDA_MPS_PIPE_DIRECTORY``
(that daemon's pipe directory, see ``launcher/mps.py``).

With ``dynamic_mig`` a MIG GPU of an NVML inventory has no fixed layout: the core may place a
MIG slice where no instance exists yet. :func:`to_carve` lists those slices (GPU UUID, profile,
start, memory slots) so the backend has the launcher create them first
(``launcher/mig.py``) and passes the new ``MIG-<uuid>`` ids back in (:func:`with_migs`).

Pure: no I/O; what the inventory and the daemons say is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from jupyter_gpubudget.core import mig as migtab
from jupyter_gpubudget.core.inventory import Inventory

#: what callers log (once) when device ids are derived stand-ins
DECLARED_NOTE = ("declared inventory: device ids are not CUDA ids (derived GPU-<node>-<gpu> / "
                 "MIG-<node>-<gpu>-<profile>-<start>; no process sees a GPU through them)")


class DeviceError(ValueError):
    """The placement names a device the inventory does not have."""


@dataclass(frozen=True)
class DeviceMap:
    """Where device ids come from: (node, gpu) -> GPU id, (node, gpu, profile, start) -> MIG
    id; ``real``: the ids are CUDA's (NVML), so a slice missing here is an error."""

    gpus: Mapping[tuple[str, int], str] = field(default_factory=dict)
    migs: Mapping[tuple[str, int, str, int], str] = field(default_factory=dict)
    real: bool = False
    #: (node, gpu) -> (GPU UUID, model) of MIG GPUs carved freely (dynamic_mig, NVML)
    carvable: Mapping[tuple[str, int], tuple[str, str]] = field(default_factory=dict)


def device_map(inventory: Inventory | None,
               overrides: Mapping[tuple[str, int], str] | None = None) -> DeviceMap:
    """The ids of an inventory's devices. ``overrides`` (node, gpu) -> GPU UUID: an admin's
    mapping for a declared inventory on a machine that has the GPUs (``LocalBackend.gpu_uuids``);
    those GPUs' whole-GPU and MPS slices get the given id."""
    gpus: dict[tuple[str, int], str] = {}
    migs: dict[tuple[str, int, str, int], str] = {}
    carvable: dict[tuple[str, int], tuple[str, str]] = {}
    real = inventory is not None and inventory.source == "nvml"
    for node in inventory.nodes if inventory is not None else ():
        for g in node.gpus:
            if real and g.uuid:
                gpus[(node.name, g.index)] = g.uuid
                if g.mig and g.mig_layout is None:
                    carvable[(node.name, g.index)] = (g.uuid, g.model)
            for profile, start, uuid in g.mig_uuids:
                migs[(node.name, g.index, profile, start)] = uuid
    gpus.update(overrides or {})
    return DeviceMap(gpus, migs, real, carvable)


@dataclass(frozen=True)
class Carve:
    """A MIG instance to create before a placement can run on it."""

    key: tuple[str, int, str, int]  # (node, gpu, profile, start) as in DeviceMap.migs
    gpu_uuid: str
    profile: str
    start: int
    size: int  # memory slots


def to_carve(placement: Iterable[Mapping], devices: DeviceMap) -> list[Carve]:
    """The placement's MIG slices that have no instance yet on GPUs carved freely."""
    out = []
    for s in placement:
        if s.get("kind") != "mig" or _gpu(s) < 0:
            continue
        key = (str(s.get("node")), _gpu(s), str(s.get("profile")), int(s.get("mig_start", -1)))
        if key in devices.migs or key[:2] not in devices.carvable:
            continue
        uuid, model = devices.carvable[key[:2]]
        prof = migtab.profiles_for(model).get(key[2])
        if prof is None:
            raise DeviceError(f"placement: {model} has no MIG profile {key[2]}")
        out.append(Carve(key, uuid, key[2], key[3], prof.size))
    return out


def with_migs(devices: DeviceMap, created: Mapping[tuple[str, int, str, int], str]) -> DeviceMap:
    """``devices`` knowing the instances just created for a placement."""
    return DeviceMap(devices.gpus, {**devices.migs, **created}, devices.real, devices.carvable)


def declared_gpu_id(node: str, gpu: int) -> str:
    return f"GPU-{node}-{gpu}"


def declared_mig_id(node: str, gpu: int, profile: str, start: int) -> str:
    return f"MIG-{node}-{gpu}-{profile}-{start}"


def _gpu(s: Mapping) -> int:
    g = s.get("gpu", -1)
    return -1 if g is None else int(g)


def slice_id(s: Mapping, devices: DeviceMap) -> tuple[str, bool]:
    """The CUDA device id of one GPU slice (``gpu`` >= 0), and whether it is a real one."""
    node, gpu = str(s.get("node")), _gpu(s)
    if s.get("kind") == "mig":
        profile, start = str(s.get("profile")), int(s.get("mig_start", -1))
        uuid = devices.migs.get((node, gpu, profile, start))
        if uuid:
            return uuid, True
        if devices.real:
            raise DeviceError(f"placement: node {node} GPU {gpu} has no MIG instance {profile} "
                              f"at slot {start} (NVML reported none; with dynamic_mig the "
                              "instance must be created before work is placed on it)")
        return declared_mig_id(node, gpu, profile, start), False
    known = devices.gpus.get((node, gpu))
    if known:
        return known, True
    if devices.real:
        raise DeviceError(f"placement: node {node} has no GPU {gpu} in the NVML inventory")
    return declared_gpu_id(node, gpu), False


@dataclass(frozen=True)
class DeviceEnv:
    """The environment confining a process to its placement."""

    env: dict[str, str]
    ids: tuple[str, ...]  # CUDA_VISIBLE_DEVICES, in order
    declared: bool  # some id is a derived stand-in, not a CUDA id
    #: device ids of the GPUs carrying an MPS share of this placement (their control daemons
    #: must run while it does)
    mps_gpus: tuple[str, ...] = ()


def mps_env(shares: Iterable[tuple[int, Mapping]]) -> dict[str, str]:
    """MPS limits for (visible device index, slice) pairs of MPS shares: the smallest share's
    thread percentage (one value per process), each share's pinned memory by its index."""
    env: dict[str, str] = {}
    pct: list[int] = []
    mem: list[str] = []
    for index, s in shares:
        pct.append(max(1, round(int(s.get("milli", 0) or 0) / 10)))
        if s.get("gpu_memory_mib"):
            mem.append(f"{index}={int(s['gpu_memory_mib'])}M")
    if pct:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(pct))
    if mem:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(mem)
    return env


def build(placement: Iterable[Mapping], devices: DeviceMap | None = None,
          mps_pipes: Mapping[str, str] | None = None) -> DeviceEnv:
    """The environment of a placement (a list of slice dicts: node, gpu, kind, profile,
    mig_start, milli, gpu_memory_mib). CPU-only slices add nothing; no GPU slice at all gives
    an empty ``CUDA_VISIBLE_DEVICES`` (no GPU visible).

    ``mps_pipes``: device id -> pipe directory of the MPS control daemon that runs for that
    GPU. Given (the caller runs daemons), every MPS share must have one, and all of one
    process's shares must be on one GPU (a process talks to one daemon)."""
    devices = devices or DeviceMap()
    ids: list[str] = []
    shares: list[tuple[int, Mapping]] = []
    mps_gpus: list[str] = []
    declared = False
    for s in placement:
        if _gpu(s) < 0:
            continue
        did, real = slice_id(s, devices)
        declared = declared or not real
        if did in ids:
            raise DeviceError(f"placement: {did} appears twice")
        if s.get("kind") == "mps":
            shares.append((len(ids), s))
            mps_gpus.append(did)
        ids.append(did)
    env = {"CUDA_VISIBLE_DEVICES": ",".join(ids)}
    env.update(mps_env(shares))
    if mps_pipes is not None and mps_gpus:
        if len(mps_gpus) > 1:
            raise DeviceError(f"placement: MPS shares on {len(mps_gpus)} GPUs "
                              f"({', '.join(mps_gpus)}); a process uses one MPS daemon")
        pipe = mps_pipes.get(mps_gpus[0])
        if not pipe:
            raise DeviceError(f"placement: no MPS control daemon runs for {mps_gpus[0]}")
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe
    return DeviceEnv(env, tuple(ids), declared, tuple(mps_gpus))
