"""Node health sources and the monitor that turns their reports into drains.

A *source* answers ``check(nodes) -> {node: problem}`` for the nodes it can see. Sources are
traitlets classes listed in ``GpuBudgetService.health_sources`` (an admin may add their own
subclass of :class:`HealthSource`); shipped:

- :class:`NvmlHealthSource`: this machine's GPUs through NVML (XID errors, retired or remapped
  memory pending, uncorrected ECC errors, temperature at the slowdown threshold, a GPU fallen
  off the bus);
- :class:`CommandHealthSource`: the admins' own script, run per node (exit 0: healthy).

Two more reach the ledger the same way: the backend's own view of its nodes
(``Backend.node_health()``: Slurm DOWN/DRAIN, Kubernetes cordoned/NotReady), which the
scheduling loop reads every cycle (``SchedulingLoop._record_engine_health``: it follows the
engine, so a node the engine stops reporting returns to service), and admins, who drain and
undrain through the API and the Nodes page (``PUT /nodes/{name}/health``).

The monitor's rule: a report drains a node when it *appears* (or its wording changes) — an
admin's undrain is not undone by a report that merely goes on unchanged; a new or changed one
drains it again. A node a source drained returns to service by itself only when that source
has ``auto_recover`` and stops reporting it; otherwise an admin undrains it after the repair.
"""

from __future__ import annotations

import logging
import shlex
import socket
import subprocess
from collections.abc import Callable
from typing import Any

from traitlets import Bool, Float, Int, List, Unicode
from traitlets.config import LoggingConfigurable

from jupyter_gpubudget.inventory.health import APPLICATION_XIDS, NvmlHealthReader
from jupyter_gpubudget.inventory.nvml import NoNvidiaDriver
from jupyter_gpubudget.ledger import Ledger
from jupyter_gpubudget.ledger import nodes as ledger_nodes


class HealthSource(LoggingConfigurable):
    """Subclasses set ``name`` and implement :meth:`check`."""

    name = "abstract"

    auto_recover = Bool(False, config=True, help=(
        "Return a node this source drained to service by itself as soon as the source no "
        "longer reports a problem (otherwise an admin undrains it after the repair)."))

    def __init__(self, backend: Any = None, inventory: Any = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.backend = backend
        self.inventory = inventory

    def check(self, nodes: list[str]) -> dict[str, str]:
        """{node: problem} for the nodes this source finds unhealthy now."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class NvmlHealthSource(HealthSource):
    """This machine's GPUs through NVML. Without an NVIDIA driver it reports nothing (and says
    so once in the log)."""

    name = "nvml"
    node_name = Unicode(help="The inventory node whose GPUs are this machine's (default: the "
                        "host name, as NVML discovery names it).").tag(config=True)
    ignored_xids = List(Int(), list(APPLICATION_XIDS), help=(
        "XID errors that do not mark a node unhealthy: the ones an application causes by "
        "itself (13 graphics engine exception, 31 memory page fault, 43 GPU stopped "
        "processing, 45 preemptive cleanup).")).tag(config=True)
    temperature_margin = Float(0.0, help=(
        "Degrees below NVML's slowdown threshold at which a GPU already counts as too hot."
    )).tag(config=True)
    nvml_module = Unicode("pynvml", help=(
        "Module providing the NVML API (nvidia-ml-py's 'pynvml'); a stand-in for tests."
    )).tag(config=True)

    def __init__(self, nvml: Any = None, **kw: Any) -> None:
        """``nvml``: an NVML module object to use instead of importing ``nvml_module``."""
        super().__init__(**kw)
        self.nvml = nvml
        self.reader: NvmlHealthReader | None = None
        self.off: str | None = None

    def _default_node(self) -> str:
        return self.node_name or socket.gethostname()

    def _open(self) -> NvmlHealthReader | None:
        if self.reader is not None or self.off is not None:
            return self.reader
        import importlib

        try:
            nv = self.nvml or importlib.import_module(self.nvml_module)
        except ImportError as e:
            self.off = f"{self.nvml_module} cannot be imported ({e})"
        else:
            reader = NvmlHealthReader(nv, tuple(self.ignored_xids), self.temperature_margin)
            try:
                reader.open()
                self.reader = reader
            except NoNvidiaDriver as e:
                self.off = str(e)
        if self.off is not None:
            self.log.info("NVML health checks off: %s", self.off)
        return self.reader

    def check(self, nodes: list[str]) -> dict[str, str]:
        node = self._default_node()
        if node not in nodes:
            if self.off is None:
                self.off = f"this machine ({node}) is not a node of the inventory"
                self.log.info("NVML health checks off: %s", self.off)
            return {}
        reader = self._open()
        if reader is None:
            return {}
        problems = [p for g in reader.read() for p in g.problems]
        return {node: "; ".join(problems)} if problems else {}

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None


class CommandHealthSource(HealthSource):
    """The admins' own health check, run once per node and check: exit status 0 is healthy;
    anything else drains the node, with the first line of the output as the reason. It runs
    as the service's user, with a time limit."""

    name = "command"
    command = List(Unicode(), [], help=(
        "The command, as a list; '{node}' in an argument is replaced by the node's name "
        "(e.g. ['/usr/local/sbin/gpu-health', '--node', '{node}']). Empty: off.")
    ).tag(config=True)
    nodes = List(Unicode(), [], help="Nodes to check (default: every node of the inventory)."
                 ).tag(config=True)
    timeout = Float(60.0, help="Seconds a check may take; one that takes longer is a "
                    "problem (the node drains).").tag(config=True)

    def check(self, nodes: list[str]) -> dict[str, str]:
        if not self.command:
            return {}
        out = {}
        for node in [n for n in (self.nodes or nodes) if n in nodes]:
            argv = [a.replace("{node}", node) for a in self.command]
            try:
                p = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout,
                                   stdin=subprocess.DEVNULL, check=False)
            except subprocess.TimeoutExpired:
                out[node] = f"health check timed out after {self.timeout:g} s"
                continue
            except OSError as e:
                out[node] = f"health check could not run ({shlex.join(argv)}): {e}"
                continue
            if p.returncode != 0:
                first = next((ln.strip() for ln in (p.stdout + "\n" + p.stderr).splitlines()
                              if ln.strip()), "")
                out[node] = (first[:300] or f"health check failed (exit {p.returncode})")
        return out


