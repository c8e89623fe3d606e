"""Several named clusters under one service and one budget tree (docs/service.md, "Several
clusters"): ``GpuBudgetService.clusters`` names each cluster's backend, its settings and its
inventory; this builds one backend per cluster and one inventory whose nodes name their
cluster, so the core schedules all of them with one account tree and one fair-share
standing, and each placement is carried out by its own cluster's backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traitlets.utils.importstring import import_item

from jupyter_gpubudget.backends.base import Backend
from jupyter_gpubudget.backends.multi import ClusterBackends
from jupyter_gpubudget.core.inventory import Inventory, load_inventory, merge_clusters
from jupyter_gpubudget.inventory.nvml import load_inventory as discover_or_declared

#: short names of the backends that ship with the package
BACKENDS = {"local": "jupyter_gpubudget.backends.local.LocalBackend",
            "slurm": "jupyter_gpubudget.backends.slurm.SlurmBackend",
            "kubernetes": "jupyter_gpubudget.backends.kubernetes.KubernetesBackend"}
KEYS = {"backend", "config", "inventory"}


class ClusterConfigError(ValueError):
    """A bad ``clusters`` setting: the message names the cluster and the key."""


def backend_class(name: str, spec: Any) -> type[Backend]:
    where = f"clusters.{name}.backend"
    if not isinstance(spec, str | type):
        raise ClusterConfigError(f"{where}: expected one of {', '.join(BACKENDS)} or a "
                                 "class's import path")
    try:
        cls = import_item(BACKENDS.get(spec, spec)) if isinstance(spec, str) else spec
    except (ImportError, AttributeError, ValueError) as e:
        raise ClusterConfigError(f"{where}: cannot import {spec!r} ({e}); expected one of "
                                 f"{', '.join(BACKENDS)} or a class's import path") from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ClusterConfigError(f"{where}: {spec!r} is not a gpubudget Backend")
    return cls


def build(svc: Any, clusters: dict[str, Any]) -> tuple[ClusterBackends, Inventory, str]:
    """One backend per cluster (its ``config`` set on it as traits), each cluster's inventory
    — the engine's own nodes (Slurm, Kubernetes), else the ``inventory`` file, else NVML or
    the service's ``inventory_file`` — and the merged inventory."""
    parts: dict[str, Backend] = {}
    invs: dict[str, Inventory] = {}
    said = []
    for name, spec in clusters.items():
        if not isinstance(spec, dict):
            raise ClusterConfigError(f"clusters.{name}: expected a dict with keys "
                                     f"{', '.join(sorted(KEYS))}")
        unknown = sorted(set(spec) - KEYS)
        if unknown:
            raise ClusterConfigError(f"clusters.{name}.{unknown[0]}: unknown key (a cluster "
                                     f"takes {', '.join(sorted(KEYS))})")
        cls = backend_class(name, spec.get("backend", "local"))
        config = spec.get("config") or {}
        if not isinstance(config, dict):
            raise ClusterConfigError(f"clusters.{name}.config: expected a dict of the "
                                     f"{cls.__name__}'s settings")
        bad = sorted(k for k in config if not cls.class_traits(config=True).get(k))
        if bad:
            raise ClusterConfigError(f"clusters.{name}.config.{bad[0]}: {cls.__name__} has "
                                     "no such setting")
        backend = cls(parent=svc, log=svc.log, **config)
        inv = backend.discover_inventory()
        if inv is not None:
            said.append(f"{name}: nodes of the {backend.name} backend")
        elif spec.get("inventory"):
            path = str(spec["inventory"])
            inv = load_inventory(Path(path).read_text(), path)
            said.append(f"{name}: declared inventory {path}")
        else:
            inv, msg = discover_or_declared(
                None if svc.inventory_source == "nvml" else svc.inventory_file,
                dynamic_mig=svc.dynamic_mig)
            said.append(f"{name}: {msg}")
        parts[name] = backend
        invs[name] = inv
    inventory = merge_clusters(invs)
    multi = ClusterBackends(parts, {n.name: n.cluster for n in inventory.nodes},
                            parent=svc, log=svc.log)
    return multi, inventory, "clusters " + "; ".join(said)
