"""The wrapped backend spawner that runs the server once the core granted a slice — one per
cluster where the service schedules several (``BudgetSpawner.cluster_spawners``) — and how the
granted placement reaches it (``BudgetSpawner.child_configurer``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from jupyterhub.spawner import Spawner
from traitlets.utils.importstring import import_item

if TYPE_CHECKING:
    from .spawner import BudgetSpawner

#: traits the hub sets on a spawner that the child needs too
CHILD_TRAITS = ("user", "orm_spawner", "hub", "authenticator", "proxy_spec", "oauth_client_id",
                "cookie_options", "cookie_host_prefix_enabled", "trusted_alt_names",
                "public_url", "public_hub_url", "internal_ssl", "internal_trust_bundles",
                "internal_certs_location", "_deprecated_db_session")


class ClusterSpawnerError(ValueError):
    """A bad ``BudgetSpawner.cluster_spawners`` entry: the message names it."""


def check_cluster_spawners(value: dict) -> dict:
    """``{cluster: {"class": Spawner class or its import path, "config": {trait: value}}}``:
    each class importable and a Spawner, each config key one of its traits."""
    out = {}
    for name, spec in value.items():
        where = f"cluster_spawners.{name}"
        if not isinstance(spec, dict) or set(spec) - {"class", "config"} or "class" not in spec:
            raise ClusterSpawnerError(f"{where}: expected {{'class': <Spawner class or import "
                                      "path>, 'config': {<trait>: <value>}}")
        cls = spec["class"]
        if isinstance(cls, str):
            try:
                cls = import_item(cls)
            except (ImportError, AttributeError, ValueError) as e:
                raise ClusterSpawnerError(f"{where}.class: cannot import {spec['class']!r} "
                                          f"({e})") from None
        if not (isinstance(cls, type) and issubclass(cls, Spawner)):
            raise ClusterSpawnerError(f"{where}.class: {spec['class']!r} is not a JupyterHub "
                                      "Spawner")
        config = spec.get("config") or {}
        if not isinstance(config, dict):
            raise ClusterSpawnerError(f"{where}.config: expected a dict of {cls.__name__}'s "
                                      "settings")
        bad = sorted(k for k in config if not cls.class_traits().get(k))
        if bad:
            raise ClusterSpawnerError(f"{where}.config.{bad[0]}: {cls.__name__} has no such "
                                      "setting")
        out[name] = {"class": cls, "config": dict(config)}
    return out


def child_class(sp: BudgetSpawner, cluster: str | None) -> tuple[type[Spawner], dict]:
    """The spawner class and trait values for a session on ``cluster``: its entry in
    ``cluster_spawners``, else ``backend_spawner_class`` with ``backend_spawner_config``."""
    spec = sp.cluster_spawners.get(cluster or "")
    if spec is None:
        return sp.backend_spawner_class, sp.backend_spawner_config
    return spec["class"], spec["config"]


def construct_child(sp: BudgetSpawner, cluster: str | None = None) -> Spawner:
    """The backend spawner (made once, then kept in step with the parent's per-start traits).
    ``cluster``: where the session was granted its slice; a spawner made for another cluster
    (a previous start's, not running now) is replaced by this cluster's."""
    if cluster is not None and sp.child is not None and sp.child_cluster != cluster:
        sp.child, sp.child_state = None, {}
    if sp.child is None:
        if cluster is not None:
            sp.child_cluster = cluster
        cls, config = child_class(sp, sp.child_cluster)
        kw = {k: getattr(sp, k) for k in CHILD_TRAITS if sp.has_trait(k)}
        sp.child = cls(config=sp.config, **kw, **config)
        if sp.child_state:
            sp.child.load_state(sp.child_state)
    c = sp.child
    c.user_options = dict(sp.user_options or {})
    c.api_token = sp.api_token
    c.admin_access = sp.admin_access
    c.cert_paths = sp.cert_paths
    c.handler = sp.handler
    return c


def configure_child(configurer: str, child: Spawner, placement: list[dict], meta: dict) -> None:
    """Apply the granted placement to the backend spawner. ``configurer`` is 'module:function'
    called as f(child, placement, meta); empty: the placement's environment (meta['env'])
    is added to the child's, which is what local process spawners need."""
    if not configurer:
        child.environment = {**child.environment, **meta["env"]}
        return
    mod, _, fn = configurer.partition(":")
    getattr(importlib.import_module(mod), fn)(child, placement, meta)
