"""Node health sources against the real ledger (SQLite) and the service's real scheduling loop
with the local backend: the NVML source on the fake NVML (this machine has no GPU; the real
library is read by bench/gpu_check.py on a GPU machine), the command hook with a real script,
the backend's own view; the monitor's rules (a report drains when it appears; an admin's
undrain stands against an unchanged report; auto-recovery only where the source has it)."""

from __future__ import annotations

import os
import time

import pytest

from jupyter_gpubudget.backends.local import LocalBackend as _LocalBackend
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.inventory.health import NvmlHealthReader
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger import nodes as ledger_nodes
from jupyter_gpubudget.service.health import CommandHealthSource, HealthMonitor, NvmlHealthSource
from jupyter_gpubudget.service.loop import SchedulingLoop
from tests.fixtures.unixusers import TEMPLATE, ensure_accounts
from tests.inventory.fake_nvml import FakeNvml, hgx_h200

BUDGETS = """\
accounts:
  lab:
    grant: 100
    children:
      proj: {grant: 100, members: [ann]}
"""
INVENTORY = """\
nodes:
  - {name: gpu-host, model: H100-80GB, gpus: 2}
  - {name: other, model: H100-80GB, gpus: 2}
"""


def LocalBackend(cls=_LocalBackend, **kw):  # noqa: ANN001, ANN003, ANN201, N802
    """As root, ann's jobs run as the Unix account gbt-ann (never as root)."""
    if os.geteuid() == 0:
        ensure_accounts(["ann"])
        kw.setdefault("unix_user_template", TEMPLATE)
    return cls(**kw)


