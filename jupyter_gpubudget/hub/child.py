"""The wrapped backend spawner that runs the server once the core granted a slice, and how the
granted placement reaches it (``BudgetSpawner.child_configurer``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from jupyterhub.spawner import Spawner

if TYPE_CHECKING:
    from .spawner import BudgetSpawner

#: traits the hub sets on a spawner that the child needs too
CHILD_TRAITS = ("user", "orm_spawner", "hub", "authenticator", "proxy_spec", "oauth_client_id",
                "cookie_options", "cookie_host_prefix_enabled", "trusted_alt_names",
                "public_url", "public_hub_url", "internal_ssl", "internal_trust_bundles",
                "internal_certs_location", "_deprecated_db_session")


def construct_child(sp: BudgetSpawner) -> Spawner:
    """The backend spawner (made once, then kept in step with the parent's per-start traits)."""
    if sp.child is None:
        kw = {k: getattr(sp, k) for k in CHILD_TRAITS if sp.has_trait(k)}
        sp.child = sp.backend_spawner_class(config=sp.config, **kw, **sp.backend_spawner_config)
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