class HealthMonitor:
    """Polls the sources and records what changed in the ledger (audited there). Runs on a
    thread of its own (sources may block: NVML, commands)."""

    def __init__(self, ledger: Ledger, sources: list[HealthSource], nodes: Callable[[], list[str]],
                 clock: Callable[[], float], log: logging.Logger | None = None) -> None:
        self.ledger = ledger
        self.sources = sources
        self.nodes = nodes
        self.clock = clock
        self.log = log or logging.getLogger("gpubudget.health")
        self.last: dict[str, dict[str, str]] = {}  # source -> its previous report
        self.errors: dict[str, str] = {}  # source -> its last failure

    def poll(self) -> list[str]:
        """Check every source once; returns the nodes whose health changed."""
        names = self.nodes()
        changed: list[str] = []
        now = self.clock()
        current = ledger_nodes.node_health(self.ledger)
        for src in self.sources:
            try:
                report = {n: why for n, why in src.check(names).items() if n in names}
                self.errors.pop(src.name, None)
            except Exception as e:  # noqa: BLE001 - one broken source must not stop the rest
                if self.errors.get(src.name) != str(e):
                    self.log.exception("health source %s failed", src.name)
                self.errors[src.name] = f"{type(e).__name__}: {e}"
                continue
            before = self.last.get(src.name, {})
            for node, why in sorted(report.items()):
                if before.get(node) == why:
                    continue  # unchanged: an admin's undrain stands
                if ledger_nodes.mark_unhealthy(self.ledger, node, why, src.name,
                                               f"health:{src.name}", now):
                    self.log.warning("node %s unhealthy (%s): %s — draining", node, src.name,
                                     why)
                    changed.append(node)
            if src.auto_recover:
                for node, row in current.items():
                    if not row.healthy and row.source == src.name and node not in report:
                        if ledger_nodes.mark_healthy(self.ledger, node,
                                                     f"{src.name} no longer reports a problem",
                                                     src.name, f"health:{src.name}", now):
                            self.log.warning("node %s back in service: %s no longer reports "
                                             "a problem", node, src.name)
                            changed.append(node)
            self.last[src.name] = report
        return changed

    def close(self) -> None:
        for s in self.sources:
            try:
                s.close()
            except Exception:  # noqa: BLE001
                self.log.exception("closing health source %s", s.name)
