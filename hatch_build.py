"""Ship the prebuilt JupyterLab extension as shared data in regular wheels only.

An editable install (``make install``) links ``jupyter_gpubudget/labextension`` into the venv
with ``jupyter labextension develop`` instead, so a rebuilt extension needs no reinstall and
pip never writes through that link."""

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

LAB = "share/jupyter/labextensions/jupyter-gpubudget"


class LabExtensionData(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name == "wheel" and version == "standard":
            build_data["shared_data"]["jupyter_gpubudget/labextension"] = LAB
            build_data["shared_data"]["labextension/install.json"] = f"{LAB}/install.json"
