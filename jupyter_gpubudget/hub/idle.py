"""GPU utilisation of a session's devices via NVML (``nvidia-ml-py``, imported as ``pynvml``).

``gpu_busy`` answers None when NVML cannot tell (no driver, derived demo UUIDs, MIG instances
whose utilisation NVML does not report); the spawner then falls back to kernel activity.
"""

from __future__ import annotations

from typing import Any


def gpu_busy(uuids: list[str], threshold: float, nvml: Any = None) -> bool | None:
    """True if any of the devices is above ``threshold`` percent utilisation, False if all are
    at or below it, None if NVML cannot tell."""
    uuids = [u for u in uuids if u]
    if not uuids:
        return None
    try:
        nv = nvml
        if nv is None:
            import pynvml as nv  # nvidia-ml-py
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver: fall back
        return None
    try:
        seen = False
        for u in uuids:
            try:
                h = nv.nvmlDeviceGetHandleByUUID(u)
                util = nv.nvmlDeviceGetUtilizationRates(h).gpu
            except Exception:  # noqa: BLE001 - unknown UUID, MIG without utilisation
                continue
            seen = True
            if util > threshold:
                return True
        return False if seen else None
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
