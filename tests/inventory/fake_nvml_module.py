"""The test NVML fake (:class:`tests.inventory.fake_nvml.FakeNvml`) as an importable module,
for a service run as its own process (``--GpuBudgetService.busy_nvml_module=
tests.inventory.fake_nvml_module``): its GPUs are ``$GPUBUDGET_FAKE_NVML`` (a JSON list of
GPU descriptions as ``FakeNvml`` takes them; absent: no NVIDIA driver). A stand-in for a GPU
this machine does not have, never for a part that runs here."""

from __future__ import annotations

import json
import os
from typing import Any

from tests.inventory.fake_nvml import FakeNvml

_fake = FakeNvml(json.loads(os.environ.get("GPUBUDGET_FAKE_NVML", "null")))


def __getattr__(name: str) -> Any:
    return getattr(_fake, name)
