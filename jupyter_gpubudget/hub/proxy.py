"""``QuietProxy``: JupyterHub's configurable-http-proxy, except that removing a route the proxy
does not have is not an error.

A server that leaves the queue (or whose spawn is refused) never got a route; JupyterHub
still asks the proxy to delete one when it stops, and configurable-http-proxy answers 404,
which JupyterHub logs as an error ("api_request to proxy failed: 404") and a warning on every
"Leave queue". ``QuietProxy`` asks for the proxy's routes first and deletes only one it has.

    c.JupyterHub.proxy_class = "jupyter_gpubudget.hub.proxy.QuietProxy"
"""

from __future__ import annotations

from jupyterhub.proxy import ConfigurableHTTPProxy


class QuietProxy(ConfigurableHTTPProxy):
    async def delete_route(self, routespec: str) -> None:
        if routespec not in await self.get_all_routes():
            self.log.debug("Proxy: no route %s to delete", routespec)
            return
        await super().delete_route(routespec)
