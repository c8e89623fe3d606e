"""A granted placement -> the environment that confines a session to it (local backend).

Whole GPUs and MIG instances become ``CUDA_VISIBLE_DEVICES`` (UUIDs); an MPS share adds
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and, when a memory limit was asked for,
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``. CPU only: ``CUDA_VISIBLE_DEVICES`` is empty (no GPU).

UUIDs come from NVML when the inventory was discovered there. For a declared inventory (demo,
tests: no GPU) stable fake UUIDs are derived, ``GPU-<node>-<gpu>`` and
``MIG-<node>-<gpu>-<profile>-<start>``, and the log says so.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger("gpubudget.hub")


def fake_gpu_uuid(node: str, gpu: int) -> str:
    return f"GPU-{node}-{gpu}"


def fake_mig_uuid(node: str, gpu: int, profile: str, start: int) -> str:
    return f"MIG-{node}-{gpu}-{profile}-{start}"


def device_ids(placement: list[dict], discovery: Any = None) -> tuple[list[str], bool]:
    """The CUDA device ids of a placement, and whether any is a derived (fake) one."""
    ids: list[str] = []
    fake = False
    for s in placement:
        gpu = s.get("gpu", -1)
        if gpu is None or gpu < 0:
            continue
        node = str(s.get("node"))
        real: str | None = None
        if s.get("kind") == "mig":
            profile, start = str(s.get("profile")), int(s.get("mig_start", -1))
            if discovery is not None:
                real = discovery.mig_uuid(gpu, profile, start)
            ids.append(real or fake_mig_uuid(node, gpu, profile, start))
        else:
            if discovery is not None:
                real = discovery.gpu_uuids.get(gpu)
            ids.append(real or fake_gpu_uuid(node, gpu))
        fake = fake or real is None
    return ids, fake


def placement_env(placement: list[dict], discovery: Any = None) -> dict[str, str]:
    ids, fake = device_ids(placement, discovery)
    env = {"CUDA_VISIBLE_DEVICES": ",".join(ids),
           "GPUBUDGET_PLACEMENT": json.dumps(placement, sort_keys=True)}
    if fake and ids:
        log.info("declared inventory: derived device ids %s (no NVML UUIDs)", ",".join(ids))
    for s in placement:
        if s.get("kind") == "mps":
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(s.get("milli", 0) / 10)))
            if s.get("gpu_memory_mib"):
                env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={s['gpu_memory_mib']}M"
    return env


def describe(placement: list[dict] | None) -> str:
    """Human words for a placement: 'h100-a GPU 3', 'h100-a GPU 6 MIG 1g.10gb', 'CPU only'."""
    if not placement:
        return "CPU only"
    parts = []
    for s in placement:
        if s.get("gpu", -1) < 0:
            parts.append(f"{s.get('node')} (CPU only)")
        elif s.get("kind") == "mig":
            parts.append(f"{s['node']} GPU {s['gpu']} MIG {s.get('profile')}")
        elif s.get("kind") == "mps":
            parts.append(f"{s['node']} GPU {s['gpu']} MPS {s.get('milli', 0) / 10:g}%")
        else:
            parts.append(f"{s['node']} GPU {s['gpu']}")
    return ", ".join(parts)
