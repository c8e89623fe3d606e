"""jupyter-gpubudget: share a GPU cluster by budget (hub spawner, service, fair-share core,
JupyterLab extension). Kept import-free: Jupyter loads the hooks below at start-up."""


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt JupyterLab extension (``jupyter labextension develop`` links it)."""
    return [{"src": "labextension", "dest": "jupyter-gpubudget"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_gpubudget.serverext"}]