@pytest.fixture
def ledger(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    upgrade(url)
    led = Ledger(connect(url))
    led.sync_budgets(load_budgets(BUDGETS), time.time())
    yield led
    led.dispose()


def reasons(led: Ledger) -> dict[str, str]:
    return {n: r.reason for n, r in ledger_nodes.node_health(led).items() if not r.healthy}


def test_reader_reports_every_health_field():
    gpus = hgx_h200(mig_gpus=())[:4]
    gpus[1].update(retired_pending=True)
    gpus[2].update(remapped=(0, 1, 1, 0), ecc_dbe=2)
    gpus[3].update(temperature=91, slowdown=90)
    nv = FakeNvml(gpus)
    r = NvmlHealthReader(nv)
    r.open()
    first = r.read()
    assert [bool(g.problems) for g in first] == [False, True, True, True]
    assert first[0].retired_pages_pending is None  # not supported: no problem
    assert first[1].problems == ["GPU 1: retired memory pages pending a GPU reset"]
    assert first[2].remapped_rows == {"correctable": 0, "uncorrectable": 1, "pending": 1,
                                      "failure": 0}
    assert "row remapping pending" in first[2].problems[0]
    assert "2 uncorrected (double-bit) ECC errors" in first[2].problems[1]
    assert first[3].temperature_c == 91 and first[3].slowdown_c == 90
    assert "slowdown threshold" in first[3].problems[0]
    # XIDs arrive as events, once; application XIDs (13, 31, 43, 45) are ignored
    nv.inject_xid(0, 31)
    nv.inject_xid(0, 79)
    xid = r.read()[0]
    assert xid.xids == [79] and xid.problems == ["GPU 0: XID error 79"]
    assert r.read()[0].xids == []
    # a GPU fallen off the bus
    gpus[0]["lost"] = True
    lost = r.read()[0]
    assert lost.lost and "fallen off the bus" in lost.problems[0]
    r.close()
    assert nv.initialised is False


def test_no_driver_means_no_reports_not_a_crash():
    src = NvmlHealthSource(node_name="gpu-host", nvml=FakeNvml(None))
    assert src.check(["gpu-host"]) == {}
    assert "no NVIDIA driver" in (src.off or "")
    # and the real library on this machine (no driver here: nothing to report)
    real = NvmlHealthSource(node_name="gpu-host")
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("a real NVIDIA driver is present")
    except pynvml.NVMLError:
        pass
    assert real.check(["gpu-host"]) == {} and real.off


def test_an_xid_drains_the_node_live_and_its_work_is_requeued_elsewhere(ledger, tmp_path):
    nv = FakeNvml(hgx_h200(mig_gpus=())[:2])
    inventory = load_inventory(INVENTORY)
    budgets = load_budgets(BUDGETS)
    backend = LocalBackend(state_dir=str(tmp_path / "jobs"), stop_grace=2)
    loop = SchedulingLoop(ledger, lambda: budgets.accounts, inventory, lambda: budgets.policy,
                          backend)
    src = NvmlHealthSource(node_name="gpu-host", nvml=nv)
    mon = HealthMonitor(ledger, [src], lambda: [n.name for n in inventory.nodes], time.time)
    try:
        # two 2-GPU jobs: one lands on each node
        ids = [ledger.submit(project="proj", user="ann", kind="batch", now=time.time(),
                             request={"kind": "gpu", "gpus": 2},
                             command=["/bin/sh", "-c", "sleep 60"],
                             resumable=True).id for _ in range(2)]
        loop.cycle()
        on = {ledger.get(w).placement[0]["node"]: w for w in ids}
        assert set(on) == {"gpu-host", "other"}
        assert mon.poll() == [] and reasons(ledger) == {}
        nv.inject_xid(1, 79)  # GPU 1 fell off the bus: XID 79
        assert mon.poll() == ["gpu-host"]
        assert reasons(ledger) == {"gpu-host": "GPU 1: XID error 79"}
        health = [d for d in ledger.decisions(kind="health")]
        assert health and "XID error 79" in health[0].reason and health[0].actor == "health:nvml"
        loop.cycle()  # the core drains it: the job there (unprotected) is preempted, requeued
        victim = ledger.get(on["gpu-host"])
        assert victim.state == "pending" and victim.preemptions == 1
        assert loop.view.nodes["gpu-host"]["state"] == "ready_for_repair"
        assert ledger.decisions(kind="drain")[0].reason == "GPU 1: XID error 79"  # the core's
        repair = ledger.decisions(kind="repair")  # nothing runs on it any more
        assert repair and "ready for repair" in repair[0].reason
        # the same (unchanged) report after an admin's undrain does not drain it again
        assert mon.poll() == []
        assert loop.set_node_health("gpu-host", True, "GPU reseated", "root")
        assert mon.poll() == [] and reasons(ledger) == {}
        loop.cycle()
        assert ledger.get(on["gpu-host"]).state == "running"  # back in service
        # a new XID drains it again
        nv.inject_xid(0, 48)
        assert mon.poll() == ["gpu-host"]
        assert "XID error 48" in reasons(ledger)["gpu-host"]
    finally:
        for w in ledger.workloads(states=("running",)):
            loop.cancel(w.id, by="test")
        mon.close()


def test_command_hook(ledger, tmp_path):
    script = tmp_path / "check.sh"
    script.write_text("#!/bin/sh\nif [ -e \"$0.$1.bad\" ]; then echo \"fan failure on $1\"; "
                      "exit 2; fi\nexit 0\n")
    script.chmod(0o755)
    cmd = CommandHealthSource(command=[str(script), "{node}"], timeout=10)
    mon = HealthMonitor(ledger, [cmd], lambda: ["a", "b", "c"], time.time)
    assert mon.poll() == []
    (tmp_path / "check.sh.b.bad").write_text("")
    assert mon.poll() == ["b"]
    assert reasons(ledger) == {"b": "fan failure on b"}
    assert ledger_nodes.node_health(ledger)["b"].source == "command"
    # the script passing again does not return b by itself (no auto_recover): an admin does
    (tmp_path / "check.sh.b.bad").unlink()
    assert mon.poll() == [] and reasons(ledger) == {"b": "fan failure on b"}
    cmd.auto_recover = True
    assert mon.poll() == ["b"] and reasons(ledger) == {}
    assert [d.kind for d in ledger.decisions()][:1] == ["undrain"]
    # a check that hangs is a problem too; one that cannot run is reported, not raised
    slow = CommandHealthSource(command=["sleep", "5"], timeout=0.2)
    assert slow.check(["a"]) == {"a": "health check timed out after 0.2 s"}
    missing = CommandHealthSource(command=[str(tmp_path / "nope"), "{node}"])
    assert "could not run" in missing.check(["a"])["a"]

    class Broken(CommandHealthSource):
        name = "broken"

        def check(self, nodes):  # noqa: ANN001, ANN202
            raise RuntimeError("sensor bus error")

    (tmp_path / "check.sh.c.bad").write_text("")
    mon2 = HealthMonitor(ledger, [Broken(), cmd], lambda: ["a", "b", "c"], time.time)
    assert mon2.poll() == ["c"]  # a broken source does not stop the others
    assert mon2.errors == {"broken": "RuntimeError: sensor bus error"}


class Engine(_LocalBackend):
    """The local backend with an engine's own view of its nodes (what Slurm and Kubernetes
    report through ``node_health``) and a record of the drains carried into it."""

    report: dict[str, str] = {}

    def __init__(self, **kw) -> None:  # noqa: ANN003
        super().__init__(**kw)
        self.calls: list[tuple] = []

    def node_health(self) -> dict[str, str]:
        return dict(self.report)

    def drain_node(self, node: str, reason: str) -> None:
        self.calls.append(("drain", node, reason))

    def undrain_node(self, node: str) -> None:
        self.calls.append(("undrain", node))


def test_the_engines_view_reaches_the_ledger_and_the_drain_reaches_the_engine(ledger,
                                                                             tmp_path):
    inventory = load_inventory(INVENTORY)
    budgets = load_budgets(BUDGETS)
    eng = LocalBackend(Engine, state_dir=str(tmp_path / "jobs"), stop_grace=2)
    loop = SchedulingLoop(ledger, lambda: budgets.accounts, inventory, lambda: budgets.policy,
                          eng)
    eng.report = {"other": "NotReady (KubeletDown)"}
    loop.cycle()
    rows = ledger_nodes.node_health(ledger)
    assert rows["other"].source == "backend" and not rows["other"].healthy
    assert rows["other"].changed_by == "engine:local"
    kinds = [d.kind for d in ledger.decisions()]
    assert "health" in kinds and "drain" in kinds and "repair" in kinds  # empty: at once
    assert ("drain", "other", "NotReady (KubeletDown)") in eng.calls
    assert loop.view.nodes["other"]["state"] == "ready_for_repair"
    assert loop.view.gpus == {"allocated": 0.0, "drained": 2.0, "idle": 2.0}
    # an admin's undrain stands while the report goes on unchanged (the engine catches up)
    assert loop.set_node_health("other", True, "kubelet restarted", "root")
    assert ("undrain", "other") in eng.calls
    loop.cycle()
    assert reasons(ledger) == {}
    # the engine stops reporting it: nothing more to do; a new report drains it again
    eng.report = {}
    loop.cycle()
    eng.report = {"other": "cordoned (disk)"}
    loop.cycle()
    assert reasons(ledger) == {"other": "cordoned (disk)"}
    # the engine resumes it: the loop follows (a node the engine marked)
    eng.report = {}
    loop.cycle()
    assert reasons(ledger) == {}
    assert "no longer reports" in ledger.decisions(kind="undrain")[0].reason
    assert loop.view.nodes["other"]["state"] == "in_service"
