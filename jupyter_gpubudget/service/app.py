"""The gpubudget service application (run by JupyterHub as a managed service, or external)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import secrets
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

from tornado import httpserver, web
from traitlets import (
    Bool,
    Dict,
    Enum,
    Float,
    Integer,
    List,
    TraitError,
    Type,
    Unicode,
    default,
    validate,
)
from traitlets.config import Application

from jupyter_gpubudget.backends.base import Backend
from jupyter_gpubudget.backends.local import LocalBackend
from jupyter_gpubudget.core.accounts import AccountTree, BudgetError, Budgets, load_budgets
from jupyter_gpubudget.core.inventory import Inventory, load_inventory
from jupyter_gpubudget.core.model import Policy, Preempt, Start
from jupyter_gpubudget.inventory.nvml import load_inventory as discover_or_declared
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger.models import GrantRow, WorkloadRow

from . import budgets_copy
from .base import LEDGER_DOWN, ApiError
from .delivery import notice_delivery
from .handlers import routes
from .health import (
    CommandHealthSource,
    HealthMonitor,
    HealthSource,
    NvmlHealthSource,
)
from .leader import Lease, NotLeader
from .loop import SchedulingLoop
from .metrics import make_registry
from .preempt_warning import Outlooks, PreemptionWarner
from .reaper import reaper, reconcile_with_hub
from .resume import resumer
from .views import finite, grant_json


def load_tokens(path: str) -> dict[str, dict]:
    """``GpuBudgetService.tokens_file``: token -> {"name", "scopes"}; refused (OSError naming
    the problem) when others may read it or an entry is malformed."""
    st = os.stat(path)
    if st.st_mode & 0o077:
        raise OSError(f"{path}: readable by others (mode {st.st_mode & 0o777:o}); "
                      "chmod 600 it")
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as e:
        raise OSError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise OSError(f"{path}: expected an object of token: identity")
    out = {}
    for i, (token, ident) in enumerate(data.items()):
        if (len(token) < 16 or not isinstance(ident, dict)
                or not isinstance(ident.get("name"), str) or not ident["name"]
                or not isinstance(ident.get("scopes", []), list)):
            raise OSError(f"{path}: entry {i + 1}: a token of at least 16 characters mapping "
                          "to {\"name\": ..., \"scopes\": [...]}")
        out[token] = {"name": ident["name"], "kind": "user",
                      "scopes": [str(x) for x in ident.get("scopes", [])]}
    return out


def private_sqlite(url: str) -> None:
    """An SQLite ledger and its -wal/-shm files are readable by the service's user only
    (SQLite gives -wal/-shm the database file's mode): create the file 0600, or take group
    and other bits off an existing one."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return
    for suffix in ("", "-wal", "-shm"):
        p = Path(u.database + suffix)
        if suffix == "":
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o600))
        if p.exists() and p.stat().st_mode & 0o077:
            p.chmod(0o600)


