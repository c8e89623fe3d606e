"""JupyterHub integration: BudgetSpawner (entry point ``gpubudget`` in ``jupyterhub.spawners``)
and the demo authenticator of the embedded demo hub."""

from .spawner import BudgetSpawner

__all__ = ["BudgetSpawner"]
