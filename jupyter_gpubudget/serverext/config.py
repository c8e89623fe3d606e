"""Settings of the server extension (``c.GpuBudgetLab.*`` in jupyter_server_config)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from traitlets import Bool, Float, Unicode, default
from traitlets.config import LoggingConfigurable


def service_url_from_env(env: Mapping[str, str]) -> str:
    """Where the service is, from the server's environment; empty when nothing says.

    1. ``$GPUBUDGET_URL`` (the service's base URL, as for the ``gpubudget`` CLI);
    2. the hub's public address (``$JUPYTERHUB_PUBLIC_HUB_URL``, set when JupyterHub has a
       ``public_url``) + ``services/gpubudget``: the proxy routes services;
    3. the hub API's host (``$JUPYTERHUB_API_URL``) + ``$JUPYTERHUB_BASE_URL`` +
       ``services/gpubudget``: right only where that host is the proxy.
    """
    if env.get("GPUBUDGET_URL"):
        return env["GPUBUDGET_URL"].rstrip("/")
    base = "/" + env.get("JUPYTERHUB_BASE_URL", "/").strip("/")
    for var in ("JUPYTERHUB_PUBLIC_HUB_URL", "JUPYTERHUB_API_URL"):
        u = urlsplit(env.get(var, ""))
        if u.scheme in ("http", "https") and u.netloc:
            return f"{u.scheme}://{u.netloc}{base.rstrip('/')}/services/gpubudget"
    return ""


class GpuBudgetLab(LoggingConfigurable):
    """How the user's Jupyter server reaches the gpubudget service for the JupyterLab sidebar."""

    service_url = Unicode(help=(
        "The gpubudget service's base URL (without /api/v1), e.g. "
        "http://127.0.0.1:10101/services/gpubudget; several replicas comma-separated (the "
        "next is tried when one is unreachable or a standby). Default: $GPUBUDGET_URL, else the hub's "
        "public address ($JUPYTERHUB_PUBLIC_HUB_URL) or the hub API's host ($JUPYTERHUB_API_URL) "
        "+ $JUPYTERHUB_BASE_URL + services/gpubudget."
    )).tag(config=True)
    api_token = Unicode(help=(
        "Token sent to the service (never to the browser). Default: $GPUBUDGET_TOKEN (as for "
        "the gpubudget CLI; a service without JupyterHub, e.g. on Binder), else "
        "$JUPYTERHUB_API_TOKEN, the token JupyterHub gives this server; it needs the "
        "custom:gpubudget:read scope (custom:gpubudget:submit to cancel work from the sidebar)."
    )).tag(config=True)
    session_id = Unicode(help=(
        "The gpubudget session this server runs in. Default: $GPUBUDGET_SESSION, which "
        "BudgetSpawner sets; empty when the server was not started through the GPU queue."
    )).tag(config=True)
    project = Unicode(help="The project this server is charged to. Default: $GPUBUDGET_PROJECT."
                      ).tag(config=True)
    request_timeout = Float(15.0, help="Seconds one request to the service may take."
                            ).tag(config=True)
    features_ttl = Float(300.0, help=(
        "Seconds the service's list of endpoints (its OpenAPI document) is cached; the sidebar "
        "shows optional sections (usage per day, job logs) only when the service has them."
    )).tag(config=True)

    terminal_path = Bool(True, help=(
        "Put this Python environment's commands (the gpubudget CLI, python, pip) on the PATH "
        "of the lab's terminals after their shell's login profile ran (a login shell's "
        "/etc/profile resets PATH). Done for POSIX shells (sh, bash, zsh, dash, ksh) started "
        "with no options but -l; set False to leave the terminal's shell command as it is."
    )).tag(config=True)

    @default("service_url")
    def _service_url(self) -> str:
        return service_url_from_env(os.environ)

    @default("api_token")
    def _api_token(self) -> str:
        return os.environ.get("GPUBUDGET_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN", "")

    @default("session_id")
    def _session_id(self) -> str:
        return os.environ.get("GPUBUDGET_SESSION", "")

    @default("project")
    def _project(self) -> str:
        return os.environ.get("GPUBUDGET_PROJECT", "")

    def problem(self) -> str | None:
        """Why the service cannot be used, in words naming the setting; None when it can."""
        if not self.service_url:
            return ("no service URL: set $GPUBUDGET_URL or GpuBudgetLab.service_url (outside "
                    "JupyterHub there is no $JUPYTERHUB_API_URL to derive it from)")
        for url in self.service_urls():
            u = urlsplit(url)
            if u.scheme not in ("http", "https") or not u.netloc:
                return f"GpuBudgetLab.service_url: {url!r} is not an http(s) URL"
        if not self.api_token:
            return ("no token: this server has neither $GPUBUDGET_TOKEN nor "
                    "$JUPYTERHUB_API_TOKEN (not started by JupyterHub?); set "
                    "GpuBudgetLab.api_token")
        return None

    def service_urls(self) -> list[str]:
        """The service's replicas: ``service_url`` may list several, comma-separated (one
        leads, the others stand by); the lab tries the next when one cannot answer."""
        return [u.strip() for u in self.service_url.split(",") if u.strip()]

    def api_url(self, path: str, base: str | None = None) -> str:
        base = base if base is not None else (self.service_urls() or [self.service_url])[0]
        return base.rstrip("/") + "/api/v1/" + path.lstrip("/")