def sqlite_single_process(url: str):  # noqa: ANN201 - an open file, or None
    """An SQLite ledger has one service process: a second one is refused (OSError saying
    so) instead of both scheduling the same GPUs. The lock is a ``flock`` of the ledger file
    itself — its inode, reached through ``os.path.realpath`` — so every spelling of it (a
    symlink, a hard link, ``x/../``) meets the same lock (SQLite's own locks are POSIX
    record locks, which ``flock`` does not touch). It goes with the process, whatever ends
    it: the file stays open for the process's lifetime. None for PostgreSQL (replicas share
    it through the leader lease, ``service/leader.py``)."""
    from sqlalchemy.engine import make_url

    from jupyter_gpubudget.ledger.db import normalise_url

    u = make_url(normalise_url(url))
    if u.get_backend_name() != "sqlite":
        return None
    if not u.database or u.database == ":memory:":
        return False
    real = os.path.realpath(u.database)
    fd = os.open(real, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    f = os.fdopen(fd, "rb+", buffering=0)
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        st = os.fstat(fd)
        f.close()
        named = u.database if real == u.database else f"{u.database} (the file {real})"
        raise OSError(f"{named}: another gpubudget service process uses this SQLite ledger "
                      f"(it holds a lock on the file, inode {st.st_ino} of device "
                      f"{st.st_dev}, under this or another name: a symlink or a hard link is "
                      "the same ledger). An SQLite ledger has one service process; to run "
                      "replicas (one leads, the others stand by) use PostgreSQL — "
                      "docs/service.md, 'Replicas'") from None
    return f


class GpuBudgetService(Application):
    name = "gpubudget-service"
    description = "GPU budget service: ledger, scheduling loop and REST API for JupyterHub."

    db_url = Unicode(help="Ledger database URL (SQLAlchemy). SQLite (WAL) by default; "
                     "postgresql://user:password@host/db is supported. Default: "
                     "$GPUBUDGET_DB_URL, else the contents of db_url_file, else "
                     "sqlite:///gpubudget.sqlite. Keep a password out of the command line "
                     "(JupyterHub logs a managed service's command): use the environment "
                     "variable or the file.").tag(config=True)
    db_url_file = Unicode("", help="A file (mode 0600, readable only by the service's user) "
                          "holding the ledger URL; used when GpuBudgetService.db_url and "
                          "$GPUBUDGET_DB_URL are not set.").tag(config=True)

    @default("db_url")
    def _db_url_default(self) -> str:
        if os.environ.get("GPUBUDGET_DB_URL"):
            return os.environ["GPUBUDGET_DB_URL"]
        if self.db_url_file:
            return Path(self.db_url_file).read_text().strip()
        return "sqlite:///gpubudget.sqlite"
    sqlite_synchronous = Unicode("FULL", help="SQLite PRAGMA synchronous (FULL survives power "
                                 "loss; NORMAL survives process crashes).").tag(config=True)
    budgets_file = Unicode("budgets.yaml", help="The budgets YAML: account tree, grants, "
                           "members, managers, admins, policy. Re-read when it changes."
                           ).tag(config=True)
    inventory_file = Unicode("inventory.yaml", help="Declared inventory YAML (nodes, GPUs, MIG)."
                             ).tag(config=True)
    inventory_source = Enum(["auto", "nvml", "declared"], "auto", help=(
        "Where the GPU inventory comes from: 'nvml' discovers this node's GPUs, MIG instances "
        "and NVLink through the NVIDIA driver; 'declared' reads inventory_file; 'auto' uses "
        "NVML when a driver is present and the declared file otherwise. The log says which."
    )).tag(config=True)
    dynamic_mig = Bool(False, help="Let the core carve MIG GPUs itself (any profile that "
                       "fits) instead of placing only on the MIG instances that exist (NVML's "
                       "layout, set by the admin, mig-parted or the GPU operator). The "
                       "instances are created for each job and destroyed after it by the "
                       "privileged launcher, whose root-owned config must say "
                       "\"dynamic_mig\": true too; the GPU must be in MIG mode already "
                       "(docs/backends.md). Off by default. A declared inventory says per GPU: a MIG GPU with a "
                       "'mig_layout' is fixed, one without is carved.").tag(config=True)
    cycle_interval = Float(10.0, help="Seconds between scheduling cycles when nothing happens "
                           "(events such as a submission trigger a cycle sooner)."
                           ).tag(config=True)
    event_delay = Float(0.05, help="Seconds to gather events before the cycle they trigger."
                        ).tag(config=True)
    ip = Unicode(help="Address to listen on (default: from JUPYTERHUB_SERVICE_URL, else "
                 "127.0.0.1).").tag(config=True)
    port = Integer(help="Port to listen on (default: from JUPYTERHUB_SERVICE_URL, else 10101)."
                   ).tag(config=True)
    service_prefix = Unicode(help="URL prefix (default: JUPYTERHUB_SERVICE_PREFIX or /)."
                             ).tag(config=True)
    service_name = Unicode(help="Service name in JupyterHub (default: JUPYTERHUB_SERVICE_NAME "
                           "or gpubudget).").tag(config=True)
    backend_class = Type(LocalBackend, klass=Backend, help="Backend that runs batch jobs."
                         ).tag(config=True)
    clusters = Dict(help=(
        "Several named clusters under one budget tree (docs/service.md, 'Several clusters'): "
        "cluster name -> {'backend': 'local' | 'slurm' | 'kubernetes' | a Backend class's "
        "import path, 'config': {that backend's settings}, 'inventory': a declared inventory "
        "file (for engines that do not report their nodes)}. Usage on every cluster is "
        "charged to the same accounts; a workload may name a cluster or start wherever it "
        "starts sooner. Empty (the default): one cluster, backend_class and inventory_file."
    )).tag(config=True)
    metrics_require_auth = Bool(True, help="Require a gpubudget admin token for /metrics."
                                ).tag(config=True)
    gil_switch_interval = Float(0.001, help="sys.setswitchinterval for the service: the "
                                "scheduling cycle runs in a thread; a short interval keeps "
                                "API latency low while a cycle runs.").tag(config=True)
    auth_cache_max_age = Integer(60, help="Seconds a token's identity is cached after the "
                                 "Hub confirmed it.").tag(config=True)
    config_file = Unicode("", help="Python config file to load.").tag(config=True)
    db_threads = Integer(4, help="Threads that run the API's ledger work (never the event "
                         "loop): a slow or locked ledger delays those requests, not the "
                         "service.").tag(config=True)
    ledger_busy_timeout = Float(5.0, help="Seconds a ledger write waits for a lock (SQLite) "
                                "before the request is answered 503 'ledger unavailable' with "
                                "Retry-After.").tag(config=True)
    checkpoint_interval = Float(30.0, help="Seconds between checkpoints of running work's "
                                "open charge intervals (one write of every running row): after "
                                "a crash of the service, a job found dead without an exit "
                                "record is charged up to its last checkpoint, so at most this "
                                "much of its tail is lost. 0: every cycle.").tag(config=True)
    forecast_interval = Float(60.0, help="Seconds at most between two forecasts of when "
                              "queued work starts (the core replays the queue forward; at "
                              "scale a whole replay costs about one cycle of CPU). Each "
                              "forecast is replayed in the background after the cycle that "
                              "made it, off the cycle, so quotes and the queue page find it "
                              "ready; one asked before that waits only for what it needs. "
                              "Leader and standby replicas both do it.").tag(config=True)
    forecast_min_interval = Float(2.0, help="Seconds at least between two forecasts when the "
                                  "queue or the running set changed: this bounds the CPU spent "
                                  "replaying forecasts in the background. Until the next "
                                  "forecast, quotes and the queue page read the last one."
                                  ).tag(config=True)
    preemption_notice_lead = Float(600.0, help="Seconds ahead of a likely preemption (the "
                                   "core's outlook: backed work queued that would take the "
                                   "slice, or a drain, once protection ends) at which the owner "
                                   "is told once: a notice in JupyterLab, by webhook and e-mail, "
                                   "and a batch job that asked for a warn_signal gets it. "
                                   "0: no warning.").tag(config=True)
    preempt_notice_time = Float(60.0, help="Seconds a preempted session's JupyterLab is "
                                "given before its server is stopped: the lab shows a warning "
                                "with the time left and a 'Save and release now' button; then "
                                "the spawner saves the kernels and stops the server. Never more "
                                "than half the policy's stop_grace (the other half is the "
                                "snapshot's). 0: stopped at once.").tag(config=True)
    preemption_outlook_horizon = Float(3600.0, help="Seconds ahead the preemption outlook "
                                       "looks (session and job JSON: preemption_forecast). It "
                                       "runs a scheduling cycle now, at each protection end "
                                       "within it (the earliest 4) and at its end: about 3 to "
                                       "7 cycles (bench/preempt_outlook.py).").tag(config=True)
    preemption_outlook_interval = Float(15.0, help="Seconds at least between two preemption "
                                        "outlooks when the queue, the running set or a node's "
                                        "health changed (at most forecast_interval otherwise); "
                                        "well below preemption_notice_lead, so a warning is at "
                                        "most this late.").tag(config=True)
    unhealthy_after_intervals = Float(3.0, help="/healthz answers 503 when no scheduling "
                                      "cycle succeeded for this many cycle intervals (plus 30 "
                                      "s).").tag(config=True)
    max_body_bytes = Integer(1024 * 1024, help="Largest request body accepted (bytes); a "
                             "larger one is answered 413. Each field has its own limit too "
                             "(docs/service.md, 'Limits').").tag(config=True)
    umask = Unicode("0077", help="The service process's umask (octal): the ledger (and its "
                    "-wal/-shm), logs and anything else it creates are private to its user."
                    ).tag(config=True)
    tokens_file = Unicode("", help="Without JupyterHub (Binder, a laptop): a JSON file, "
                          "readable only by the service's user, mapping tokens to who they "
                          "are: {\"<token>\": {\"name\": \"alice\", \"scopes\": "
                          "[\"custom:gpubudget:submit\"]}}. When set, only these tokens are "
                          "accepted and JupyterHub is never asked (no login cookie, no "
                          "settling of sessions with a hub). Empty: identities come from "
                          "JupyterHub.").tag(config=True)
    session_stale_after = Float(help="Seconds without a word from the hub about a session "
                                "(long-poll while queued, heartbeat while running) after which "
                                "the service ends it (default: $GPUBUDGET_SESSION_STALE_S or "
                                "300).").tag(config=True)

    snapshot_keep_last = Integer(3, help="Snapshots kept per session (the user's server "
                                 "deletes older ones after taking a new one; one that failed "
                                 "verification is kept and listed bad).").tag(config=True)
    snapshot_quota = Dict(value_trait=Integer(), per_key_traits=None, help="Bytes a "
                          "project's snapshots may occupy, by project name, e.g. "
                          "{'lattice': 50 * 2**30}: a new snapshot that would exceed it "
                          "deletes the project's oldest ones (never a session's newest), "
                          "or fails.").tag(config=True)
    snapshot_default_quota = Integer(0, help="Quota in bytes for projects not in "
                                     "snapshot_quota (0: none).").tag(config=True)
    resume_through_hub = Bool(True, help="Bring a preempted session's server back through "
                                        "the hub API once it is requeued (the service's hub "
                                        "token needs the `servers` scope), and stop a "
                                        "hibernated server there at once.").tag(config=True)

    @validate("umask")
    def _check_umask(self, proposal: dict) -> str:
        try:
            if 0 <= int(proposal["value"], 8) <= 0o777:
                return proposal["value"]
        except ValueError:
            pass
        raise TraitError(f"umask: expected an octal string such as '0077', "
                         f"got {proposal['value']!r}")

    @default("session_stale_after")
    def _stale(self) -> float:
        try:
            return max(1.0, float(os.environ.get("GPUBUDGET_SESSION_STALE_S", "300")))
        except ValueError:
            return 300.0

    health_sources = List(Type(klass=HealthSource), [NvmlHealthSource],
                          help="Where node health comes from besides the backend's own view "
                          "of its nodes (read every cycle) and admins (classes, or their "
                          "import names): NvmlHealthSource (this machine's GPUs: XID errors, "
                          "retired/remapped memory, ECC, temperature, a GPU off the bus), "
                          "CommandHealthSource (your own script per node), or a subclass of "
                          "jupyter_gpubudget.service.health.HealthSource. An unhealthy node "
                          "gets nothing new and drains. Admins drain and undrain nodes on "
                          "the Nodes page or with PUT /nodes/{name}/health."
                          ).tag(config=True)
    health_interval = Float(30.0, help="Seconds between health checks of every source."
                            ).tag(config=True)
    busy_interval = Float(30.0, help="Seconds between samples of how busy the running "
                          "workloads' GPUs on this machine are (NVML: device utilisation, "
                          "MIG GPM samples, per-process utilisation of MPS shares), kept as "
                          "busy GPU-hours for usage reports; 0: no sampling (busy time is "
                          "then reported unknown).").tag(config=True)
    busy_nvml_module = Unicode("pynvml", help="Module providing the NVML API for busy "
                               "sampling (nvidia-ml-py's 'pynvml'); a stand-in for tests."
                               ).tag(config=True)
    busy_node = Unicode("", help="The inventory node whose GPUs this machine's NVML reports, "
                        "for busy sampling and the sidebar's GPU memory (default: this "
                        "machine's host name; set it where the inventory names the node "
                        "otherwise).").tag(config=True)
    usage_history_days = Float(400.0, help="Days of hourly usage history (charged and busy "
                               "GPU time per project and per user) kept for usage reports, "
                               "well past the usage window.").tag(config=True)
    session_utilisation_max_age = Float(600.0, help="Seconds a session's reported GPU "
                                        "utilisation stays in /metrics without a newer "
                                        "report.").tag(config=True)

    replica_url = Unicode("", help="Where this replica answers, as other replicas and clients "
                          "should reach it (e.g. http://10.0.0.5:10101/services/gpubudget/): "
                          "a standby names the leader's in its not_leader answers. Default: "
                          "http://<ip>:<port><service_prefix>.").tag(config=True)
    replica_id = Unicode("", help="This replica's name in the lease (default: "
                         "<hostname>:<port>). The same replica restarted after a crash takes "
                         "its lease back at once (with a new fencing token) instead of "
                         "waiting for it to run out; give every replica its own.").tag(config=True)
    lease_seconds = Float(8.0, help="PostgreSQL ledger: how long the leader's lease lasts "
                          "without renewal. A standby takes over this long after the leader "
                          "died or lost the database (plus at most lease_renew_interval). "
                          "Several service processes may share one PostgreSQL ledger; one "
                          "leads (docs/service.md, 'Replicas').").tag(config=True)
    lease_renew_interval = Float(2.0, help="Seconds between two renewals of the leader's "
                                 "lease (standbys try to take it as often).").tag(config=True)
    follow_interval = Float(1.0, help="A standby replica reads the ledger again this often "
                            "(seconds): what its read endpoints answer lags the leader by at "
                            "most this much.").tag(config=True)
    max_clock_offset = Float(1.0, help="PostgreSQL ledger: the most seconds this replica's "
                             "clock may differ from the database's. Charges and protection "
                             "are timed by the leader's clock, the lease by the database's: "
                             "a replica further off (measured at every lease renewal) does "
                             "not lead, and says why in its log and /healthz.").tag(config=True)
    budgets_from_ledger = Bool(False, help="PostgreSQL ledger: replicas agree on one budgets "
                               "file, whose copy the ledger keeps with the lease. A replica "
                               "started with another file (another digest) refuses to start; "
                               "with this set, it follows the ledger's copy instead (its own "
                               "file is ignored, and logged as such).").tag(config=True)

    classes = [LocalBackend, NvmlHealthSource, CommandHealthSource]
    aliases = {"config": "GpuBudgetService.config_file", "db": "GpuBudgetService.db_url",
               "budgets": "GpuBudgetService.budgets_file",
               "inventory": "GpuBudgetService.inventory_file",
               "inventory-source": "GpuBudgetService.inventory_source",
               "port": "GpuBudgetService.port", "ip": "GpuBudgetService.ip",
               "cycle-interval": "GpuBudgetService.cycle_interval",
               "jobs-dir": "LocalBackend.state_dir", "db-url-file": "GpuBudgetService.db_url_file"}

    @default("log_level")
    def _log_level(self) -> int:
        return logging.INFO

    @default("ip")
    def _ip(self) -> str:
        url = os.environ.get("JUPYTERHUB_SERVICE_URL")
        return (urlparse(url).hostname or "127.0.0.1") if url else "127.0.0.1"

    @default("port")
    def _port(self) -> int:
        url = os.environ.get("JUPYTERHUB_SERVICE_URL")
        return (urlparse(url).port or 80) if url else 10101

    @default("service_prefix")
    def _prefix(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")

    @default("service_name")
    def _sname(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_NAME", "gpubudget")

    clock = staticmethod(time.time)

    # ------------------------------------------------------------------ set-up
    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        if self.config_file:
            self.load_config_file(self.config_file)
        os.umask(int(self.umask, 8))
        self.budgets = self._load_budgets()
        #: the digest of the budgets in force: the file's, or the ledger's copy this replica
        #: follows (``service/budgets_copy.py``)
        self.budgets_digest = budgets_copy.digest(self._budgets_bytes)
        self._budgets_mtime = self._mtime()
        if self.clusters:  # several clusters: one backend each, one merged inventory
            from .clusters import build

            self.backend, self.inventory, self.inventory_message = build(self, self.clusters)
            self.backend.locate = self._cluster_of_workload  # type: ignore[attr-defined]
            engine_inventory = None
        else:
            self.backend = self.backend_class(parent=self, log=self.log)
            engine_inventory = self.backend.discover_inventory()  # Slurm, Kubernetes
        if self.clusters:
            pass  # the merged inventory of every cluster, built above
        elif engine_inventory is not None:
            self.inventory = engine_inventory
            self.inventory_message = f"nodes of the {self.backend.name} backend"
        elif self.inventory_source == "declared":
            self.inventory: Inventory = load_inventory(Path(self.inventory_file).read_text(),
                                                       self.inventory_file)
            self.inventory_message = f"declared inventory {self.inventory_file}"
        else:
            self.inventory, self.inventory_message = discover_or_declared(
                None if self.inventory_source == "nvml" else self.inventory_file,
                dynamic_mig=self.dynamic_mig)
        self.log.info("gpubudget inventory: %s (%d GPUs)", self.inventory_message,
                      self.inventory.gpu_count)
        self.backend.use_inventory(self.inventory)
        private_sqlite(self.db_url)
        self._sqlite_lock = sqlite_single_process(self.db_url)
        upgrade(self.db_url)  # Alembic migrations on every start (a no-op when current)
        self.engine = connect(self.db_url, sqlite_synchronous=self.sqlite_synchronous,
                              busy_timeout=self.ledger_busy_timeout)
        read_engine = (connect(self.db_url, read_only=True)
                       if self.engine.url.get_backend_name() == "sqlite" else self.engine)
        self.ledger = Ledger(self.engine, read_engine)
        #: PostgreSQL: which replica leads (None on SQLite: one process, it leads)
        self.lease: Lease | None = None
        self.leading: int | None | bool = False  # the token we lead with (True: no lease)
        self._role_event: asyncio.Event | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._leader_tasks: list[asyncio.Task] = []
        if self._sqlite_lock is None:
            self.lease = Lease(connect(self.db_url, busy_timeout=self.ledger_busy_timeout,
                                       pool_size=1),
                               url=self.replica_url or self._own_url(),
                               holder=self.replica_id or f"{socket.gethostname()}:{self.port}",
                               ttl=self.lease_seconds,
                               renew_interval=self.lease_renew_interval, log=self.log,
                               on_change=self._lease_changed, clock=self.clock,
                               max_clock_offset=self.max_clock_offset)
            self.ledger.fence = self.lease.check
            self.lease.tick()  # the first replica up leads from the start
            self._agree_on_budgets()
        if self.lease is None or self.lease.is_leader:
            self._sync_budgets()
        self.loop = self._new_loop()
        self.registry, self.cycle_hist, self.wait_hist = make_registry(self)
        self.health_monitor = HealthMonitor(
            self.ledger, [cls(parent=self, log=self.log, backend=self.backend,
                              inventory=self.inventory) for cls in self.health_sources],
            nodes=lambda: [n.name for n in self.inventory.nodes], clock=self.clock,
            log=self.log)
        self.health_pool = ThreadPoolExecutor(1, thread_name_prefix="gpubudget-health")
        #: session -> (GPU utilisation %, when, user, project), from the hub's idle sampler
        self.session_util: dict[str, tuple[float, float, str, str]] = {}
        self.busy_sampler: object | None = None  # inventory.busy.BusySampler, while it samples
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="gpubudget-cycle")
        self.db_pool = ThreadPoolExecutor(self.db_threads, thread_name_prefix="gpubudget-db")
        self._ledger_error: tuple[float, str] | None = None
        self._ledger_probe: asyncio.Future | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._change = asyncio.Event()
        self.ledger.on_write = self._ledger_wrote
        self.api_prefix = self.service_prefix.rstrip("/") + "/api/v1"
        from jupyterhub.services.auth import HubOAuth

        # the login cookie is not sent with cross-site requests (XSRF is checked as well)
        cookie_options = {"samesite": "Lax",
                          **json.loads(os.environ.get("JUPYTERHUB_COOKIE_OPTIONS") or "{}")}
        self.hub_auth = HubOAuth(parent=self, cache_max_age=self.auth_cache_max_age,
                                 cookie_options=cookie_options)
        self._kick_event: asyncio.Event | None = None
        self.session_seen: dict[str, float] = {}  # session -> last word from the hub
        self.local_tokens = load_tokens(self.tokens_file) if self.tokens_file else None
        if self.local_tokens is not None:
            self.log.info("identities from %s (%d tokens); JupyterHub is not asked",
                          self.tokens_file, len(self.local_tokens))
        self._resume_event = asyncio.Event()
        self.hub_done: set[str] = set()  # hub work of resumer() already done

    def _cluster_of_workload(self, wid: str) -> str | None:
        """The cluster a workload started on, as the ledger recorded it."""
        row = self.ledger.get(wid)
        return row.cluster if row is not None else None

    def _own_url(self) -> str:
        host = self.ip if self.ip not in ("", "0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}{self.service_prefix}"

    def _new_loop(self) -> SchedulingLoop:
        """A scheduling loop with nothing cached: every replica that takes over reads the
        ledger afresh (the previous leader wrote it, not this process)."""
        loop = SchedulingLoop(self.ledger, self.tree, self.inventory, self.policy,
                              self.backend, log=self.log, clock=self.clock,
                              on_cycle=lambda s: self.cycle_hist.observe(s),
                              on_start=lambda row, now: self.wait_hist.labels(
                                  row.kind).observe(max(0.0, now - row.submitted_at)))
        loop.forecast_interval = self.forecast_interval
        loop.checkpoint_interval = self.checkpoint_interval
        loop.forecast_min_interval = self.forecast_min_interval
        loop.outlooks = Outlooks(horizon=max(self.preemption_outlook_horizon,
                                             self.preemption_notice_lead),
                                 interval=max(self.forecast_interval,
                                              self.preemption_outlook_interval),
                                 min_interval=self.preemption_outlook_interval)
        loop.warner = PreemptionWarner(self.ledger, self.preemption_notice_lead,
                                       notify=self._warn_job, log=self.log)
        old = getattr(self, "loop", None)
        if old is not None:
            loop.view = old.view
            loop.last_ok_at = old.last_ok_at
        return loop

    def _warn_job(self, row: WorkloadRow, signal_name: str) -> str | None:
        """Send a running batch job its ``warn_signal`` (the engine's ``notify``)."""
        notify = getattr(self.backend, "notify", None)
        if notify is None or row.backend != self.backend.name:
            return f"the {row.backend} backend does not send signals ahead"
        iv = self.ledger.open_interval(row.id)
        return notify(row.id, iv.seq, signal_name) if iv is not None else "not running"

    @property
    def is_leader(self) -> bool:
        """This replica leads (always, on SQLite) and has taken over (reconciled)."""
        return self.leading is not False and (self.lease is None or self.lease.is_leader)

    def not_leader(self) -> NotLeader:
        url = self.lease.leader_url() if self.lease is not None else None
        return NotLeader("this gpubudget service replica is a standby: send writes to the "
                         "leader" + (f" ({url})" if url else " (none leads right now; retry "
                                     "in a few seconds)"), url)

    def _lease_changed(self, token: int | None) -> None:
        """From the lease's thread: the role changes on the event loop (:meth:`_roles`)."""
        aloop, ev = self._aloop, self._role_event
        if aloop is not None and ev is not None and not aloop.is_closed():
            try:
                aloop.call_soon_threadsafe(ev.set)
            except RuntimeError:  # shutting down
                pass

    def _mtime(self) -> float:
        try:
            return os.stat(self.budgets_file).st_mtime
        except OSError:
            return 0.0

    def _load_budgets(self) -> Budgets:
        data = Path(self.budgets_file).read_bytes()
        budgets = load_budgets(data, self.budgets_file)
        self._budgets_bytes = data  # this replica's file, as last read
        return budgets

    def _budgets_source(self) -> str:
        holder = self.lease.holder if self.lease is not None else ""
        return f"{Path(self.budgets_file).absolute()} on replica {holder}"

    def _sync_budgets(self) -> None:
        """Mirror this replica's file into the ledger (it leads); with replicas, its copy
        goes with the lease in the same transaction."""
        copy = None
        if self.lease is not None:
            copy = (budgets_copy.digest(self._budgets_bytes), self._budgets_source(),
                    self._budgets_bytes.decode())
            self.budgets_digest = copy[0]
        self.ledger.sync_budgets(self.budgets, self.clock(), Path(self.budgets_file).name,
                                 copy=copy)

    def _follow_copy(self, copy: budgets_copy.Copy) -> None:
        """Authorise and schedule by the ledger's copy of the budgets file."""
        if copy.digest != self.budgets_digest:
            self.budgets = load_budgets(copy.text, f"the ledger's copy of {copy.source}")
            self.budgets_digest = copy.digest

    def _agree_on_budgets(self) -> None:
        """At start, with replicas: a leader's file is the one they agree on (it writes it);
        a standby with another file than the ledger's copy refuses to start, or follows the
        copy with ``budgets_from_ledger``."""
        assert self.lease is not None
        copy = budgets_copy.read(self.ledger)
        mine = budgets_copy.digest(self._budgets_bytes)
        if copy is None or copy.digest == mine:
            return
        if self.lease.is_leader:
            self.log.warning("budgets file %s (sha256 %s) replaces the ledger's copy: %s "
                             "(sha256 %s)", self.budgets_file, mine, copy.source, copy.digest)
            return
        message = budgets_copy.disagree_message(str(Path(self.budgets_file).absolute()),
                                                mine, copy)
        if not self.budgets_from_ledger:
            raise budgets_copy.BudgetsDisagree(message)
        self.log.warning("%s: following the ledger's copy (budgets_from_ledger)",
                         message.split(". Give")[0])
        self._follow_copy(copy)

    def _take_over_budgets(self) -> None:
        """Taking over: the ledger's copy stays what every replica agreed on. Only when it
        is this replica's own file (or there is none) is the file mirrored — which rewrites
        nothing an admin set through the API."""
        copy = budgets_copy.read(self.ledger)
        mine = budgets_copy.digest(self._budgets_bytes)
        if copy is not None and copy.digest != mine:
            self.log.error("%s: leading with the ledger's copy; nothing of this replica's "
                           "file is written", budgets_copy.disagree_message(
                               str(Path(self.budgets_file).absolute()), mine, copy)
                           .split(". Give")[0])
            self._follow_copy(copy)
            return
        if self.budgets_digest != mine:  # it followed another copy, now its own file's
            self.budgets = load_budgets(self._budgets_bytes, self.budgets_file)
        self._sync_budgets()

    def follow_budgets(self) -> None:
        """A standby: the ledger's copy of the budgets file, as the leader last wrote it."""
        copy = budgets_copy.read(self.ledger)
        if copy is not None:
            self._follow_copy(copy)

    def tree(self) -> AccountTree:
        """The budgets file's tree, re-read when the file changed (a bad edit is logged and
        the previous tree stays in force). With replicas, a standby's tree is the ledger's
        copy (:meth:`follow_budgets`): its own file counts only once it leads."""
        m = self._mtime()
        if m != self._budgets_mtime:
            self._budgets_mtime = m
            try:
                budgets = self._load_budgets()
                if self.lease is None or self.is_leader:
                    self.budgets = budgets
                    self.budgets_digest = budgets_copy.digest(self._budgets_bytes)
                    if self.is_leader:  # (a standby's ledger is the leader's to write)
                        self._sync_budgets()
                self.log.info("reloaded %s%s", self.budgets_file, "" if self.is_leader else
                              " (a standby: the ledger's copy stays in force)")
            except (OSError, BudgetError) as e:
                self.log.error("budgets file not reloaded: %s", e)
            except NotLeader as e:  # it stepped down meanwhile: the new leader syncs it
                self.log.info("budgets file not synced to the ledger: %s", e.message)
        return self.budgets.accounts

    def policy(self) -> Policy:
        """The budgets file's policy, reloaded with the file (one policy for everything: the
        scheduling loop, quotes, caps)."""
        self.tree()
        return self.budgets.policy

    def check_placement(self, placement: list[dict]) -> None:
        for i, s in enumerate(placement):
            try:
                node = self.inventory.node(str(s.get("node")))
            except KeyError:
                raise ApiError(400, f"placement[{i}].node: unknown node {s.get('node')!r}",
                               f"placement[{i}].node") from None
            gpu = s.get("gpu", -1)
            if not isinstance(gpu, int) or isinstance(gpu, bool) or not -1 <= gpu < len(node.gpus):
                raise ApiError(400, f"placement[{i}].gpu: no GPU {gpu!r} on {node.name}",
                               f"placement[{i}].gpu")

    # ------------------------------------------------------------------ figures
    def account_json(self, name: str, g: GrantRow | None) -> dict:
        a = self.tree().get(name)
        st = self.loop.view.standings.get(name, {})
        return {"name": name, "parent": a.parent, "project": not a.children,
                "children": list(a.children), "members": sorted(a.members),
                "managers": sorted(a.managers), "grant": grant_json(g),
                "usage_hours": finite(st.get("usage_hours")),
                "effective_grant_hours": finite(st.get("grant_hours")),
                "standing": finite(st.get("standing"))}

    def usage_json(self, name: str) -> dict:
        tree = self.tree()
        v = self.loop.view
        st = v.standings.get(name, {})
        below = {p for p in tree.projects() if name in tree.path(p)}
        running = sum(n for (p, _), n in v.running.items() if p in below)
        pending = sum(n for (p, _), n in v.pending.items() if p in below)
        return {"account": name, "usage_hours": finite(st.get("usage_hours")),
                "grant_hours": finite(st.get("grant_hours")),
                "standing": finite(st.get("standing")),
                "window_s": self.budgets.policy.window, "half_life_s": self.budgets.policy.half_life,
                "running": running, "pending": pending,
                "preemptions": sum(n for p, n in v.preemptions.items() if p in below),
                "computed_at": v.at}

    # ------------------------------------------------------------------ health
    def ledger_failed(self, reason: str) -> None:
        self._ledger_error = (self.clock(), reason)

    def ledger_ok(self) -> None:
        self._ledger_error = None

    def probe_ledger(self) -> None:
        """While the ledger is reported unavailable, try a write transaction (nothing is
        written) on the API's database threads: when it goes through, the ledger is usable
        again and /healthz says so within a cycle — not only once some request happens to
        write (a released lock, a database back up). One probe at a time."""
        failed = self._ledger_error
        if failed is None or (self._ledger_probe is not None and not self._ledger_probe.done()):
            return

        async def probe() -> None:
            try:
                await asyncio.get_running_loop().run_in_executor(self.db_pool,
                                                                 self.ledger.writable)
            except LEDGER_DOWN as e:
                self.log.debug("ledger still unavailable: %s", e)
                return
            if self._ledger_error is failed:  # no newer failure while the probe ran
                self.log.info("ledger usable again (was: %s)", failed[1])
                self.ledger_ok()

        self._ledger_probe = asyncio.ensure_future(probe())

    def health(self) -> tuple[bool, list[str]]:
        """(healthy, reasons): a failing or stale scheduling cycle, or an unavailable ledger,
        makes the service unhealthy."""
        reasons = []
        now = self.clock()
        loop = self.loop
        if loop.last_error is not None:
            reasons.append(f"scheduling cycle failing ({loop.failed_cycles} so far): "
                           f"{loop.last_error}")
        limit = self.unhealthy_after_intervals * self.cycle_interval + 30
        if not self.is_leader:  # a standby does not schedule; it must reach the ledger
            if self.lease is not None and (self.lease.leader is None
                                           or self.lease.last_ok is None
                                           or time.monotonic() - self.lease.last_ok > limit):
                reasons.append("standby replica: the ledger's lease cannot be read")
        elif loop.last_ok_at is None or now - loop.last_ok_at > limit:
            since = "ever" if loop.last_ok_at is None else f"{now - loop.last_ok_at:.0f} s"
            reasons.append(f"no successful scheduling cycle for {since}")
        if self._ledger_error is not None:
            reasons.append(f"ledger unavailable: {self._ledger_error[1]}")
        if self.lease is not None and self.lease.clock_problem is not None:
            reasons.append(self.lease.clock_problem)
        return not reasons, reasons

    # ------------------------------------------------------------------ changes
    def _ledger_wrote(self) -> None:
        """Called from any thread after this process wrote to the ledger: wake long-polls."""
        aloop = self._aloop
        if aloop is not None and not aloop.is_closed():
            try:
                aloop.call_soon_threadsafe(self._fire_change)
            except RuntimeError:  # the loop is shutting down
                pass

    def _fire_change(self) -> None:
        ev, self._change = self._change, asyncio.Event()
        ev.set()

    async def wait_for_change(self, timeout: float) -> bool:
        """Wait until the ledger changes (True) or ``timeout`` passes (False)."""
        try:
            await asyncio.wait_for(self._change.wait(), timeout)
            return True
        except TimeoutError:
            return False

    def snapshot_quota_of(self, project: str) -> int:
        return int(self.snapshot_quota.get(project, self.snapshot_default_quota))

    def wake_resumer(self) -> None:
        """A session was requeued or hibernated: see to its server at the hub soon."""
        aloop = self._aloop
        if aloop is not None and not aloop.is_closed():
            aloop.call_soon_threadsafe(self._resume_event.set)

    # ------------------------------------------------------------------ running
    def kick(self) -> None:
        """Something happened: run a cycle soon."""
        if self._kick_event is not None:
            self._kick_event.set()

    async def _timer(self) -> None:
        aloop = asyncio.get_running_loop()
        assert self._kick_event is not None
        while True:
            try:
                await asyncio.wait_for(self._kick_event.wait(), self.cycle_interval)
                await asyncio.sleep(self.event_delay)
            except TimeoutError:
                pass
            self._kick_event.clear()
            self.probe_ledger()
            try:
                decisions = await aloop.run_in_executor(self.worker, self.loop.cycle)
            except NotLeader as e:
                self.log.warning("scheduling cycle refused: %s", e.message)
                continue
            except Exception:
                self.log.exception("scheduling cycle failed")
                continue
            cap = self.policy().max_starts_per_cycle
            if any(isinstance(d, Preempt) for d in decisions) or cap and sum(
                    isinstance(d, Start) for d in decisions) >= cap:
                # requeued work may start elsewhere at once; the cycle decided all the Starts
                # the policy lets one decide: the rest need the next one, now
                self.kick()
            try:  # bookings whose window ended (or that were cancelled): their idle part
                await aloop.run_in_executor(self.worker, self.charge_bookings)
            except NotLeader:
                continue
            except Exception:  # noqa: BLE001 - charged by a later cycle
                self.log.exception("charging the idle part of bookings failed")

    def charge_bookings(self) -> list[str]:
        """Charge the idle part of the bookings whose window is over or that were cancelled
        (policy ``reservation_idle_charge``; ``ledger/bookings.py``)."""
        from ..ledger.bookings import charge_idle

        done = charge_idle(self.ledger, self.clock(), self.policy().reservation_idle_charge)
        for bid in done:
            self.log.info("booking %s: its idle part charged", bid)
        return done

    async def _health_timer(self) -> None:
        """Poll the health sources (on their own thread); a change triggers a cycle."""
        aloop = asyncio.get_running_loop()
        while True:
            try:
                changed = await aloop.run_in_executor(self.health_pool, self.health_monitor.poll)
            except Exception:  # noqa: BLE001 - the ledger may be busy: try again later
                self.log.exception("health check failed")
                changed = []
            if changed:
                self.kick()
            await asyncio.sleep(self.health_interval)

    async def _busy_timer(self) -> None:
        """Sample how busy the running workloads' GPUs on this machine are (on the health
        thread) and prune usage history past ``usage_history_days`` (``inventory/busy.py``)."""
        import importlib

        from jupyter_gpubudget.inventory.busy import BusySampler, running_here, sample_into

        node = self.busy_node or socket.gethostname()
        sampler: BusySampler | None = None
        if self.busy_interval > 0 and node in {n.name for n in self.inventory.nodes}:
            try:
                sampler = BusySampler(importlib.import_module(self.busy_nvml_module),
                                      node=node, max_gap=max(300.0, 3 * self.busy_interval))
                self.busy_sampler = sampler  # its latest memory readings: the sidebar's
            except ImportError as e:
                self.log.info("busy sampling off: %s (busy GPU time is reported unknown)", e)
        else:
            self.log.info("busy sampling off: %s (busy GPU time is reported unknown)",
                          "busy_interval is 0" if self.busy_interval <= 0 else
                          f"this machine ({node}) is not a node of the inventory")
        pruned = [0.0]

        def tick() -> None:
            now = self.clock()
            if sampler is not None and sampler.off is None:
                sample_into(self.ledger, sampler, lambda: running_here(self.ledger,
                                                                       self.backend), now)
                if sampler.off is not None:
                    self.log.info("busy sampling off: %s (busy GPU time is reported "
                                  "unknown)", sampler.off)
            elif self.busy_interval > 0 and (engine := getattr(self.backend, "busy_now",
                                                               None)) is not None:
                # where no NVML here samples: the engine's own readings (Kubernetes: the
                # DCGM exporter's, backends/k8s_busy.py)
                samples = engine([(r.workload, r.started_at)
                                  for r in running_here(self.ledger)], now)
                if samples:
                    self.ledger.record_busy(samples)
            if now - pruned[0] > 3600:
                self.ledger.prune_usage_history(now - self.usage_history_days * 86400)
                pruned[0] = now

        aloop = asyncio.get_running_loop()
        while True:
            try:
                await aloop.run_in_executor(self.health_pool, tick)
            except Exception:  # noqa: BLE001 - the ledger may be busy: try again later
                self.log.exception("busy sampling failed")
            await asyncio.sleep(self.busy_interval if self.busy_interval > 0 else 3600)

    def make_app(self) -> web.Application:
        secret = os.environ.get("JUPYTERHUB_COOKIE_SECRET") or secrets.token_hex(32)
        return web.Application(routes(self.service_prefix, self),
                               log_function=self._log_req, cookie_secret=secret,
                               hub_auth=self.hub_auth)

    def _log_req(self, handler: web.RequestHandler) -> None:
        status = handler.get_status()
        quiet = getattr(handler, "quiet_503", False)  # a standby's answer, not a failure
        log = self.log.warning if status >= 500 and not quiet else self.log.debug
        log("%d %s %s %.1fms", status, handler.request.method, handler.request.uri,
            1000 * handler.request.request_time())

    async def serve(self) -> None:
        sys.setswitchinterval(self.gil_switch_interval)
        self._kick_event = asyncio.Event()
        self._change = asyncio.Event()
        self._role_event = asyncio.Event()
        aloop = self._aloop = asyncio.get_running_loop()
        self.backend.on_exit = lambda: aloop.call_soon_threadsafe(self.kick)
        self.backend.use_ledger(self.ledger)
        if self.lease is None or self.lease.is_leader:
            await self._lead()
        server = httpserver.HTTPServer(self.make_app(), xheaders=True,
                                       max_body_size=max(64 << 20, self.max_body_bytes))
        server.listen(self.port, self.ip)
        self.log.info("gpubudget service on http://%s:%d%s (ledger %s)%s", self.ip, self.port,
                      self.service_prefix, self.engine.url.render_as_string(hide_password=True),
                      "" if self.lease is None else
                      f" as {'leader' if self.is_leader else 'standby'} replica "
                      f"{self.lease.holder}")
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            aloop.add_signal_handler(sig, stop.set)
        roles = asyncio.create_task(self._roles()) if self.lease is not None else None
        if self.lease is not None:
            self.lease.start()
        await stop.wait()
        if roles is not None:
            roles.cancel()
        self._stand_by()
        if self.lease is not None:  # a standby takes over at once, not when it runs out
            await aloop.run_in_executor(None, self.lease.stop)
        self.health_pool.submit(self.health_monitor.close)
        server.stop()
        self.log.info("stopping (running jobs keep running and are found again on restart)")

    async def _lead(self) -> None:
        """Take over: fence the node's launcher with the new token, read the ledger afresh,
        adopt what runs (``SchedulingLoop.reconcile``: running jobs are found through the
        launcher's records, not restarted), then schedule."""
        aloop = asyncio.get_running_loop()
        token = self.lease.token if self.lease is not None else None
        if self.lease is not None:
            self.loop = self._new_loop()
            self.ledger.others_wrote()
            try:
                await aloop.run_in_executor(self.worker, self.backend.fence, token)
                await aloop.run_in_executor(None, self._take_over_budgets)
            except NotLeader:
                return
            except Exception:  # noqa: BLE001 - the lease thread decides again
                self.log.exception("taking over failed")
                return
        self.leading = True if token is None else token
        try:
            await aloop.run_in_executor(self.worker, self.loop.reconcile)
        except NotLeader:
            self.leading = False
            return
        try:
            await aloop.run_in_executor(self.worker, self.loop.cycle)
        except Exception:  # reported by /healthz; the timer keeps trying
            self.log.exception("first scheduling cycle failed")
        self._resume_event = asyncio.Event()
        tasks = [self._timer(), reaper(self), self._health_timer(), self._busy_timer(),
                 notice_delivery(self)]  # (a webhook or relay that fails delays nothing else)
        if self.local_tokens is None:
            tasks.append(reconcile_with_hub(self))
            if self.resume_through_hub:  # a requeued session's server comes back through the hub
                tasks.append(resumer(self))
        self._leader_tasks = [asyncio.create_task(t) for t in tasks]

    def _stand_by(self) -> None:
        """Stop leading: no cycle, no reaping, no writes (the lease says who leads)."""
        self.leading = False
        for t in self._leader_tasks:
            t.cancel()
        self._leader_tasks = []

    async def _roles(self) -> None:
        """Follow the lease: lead when it is ours, stand by otherwise; while standing by,
        read the ledger again every ``follow_interval`` s for the read endpoints."""
        assert self.lease is not None and self._role_event is not None
        aloop = asyncio.get_running_loop()
        while True:
            try:
                await asyncio.wait_for(self._role_event.wait(), self.follow_interval)
            except TimeoutError:
                pass
            self._role_event.clear()
            token = self.lease.token if self.lease.is_leader else None
            if self.leading is not False and self.leading != token:
                self._stand_by()
            if token is not None and self.leading is False:
                await self._lead()
            elif token is None:
                try:
                    await aloop.run_in_executor(self.worker, self.follow_budgets)
                    await aloop.run_in_executor(self.worker, self.loop.follow)
                except Exception as e:  # noqa: BLE001 - the database may be away
                    self.log.info("standby: reading the ledger failed: %s", e)

    def start(self) -> None:
        asyncio.run(self.serve())


def main(argv: list[str] | None = None) -> None:
    app = GpuBudgetService()
    try:
        app.initialize(argv)
    except (BudgetError, OSError, budgets_copy.BudgetsDisagree) as e:
        print(f"gpubudget service: {e}", file=sys.stderr)
        sys.exit(2)
    app.start()


if __name__ == "__main__":
    main()
