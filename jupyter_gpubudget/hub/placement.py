"""A granted placement -> the environment that confines a session to it (local processes).

The devices come from the one builder every backend uses (``backends/devices.py``): whole
GPUs and MIG instances become ``CUDA_VISIBLE_DEVICES`` — real ``GPU-<uuid>`` / ``MIG-<uuid>``
when the service's inventory came from NVML (this host's NVML is asked for the UUIDs), stable
derived ids for a declared inventory (logged once: they are not CUDA ids); an MPS share adds
its MPS variables. CPU only: ``CUDA_VISIBLE_DEVICES`` is empty (no GPU).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from jupyter_gpubudget.backends import devices as dev

#: JupyterHub's own log (this runs inside the hub): a logger of its own, without a handler,
#: printed its notes bare, as if they were warnings
log = logging.getLogger("JupyterHub").getChild("gpubudget")
_told_declared = False


def placement_env(placement: list[dict], discovery: Any = None,
                  mps_pipes: dict[str, str] | None = None,
                  migs: dict[tuple[str, int, str, int], str] | None = None) -> dict[str, str]:
    """``discovery``: this host's NVML :class:`~jupyter_gpubudget.inventory.nvml.Discovery`
    (None: a declared inventory); ``migs``: MIG instances just created for the session
    (``mig.py``), (node, gpu, profile, start) -> ``MIG-<uuid>``."""
    global _told_declared
    devices = dev.device_map(discovery.inventory if discovery is not None else None)
    if migs:
        devices = dev.with_migs(devices, migs)
    built = dev.build(placement, devices, mps_pipes)
    if built.declared and not _told_declared:
        _told_declared = True
        log.info("gpubudget: %s", dev.DECLARED_NOTE)  # what the demo is made of: a note
    return {**built.env, "GPUBUDGET_PLACEMENT": json.dumps(placement, sort_keys=True)}


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
