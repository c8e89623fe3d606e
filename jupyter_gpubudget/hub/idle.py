"""GPU utilisation of a session's devices via NVML (``nvidia-ml-py``, imported as ``pynvml``).

``gpu_utilisation`` (reported to the service with each heartbeat, for /metrics) and ``gpu_busy``
answer None when NVML cannot tell (no driver, derived demo UUIDs, MIG instances
whose utilisation NVML does not report); the spawner then falls back to kernel activity.
"""

from __future__ import annotations

from typing import Any


def gpu_busy(uuids: list[str], threshold: float, nvml: Any = None) -> bool | None:
    """True if any of the devices is above ``threshold`` percent utilisation, False if all are
    at or below it, None if NVML cannot tell."""
    util = gpu_utilisation(uuids, nvml)
    return None if util is None else util > threshold


def gpu_utilisation(uuids: list[str], nvml: Any = None) -> float | None:
    """The busiest of the devices' GPU utilisation (percent), or None if NVML cannot tell
    (no library, no driver, derived demo UUIDs, MIG instances without utilisation)."""
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
        seen: list[float] = []
        for u in uuids:
            try:
                h = nv.nvmlDeviceGetHandleByUUID(u)
                seen.append(float(nv.nvmlDeviceGetUtilizationRates(h).gpu))
            except Exception:  # noqa: BLE001 - unknown UUID, MIG without utilisation
                continue
        return max(seen) if seen else None
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
