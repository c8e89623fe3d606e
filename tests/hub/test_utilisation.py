"""The idle sampler's utilisation figure, which the spawner sends with each heartbeat (the
service exports it as gpubudget_session_gpu_utilisation_percent; tests/service/test_grafana.py
follows it into Prometheus)."""

from jupyter_gpubudget.hub.idle import gpu_utilisation

from .test_spawner_units import FakeNvml


def test_the_busiest_device_counts_and_unknown_ones_do_not():
    nv = FakeNvml({"GPU-a": 12, "GPU-b": 67})
    assert gpu_utilisation(["GPU-a"], nv) == 12.0
    assert gpu_utilisation(["GPU-a", "GPU-b", "GPU-n1-0"], nv) == 67.0
    assert gpu_utilisation(["GPU-n1-0"], nv) is None  # a derived demo id: NVML cannot tell
    assert gpu_utilisation(["", ""], nv) is None


def test_without_a_driver_there_is_no_figure():
    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:
            raise self.NVMLError("Driver Not Loaded")

    assert gpu_utilisation(["GPU-a"], NoDriver({"GPU-a": 50})) is None
