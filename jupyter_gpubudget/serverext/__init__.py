"""The gpubudget extension of the user's Jupyter server.

It serves ``<base_url>gpubudget/api/...`` to the JupyterLab extension (authenticated by the
server's own auth, XSRF as jupyter-server does) and calls the gpubudget service with the
server's own token, which never reaches the browser. Enabled by
``jupyter-config/jupyter_server_config.d/jupyter_gpubudget.json`` (installed with the package).

One module per handler group (``budget``: the sidebar's figures, the queue, cancel;
``snapshot``: snapshots of this server's kernels and their restore); each has
``routes(base_url, lab) -> list`` (``lab.parent`` is the server app), optionally an async
``start(serverapp)`` run once the server's event loop runs, and is listed in
``HANDLER_GROUPS``. Once every extension is loaded, ``terminal`` puts this environment's
commands (the ``gpubudget`` CLI) on the PATH of the lab's terminals, which a login shell's
profile would otherwise reset.
"""

from __future__ import annotations

import importlib
from typing import Any

HANDLER_GROUPS = ("budget", "snapshot")


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_gpubudget.serverext"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from .config import GpuBudgetLab

    lab = GpuBudgetLab(parent=serverapp, log=serverapp.log)
    serverapp.web_app.settings["gpubudget_lab"] = lab
    base_url = serverapp.web_app.settings.get("base_url", "/")
    handlers: list = []
    for group in HANDLER_GROUPS:
        handlers += importlib.import_module(f"{__name__}.{group}").routes(base_url, lab)
    serverapp.web_app.add_handlers(".*$", handlers)
    problem = lab.problem()
    if problem:
        serverapp.log.warning("gpubudget: the GPU budget sidebar is not connected: %s", problem)
    else:
        serverapp.log.info("gpubudget: service at %s, session %s", lab.service_url,
                           lab.session_id or "(none: not started through the GPU queue)")


async def _start_jupyter_server_extension(serverapp: Any) -> None:
    lab = serverapp.web_app.settings.get("gpubudget_lab")
    if lab is not None and lab.terminal_path:  # the terminals extension has loaded by now
        from .terminal import install

        install(serverapp, serverapp.log)
    for group in HANDLER_GROUPS:
        start = getattr(importlib.import_module(f"{__name__}.{group}"), "start", None)
        if start is not None:
            await start(serverapp)
