"""Snapshots of notebook sessions: one interface, two backends, one store.

- :class:`~.criusnap.CriuSnapshotter`: CRIU dumps and restores the kernel's process tree
  (everything comes back); needs root (in-process, or through the privileged launcher
  ``python -m jupyter_gpubudget.snapshot.privileged``), and for a kernel holding a GPU,
  ``cuda-checkpoint`` (whole GPUs only).
- :class:`~.namespace.NamespaceSnapshotter`: the kernel's user namespace and cell history,
  restored into a fresh kernel anywhere (MIG, MPS, another node); reports per variable what was
  restored, recomputed or lost.
- :class:`~.store.Store`: content-addressed, checksummed, compressed chunks and one verified
  manifest per snapshot; retention and per-project quota.

:func:`~.base.choose` picks the first backend that can capture a kernel and says why the others
could not. Submodules are imported lazily: the privileged launcher imports only :mod:`.criu`.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Availability": "base", "KernelRef": "base", "RestoreReport": "base", "Snapshot": "base",
    "SnapshotError": "base", "Snapshotter": "base", "choose": "base",
    "Store": "store", "NamespaceSnapshotter": "namespace", "CriuSnapshotter": "criusnap",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(name)
