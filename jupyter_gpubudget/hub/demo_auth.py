"""DEMO ONLY authenticator for the embedded demo hub (``gpubudget hub`` / ``make run``).

Every user named in the budgets file (members, managers, admins) logs in with one shared,
publicly known password. It exists so the demo works on a fresh machine without accounts;
it provides NO security. Production hubs use a real authenticator (see
hub_config/jupyterhub_config.production.py).
"""

from __future__ import annotations

import hmac

from jupyterhub.auth import Authenticator
from traitlets import Unicode

DEMO_PASSWORD = "gpubudget-demo"


class DemoAuthenticator(Authenticator):
    """DEMO ONLY: the users of the budgets file, one shared password. Not for production."""

    demo_password = Unicode(
        DEMO_PASSWORD, config=True,
        help="The shared password of the demo (DEMO ONLY: anyone who knows it can log in as "
             "any allowed user).")

    async def authenticate(self, handler, data):  # noqa: ANN001, ANN201
        user = (data or {}).get("username", "").strip()
        password = (data or {}).get("password", "")
        if not user or not hmac.compare_digest(password.encode(), self.demo_password.encode()):
            self.log.warning("DEMO authenticator: login refused for %r", user)
            return None
        return user
