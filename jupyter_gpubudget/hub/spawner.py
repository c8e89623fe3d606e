"""BudgetSpawner: a JupyterHub spawner that queues a session in the gpubudget service, waits for
the scheduler to grant it a slice, then starts the server through a wrapped backend spawner.

- The spawn form (``form.py``) offers the user's projects, the slices the inventory can offer
  (whole GPUs, MIG profiles, MPS shares, CPU only), ``min_runtime`` (capped by policy), and for
  each choice a quote: predicted start, protected time, GPU-hour cost, backed or not.
- ``user_options`` for scripted spawns (``POST /hub/api/users/{name}/server``):
  ``{"project": "lattice-qcd", "slice": "gpu:1" | "mig:1g.10gb" | "1g.10gb" | "mps:250" |
  "cpu", "gpus": 2, "min_runtime": "2h"}``.
- While queued (``queue.py``), progress events report the queue position and predicted start;
  the wait ends with a clear message after ``max_queue_wait``.
- The granted placement reaches the backend spawner (``child.py``): for local processes
  ``CUDA_VISIBLE_DEVICES`` = GPU or MIG UUIDs and MPS variables. An MPS share on a real GPU
  holds that GPU's MPS control daemon while the server runs (``mps.py``).
- While the server runs (``watch.py``): heartbeats, preemption, idle detection. Stop, cull,
  preemption and a server that exits all end the charge.
- Snapshots (``restore.py``): before a preemption stops the server its kernels are saved and
  the session is requeued to resume from them; an idle session may hibernate
  (``idle_action``); ``user_options = {"resume": <session>}`` (the service's own spawn of a
  requeued session) or ``{"restore": <snapshot>}`` start the server from a snapshot, and a
  hibernated server comes back from its snapshot when its owner starts it again. The server
  restores its kernels before the spawn completes (progress: "Restoring your kernels...").
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any
from urllib.parse import quote as urlquote

from jupyterhub.spawner import LocalProcessSpawner, Spawner
from tornado import web
from traitlets import Any as AnyTrait
from traitlets import Bool, Dict, Enum, Float, List, TraitError, Type, Unicode, default, validate

from jupyter_gpubudget.backends.mps import CONTROL
from jupyter_gpubudget.service.validate import Invalid, duration

from . import mig, mps, queue, restore, watch
from .child import ClusterSpawnerError, check_cluster_spawners, configure_child, construct_child
from .client import ServiceClient, ServiceError
from .form import ChoiceRefused, in_booking, refuse_in_one_line, render_form
from .handlers import QUOTE_ROUTE
from .placement import describe, placement_env

__all__ = ["BudgetSpawner", "ServiceError", "normalise_slice"]


#: what ``user_options`` may hold; anything else is refused, naming it (an option the
#: spawner ignored would start something other than what was asked: a CPU session)
USER_OPTIONS = ("project", "slice", "gpus", "min_runtime", "cluster", "resume", "restore")


def check_user_options(opts: dict) -> None:
    unknown = sorted(str(k) for k in opts if k not in USER_OPTIONS)
    if unknown:
        raise web.HTTPError(400, f"user_options: unknown option {unknown[0][:40]!r} (options: "
                                 f"{', '.join(USER_OPTIONS)})")


def largest_offered(offer: dict) -> str:
    """The largest slice a spawn form offers, in words: 'the largest slice offered here is
    8 whole GPUs (gpu:8)'."""
    gpus = [c for c in offer.get("choices") or [] if c.get("kind") == "gpu"]
    if not gpus:
        return "this cluster offers no whole GPU"
    top = max(gpus, key=lambda c: float(c.get("fraction") or 0))
    return f"the largest slice offered here is {top.get('label')} ({top.get('key')})"


def normalise_slice(opts: dict) -> dict:
    """user_options -> the service's session fields (slice key or gpus, and the cluster
    when one is named: empty means wherever the session starts soonest)."""
    out: dict[str, Any] = {}
    cluster = opts.get("cluster")
    if cluster not in (None, ""):
        if not isinstance(cluster, str) or len(cluster) > 63:
            raise web.HTTPError(400, "cluster: expected a cluster's name (or empty: wherever "
                                     "the session starts soonest)")
        out["cluster"] = cluster
    if "gpus" in opts and opts["gpus"] not in (None, ""):
        g = opts["gpus"]
        if isinstance(g, str) and g.strip().isdigit() and len(g.strip()) <= 6:
            g = int(g.strip())
        elif isinstance(g, float) and g.is_integer():
            g = int(g)
        if isinstance(g, bool) or not isinstance(g, int):  # 2.9 is refused, never truncated
            raise web.HTTPError(400, f"gpus: expected a whole number, got {opts['gpus']!r}")
        out["gpus"] = g
        return out
    sl = str(opts.get("slice") or "cpu")
    if sl.startswith("mig:"):
        sl = sl[4:]
    out["slice"] = sl
    return out


def _options_applied_at_start(spawner: Spawner, options: dict) -> None:
    """JupyterHub's ``apply_user_options`` hook: nothing to do before ``start``."""


class BudgetSpawner(Spawner):
    """Queues the session in the gpubudget service, then starts it with a backend spawner."""

    backend_spawner_class = Type(
        LocalProcessSpawner, klass=Spawner, config=True,
        help="Spawner class that runs the server once the scheduler granted a slice "
             "(LocalProcessSpawner family for the local backend). Its own config sections "
             "(e.g. c.LocalProcessSpawner.*, c.Spawner.*) apply.")
    backend_spawner_config = Dict(
        {}, config=True, help="Trait values set on the backend spawner (e.g. {'cmd': [...]}).")
    cluster_spawners = Dict(
        {}, config=True,
        help="Where the service schedules several clusters (GpuBudgetService.clusters): the "
             "spawner that starts a session granted a slice on each, as {cluster: {'class': "
             "<Spawner class or import path>, 'config': {<trait>: <value>}}}, e.g. "
             "{'hpc': {'class': 'batchspawner.SlurmSpawner', 'config': {'req_partition': "
             "'gpu'}}}. A cluster not named here uses backend_spawner_class with "
             "backend_spawner_config. A class that cannot be imported, is not a Spawner or "
             "lacks a setting is refused when the hub starts, naming the entry.")
    service_api_url = Unicode(
        config=True,
        help="Base URL of the gpubudget service's REST API, reached directly from the hub "
             "(default: $GPUBUDGET_API_URL, else "
             "http://127.0.0.1:10101/services/gpubudget/api/v1).")
    service_token = Unicode(
        config=True,
        help="JupyterHub API token the spawner uses with the service; it needs the scope "
             "custom:gpubudget:admin (it submits sessions on behalf of users). Default: "
             "$GPUBUDGET_SPAWNER_TOKEN.")
    request_timeout = Float(15.0, config=True, help="Seconds for one request to the service.")
    max_queue_wait = Float(
        3600.0, config=True,
        help="Longest a spawn waits in the queue (seconds); then it is withdrawn with a "
             "message saying so. JupyterHub's start_timeout defaults to this plus "
             "backend_start_timeout, so a legitimately waiting spawn never times out first.")
    backend_start_timeout = Float(
        120.0, config=True, help="Seconds the backend spawner may take to start the server "
                                 "once a slice was granted.")
    queue_poll_interval = Float(
        2.0, config=True,
        help="While queued, the spawner long-polls the service: it learns of a start at once, "
             "and of queue position / predicted start changes at least this often (seconds).")
    default_min_runtime = Unicode("1h", config=True,
                                  help="min_runtime when the user gives none (capped by policy).")
    min_runtime_presets = List(
        Unicode(), ["30m", "1h", "2h", "4h", "8h"], config=True,
        help="Minimum runtimes the spawn form offers as buttons (those above the policy's cap "
             "are left out); the user may also type another value.")
    form_template = Unicode(
        "", config=True,
        help="Jinja template of the spawn form (a file path). Empty: the package's "
             "templates/gpubudget_form.html. Your template may {% extends "
             "\"gpubudget_form.html\" %} and override its blocks (intro, project, slices, "
             "runtime, quote, inventory, no_project, script); the context is described in "
             "docs/hub.md.")
    heartbeat_interval = Float(
        10.0, config=True, help="Seconds between heartbeats to the service while the server "
                                "runs (checkpoints its charge; asks whether to stop it).")
    idle_limit = Float(
        3600.0, config=True,
        help="Seconds without GPU use (NVML) or, without NVML, without kernel/server activity, "
             "after which the session is reported idle to the user and the admin and becomes "
             "preemptible. 0 disables idle detection.")
    gpu_idle_utilisation = Float(
        5.0, config=True, help="GPU utilisation (percent) at or below which a GPU counts as idle.")
    use_nvml = Bool(True, config=True,
                    help="Use NVML for device UUIDs and GPU utilisation when a driver exists.")
    idle_action = Enum(
        ["unprotect", "hibernate"], "unprotect", config=True,
        help="What happens to a session idle past idle_limit. 'unprotect': it is reported "
             "idle (to its user and the admins) and loses its protection, so backed work may "
             "preempt it. 'hibernate': its kernels are snapshotted, the server is stopped and "
             "its slice released (its charge stops); when its owner starts the server again "
             "it is queued and restored. A hibernation whose snapshot fails falls back to "
             "'unprotect'.")
    snapshot_on_preempt = Bool(
        True, config=True,
        help="Before a preemption stops the server, ask it to snapshot its kernels (the "
             "gpubudget server extension) and requeue the session to resume from them. The "
             "server is stopped once the snapshot is verified, or when the grace period "
             "(Policy.stop_grace) ends; kernels not saved by then are recorded lost.")
    snapshot_retry_interval = Float(
        10.0, config=True, help="Seconds between snapshot attempts while kernels are still "
                                "unsaved during a preemption's grace period.")
    hibernate_timeout = Float(
        300.0, config=True, help="Seconds a hibernation's snapshot may take.")
    restore_timeout = Float(
        900.0, config=True,
        help="Longest a spawn waits for the new server to restore its kernels before the "
             "browser is let in (the server keeps restoring after that).")

    mps_state_dir = Unicode(
        config=True,
        help="Directory of the MPS control daemons the hub runs for sessions on MPS shares, "
             "one per GPU (<dir>/<gpu id>/pipe, /log, /holders). Default: "
             "/var/lib/gpubudget/mps when the hub runs as root, else gpubudget-mps in the "
             "hub's working directory (LocalBackend.mps_state_dir's default: a hub and "
             "service of one user sharing the directory share one daemon per GPU). Only for "
             "an NVML inventory: a declared one has no real GPUs to run them for.")
    dynamic_mig = Bool(
        False, config=True,
        help="Set it as GpuBudgetService.dynamic_mig: the core may grant a session a MIG "
             "slice that has no instance yet, and the hub (as root) creates the instance "
             "before the server starts and destroys it when the server ends (docs/hub.md). "
             "An unprivileged hub refuses such a start, saying so.")
    mig_state_dir = Unicode(
        config=True,
        help="Where the hub records the MIG instances it created for sessions (so that a "
             "restarted hub destroys them). Default: /var/lib/gpubudget/mig when the hub runs "
             "as root, else gpubudget-mig in the hub's working directory.")
    mps_control = Unicode(
        CONTROL, config=True,
        help="The MPS control program (a name on the hub's PATH, or a path). When it or the "
             "NVIDIA driver is missing, a session on an MPS share fails to start with a "
             "message saying so.")

    child_configurer = Unicode(
        "", config=True,
        help="How the granted placement reaches the backend spawner: 'module:function' "
             "called as f(child, placement, meta) (meta: env, session, project, user, "
             "protected_until, min_runtime, kind). Empty: the placement's environment "
             "(CUDA_VISIBLE_DEVICES, MPS variables) is added to the child's environment, "
             "which is what local process spawners need.")

    # state
    session_id = Unicode("")
    placement = AnyTrait(None, allow_none=True)
    child_state = Dict({})
    child_cluster = Unicode("")  # the cluster the backend spawner was made for
    pending_end = Dict({})  # a stop the service could not be told of: session, reason, at
    #: the hibernated session and its snapshot, kept across stops (restored at the next start)
    hibernated = Dict({})

    @default("service_api_url")
    def _default_api(self) -> str:
        return os.environ.get("GPUBUDGET_API_URL",
                              "http://127.0.0.1:10101/services/gpubudget/api/v1").rstrip("/")

    @default("service_token")
    def _default_token(self) -> str:
        return os.environ.get("GPUBUDGET_SPAWNER_TOKEN", "")

    @default("mig_state_dir")
    def _default_mig_state_dir(self) -> str:
        return "/var/lib/gpubudget/mig" if os.geteuid() == 0 else "gpubudget-mig"

    @default("mps_state_dir")
    def _default_mps_state_dir(self) -> str:
        return "/var/lib/gpubudget/mps" if os.geteuid() == 0 else "gpubudget-mps"

    @default("start_timeout")
    def _default_start_timeout(self) -> int:
        return int(self.max_queue_wait + self.backend_start_timeout + 30)

    @validate("cluster_spawners")
    def _check_cluster_spawners(self, proposal: Any) -> dict:
        try:
            return check_cluster_spawners(proposal["value"])
        except ClusterSpawnerError as e:
            raise TraitError(str(e)) from None

    @default("options_form")
    def _default_form(self) -> Any:
        return render_form

    @default("apply_user_options")
    def _default_apply_user_options(self) -> Any:
        """The options are this spawner's own: ``start`` checks and applies them (an unknown
        one is refused, naming it). Without a hook JupyterHub (5.3+) logs "Received unhandled
        user_options" at every spawn."""
        return _options_applied_at_start

    async def get_options_form(self) -> Any:
        """No form when the server comes back from hibernation: the spawn resumes it."""
        if self.hibernated.get("snapshot"):
            return ""
        return await super().get_options_form()

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.child: Spawner | None = None
        self._phase = "idle"  # idle, queued, starting, running
        self._session: dict = {}
        self._changed = asyncio.Event()
        self._idle_reported = False
        self._gpu_busy_at: float | None = None
        self._stop_reason = "stop"
        self._offer: dict | None = None
        self._form_choices: dict = {}
        self._discovery: Any = None
        self._watch_task: asyncio.Task | None = None
        self._handed_off = False  # the session went on elsewhere (requeued, hibernated)
        self._ending = False  # the watcher stopped the server and is ending the session
        self._requests_seen: set[str] = set()
        self._restore: dict | None = None  # the new server's restore, while starting
        self._resuming: dict | None = None  # what this start restores
        self._restore_told = asyncio.Event()  # the spawn page showed the restore's outcome
        self._server_url = ""  # the running server's base URL, as its backend started it
        self._progress_watchers = 0

    # ------------------------------------------------------------------ the service
    async def api(self, method: str, path: str, body: Any = None,
                  headers: dict | None = None) -> dict:
        client = ServiceClient(self.service_api_url, self.service_token, self.request_timeout)
        return await client.request(method, path, body, headers)

    async def offer(self, min_runtime: str | None = None, quotes: bool = True) -> dict:
        q = f"/sessions/offer?user={urlquote(self.user.name)}"
        if min_runtime:
            q += f"&min_runtime={urlquote(min_runtime)}"
        if not quotes:
            q += "&quotes=0"
        self._offer = await self.api("GET", q)
        self.log.info("gpubudget: %s", self._offer.get("inventory_message") or
                      f"inventory in use: {self._offer.get('inventory')} "
                      f"({self._offer.get('inventory_gpus')} GPUs)")
        return self._offer

    async def quote(self, project: str, slice_key: str, min_runtime: str,
                    cluster: str = "") -> dict:
        """One quote for this user (the spawn form's live quote); ``cluster`` empty: on the
        cluster where the session would start soonest (the quote names it)."""
        return await self.api(
            "GET", f"/sessions/quote?user={urlquote(self.user.name)}"
                   f"&project={urlquote(project)}&slice={urlquote(slice_key)}"
                   f"&min_runtime={urlquote(min_runtime)}"
                   + (f"&cluster={urlquote(cluster)}" if cluster else ""))

    def quote_url(self) -> str:
        """Where the spawn form's page asks the hub for a quote (``handlers.QuoteHandler``,
        registered by ``handlers.register_handlers``)."""
        base = self.hub.base_url if getattr(self, "hub", None) is not None else "/hub/"
        return base.rstrip("/") + QUOTE_ROUTE.replace("([^/]+)", urlquote(self.user.name, ""))

    # ------------------------------------------------------------------ form
    def form_choices(self) -> dict:
        """The choices to show: those of the last form (also when it was refused), else the
        last spawn's options."""
        return dict(self._form_choices or self.user_options or {})

    def options_from_form(self, formdata: dict) -> dict:
        refuse_in_one_line(self.log)  # a refused choice: one line in the hub's log
        who = getattr(getattr(self, "user", None), "name", "")

        def one(k: str, d: str = "") -> str:
            return (formdata.get(k) or [d])[0].strip()

        runtime = one("min_runtime", self.default_min_runtime)
        if runtime == "custom":
            runtime = one("min_runtime_custom") or self.default_min_runtime
        opts = {"project": one("project"), "slice": one("slice"), "min_runtime": runtime}
        if one("cluster"):
            opts["cluster"] = one("cluster")
        self._form_choices = opts  # the form comes back with these after an error
        if not opts["slice"]:  # never read as CPU only: that is a choice of its own
            raise ChoiceRefused(400, "Slice: no slice chosen; pick one of the slices the form "
                                      "offers (CPU only is one of them).", who)
        try:
            duration(runtime, "min_runtime")
        except Invalid as e:
            raise ChoiceRefused(400, f"Minimum runtime: {e.message}", who) from None
        offer = self._offer
        if offer is not None and opts["project"] not in offer.get("projects", []):
            raise ChoiceRefused(
                403, f"You are not a member of project {opts['project']!r}; your projects: "
                     f"{', '.join(offer.get('projects') or []) or 'none'}.", who)
        keys = [c.get("key") for c in (offer or {}).get("choices") or []]
        if keys and opts["slice"] not in keys:
            raise ChoiceRefused(
                400, f"Slice: {opts['slice'][:40]!r} is not offered here; "
                     f"{largest_offered(offer or {})}.", who)
        names = [c.get("name") for c in (offer or {}).get("clusters") or []]
        if "cluster" in opts and names and opts["cluster"] not in names:
            raise ChoiceRefused(
                400, f"Cluster: there is no cluster {opts['cluster'][:40]!r}; pick one of "
                     f"{', '.join(str(n) for n in names)}, or 'wherever it starts soonest'.",
                who)
        if one("reservation"):  # in a booking's window: charged to its project (form.py)
            opts = in_booking(opts, one("reservation"), offer, time.time(), who)
        return opts

    # ------------------------------------------------------------------ spawning
    async def _session_body(self, opts: dict | None = None) -> dict:
        opts = dict(self.user_options or {}) if opts is None else dict(opts)
        project = opts.get("project")
        if not project:  # e.g. started from the admin page: the user's only project, if one
            try:
                offer = await self.api("GET", f"/sessions/offer?user={urlquote(self.user.name)}"
                                              "&quotes=0")
            except ServiceError as e:
                raise web.HTTPError(e.status if e.status < 500 else 503, e.message) from None
            projects = offer.get("projects") or []
            if len(projects) != 1:
                raise web.HTTPError(
                    400, "user_options.project is required (the project the session is "
                         f"charged to); {self.user.name}'s projects: "
                         f"{', '.join(projects) or 'none'}")
            project = projects[0]
        body = {"user": self.user.name, "project": str(project),
                "min_runtime": opts.get("min_runtime") or self.default_min_runtime,
                "name": f"{self.user.name}/{self.name or ''}"}
        body.update(normalise_slice(opts))
        return body

    async def _adopt_or_submit(self) -> tuple[dict, dict]:
        """The session this start runs: a requeued one the service spawned us for
        (``user_options.resume``), else a new one — resuming the hibernated session or
        restoring ``user_options.restore`` when there is one."""
        opts = dict(self.user_options or {})
        check_user_options(opts)
        self._resuming = None
        rid = opts.get("resume")
        if isinstance(rid, str) and rid:
            try:
                sess = await self.api("GET", f"/sessions/{urlquote(rid, safe='')}")
            except ServiceError as e:
                raise web.HTTPError(e.status if e.status < 500 else 503, e.message) from None
            if sess.get("user") != self.user.name or sess.get("name") != \
                    f"{self.user.name}/{self.name or ''}":
                raise web.HTTPError(403, f"session {rid} is not this server's")
            # queued for us by the service (it may have been granted its slice already,
            # while the hub was starting this spawn)
            if sess.get("state") in ("pending", "running") and \
                    (sess.get("resumes") or {}).get("snapshot"):
                self._resuming = sess["resumes"]
                return sess, {"project": sess["project"]}
            self.log.info("gpubudget: session %s is %s: starting afresh", rid, sess.get("state"))
            opts = restore.options_from_session(sess)
        body = await self._session_body(opts)
        hib = self.hibernated
        if isinstance(opts.get("restore"), str) and opts["restore"]:
            body["restore"] = opts["restore"]
        elif hib.get("snapshot"):
            body["resumes"] = hib["session"]
            body["restore"] = hib["snapshot"]
            try:
                old = await self.api("GET", f"/sessions/{urlquote(hib['session'], safe='')}")
                body.update({k: v for k, v in restore.options_from_session(old).items()
                             if k in ("project", "slice", "gpus", "min_runtime", "cluster")})
            except ServiceError:
                pass
        key = f"{self.user.name}-{self.name or 'default'}-{uuid.uuid4().hex[:12]}"
        try:
            sess = await self.api("POST", "/sessions", body, {"Idempotency-Key": key})
        except ServiceError as e:
            if hib.get("snapshot") and e.status in (400, 409):
                self.log.warning("gpubudget: the hibernated session %s cannot be resumed (%s): "
                                 "starting afresh", hib.get("session"), e.message)
                self.hibernated = {}
                body.pop("resumes", None)
                body.pop("restore", None)
                sess = await self.api("POST", "/sessions", body, {"Idempotency-Key": key + "f"})
            else:
                raise
        self.hibernated = {}
        if sess.get("resumes"):
            self._resuming = sess["resumes"]
        return sess, body

    async def start(self) -> Any:
        await self._flush_pending_end()
        self._phase, self._session, self._stop_reason = "queued", {}, "stop"
        self._idle_reported, self._handed_off, self._restore = False, False, None
        self._ending = False
        try:
            sess, body = await self._adopt_or_submit()
        except ServiceError as e:
            self._phase = "idle"
            raise web.HTTPError(e.status if e.status < 500 else 503, e.message) from None
        except web.HTTPError:
            self._phase = "idle"
            raise
        self.session_id = sess["id"]
        self._set_session(sess)
        self.log.info("gpubudget: session %s for %s queued (project %s, %s)", self.session_id,
                      self.user.name, body["project"], body.get("slice") or body.get("gpus"))
        deadline = time.monotonic() + self.max_queue_wait
        try:
            sess = await queue.wait_for_grant(self, sess, deadline)
            self.placement = sess.get("placement") or []
            self._phase = "starting"
            self._changed.set()
            disc = self._get_discovery()
            migs = await mig.carve(self, self.placement, disc)  # before any server runs
            pipes = await mps.acquire(self, self.placement, disc, migs)
            child = self._construct_child(sess.get("cluster"))
            env = placement_env(self.placement, disc, mps_pipes=pipes, migs=migs)
            env.update({"GPUBUDGET_SESSION": self.session_id, "GPUBUDGET_PROJECT":
                        str(body["project"]), "GPUBUDGET_INVENTORY": str(sess.get("inventory"))})
            if self._resuming:
                env["GPUBUDGET_RESTORE"] = str(self._resuming["snapshot"])
            configure_child(self.child_configurer, child, self.placement, {
                "env": env, "session": self.session_id, "project": str(body["project"]),
                "user": self.user.name, "protected_until": sess.get("protected_until"),
                "min_runtime": sess.get("min_runtime"), "kind": "interactive"})
            self.log.info("gpubudget: session %s granted %s on cluster %s; "
                          "CUDA_VISIBLE_DEVICES=%s", self.session_id, describe(self.placement),
                          sess.get("cluster") or "default",
                          env["CUDA_VISIBLE_DEVICES"] or "(none)")
            url = await asyncio.wait_for(child.start(), self.backend_start_timeout)
            self._server_url = restore.server_url(self, url)
            if self._resuming:  # the browser is let in once the kernels are back
                self._phase = "restoring"
                self._changed.set()
                self._restore_told.clear()
                await restore.wait_restored(self, url)
                self._phase = "restored"
                self._changed.set()
                if self._progress_watchers:  # let the spawn page say what came back
                    try:
                        await asyncio.wait_for(self._restore_told.wait(), 3)
                    except TimeoutError:
                        pass
        except (Exception, asyncio.CancelledError) as e:
            self._phase = "idle"
            self._changed.set()
            reason = "stop" if isinstance(e, asyncio.CancelledError) else "failed"
            try:
                await self._end(reason)
            except Exception:  # noqa: BLE001 - the original error matters more
                self.log.exception("gpubudget: could not end session %s", self.session_id)
            try:
                await self._stop_child(now=True)
            except Exception:  # noqa: BLE001
                pass
            raise
        self._phase = "running"
        self._changed.set()
        self._start_watch()
        return url

    def _set_session(self, sess: dict) -> None:
        self._session = sess
        self._changed.set()

    def _construct_child(self, cluster: str | None = None) -> Spawner:
        return construct_child(self, cluster)

    def _get_discovery(self) -> Any:
        if not self.use_nvml or self._session.get("inventory") != "nvml":
            return None
        if self._discovery is None or self.dynamic_mig:  # carved instances come and go
            try:
                from jupyter_gpubudget.inventory.nvml import NoNvidiaDriver, discover

                self._discovery = discover(mig.NVML, dynamic_mig=self.dynamic_mig)
            except (ImportError, NoNvidiaDriver) as e:
                self.log.warning("gpubudget: NVML unavailable for device UUIDs (%s)", e)
        return self._discovery

    async def _end(self, reason: str) -> None:
        if not self.session_id or self._handed_off:
            return
        sid = self.session_id
        try:
            await self.api("DELETE", f"/sessions/{sid}?reason={reason}")
            self.log.info("gpubudget: session %s ended (%s); charge closed", sid, reason)
        except ServiceError as e:
            if e.status != 404:
                raise

    async def _end_quietly(self, reason: str) -> None:
        """End the session's charge; if the service cannot be reached (the hub stops its
        services before the users' servers when it shuts down), keep the stop in this
        spawner's state — the service settles it from there when it is back."""
        try:
            await self._end(reason)
        except ServiceError as e:
            self.log.warning("gpubudget: ending session %s failed: %s; the stop is kept in the "
                             "hub's database for the service", self.session_id, e)
            if self.session_id and e.status >= 500:
                self.pending_end = {"session": self.session_id, "reason": reason,
                                    "at": time.time()}

    async def _flush_pending_end(self) -> None:
        """Tell the service about a stop it missed (it may have settled it already)."""
        if not self.pending_end:
            return
        pe = self.pending_end
        try:
            await self.api("DELETE", f"/sessions/{pe['session']}?reason={pe['reason']}")
        except ServiceError as e:
            if e.status >= 500:
                return  # still away: keep it
        self.pending_end = {}

    async def _stop_child(self, now: bool = False) -> None:
        """Stop the server, then give back what it held (its MPS control daemon, the MIG
        instances created for it): every stop of the server (the hub's, the watcher's, a
        failed start) comes through here."""
        try:
            if self.child is not None:
                await self.child.stop(now=now)
        finally:
            await self._release_devices()

    async def _release_devices(self) -> None:
        await mps.release(self)
        await mig.release(self)

    async def progress(self) -> Any:
        async for event in queue.progress(self):
            yield event

    # ------------------------------------------------------------------ running
    async def poll(self) -> int | None:
        if self.child is None:
            if self.session_id and self.child_state:
                self._construct_child()
            else:
                return 0
        assert self.child is not None
        status = await self.child.poll()
        if status is not None:
            await self._release_devices()  # the server is gone: so are its MPS share, MIG
            if self.session_id:
                await self._end_quietly(self._stop_reason)
            return status
        if self.session_id and self._watch_task is None:
            self._start_watch()  # e.g. after a hub restart
        return None

    def _start_watch(self) -> None:
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.ensure_future(watch.watch(self))

    async def stop(self, now: bool = False) -> None:
        task = self._watch_task
        if task is not None and task is not asyncio.current_task():
            if self._ending and not task.done():
                # the watcher stopped the server after a snapshot and is ending (requeueing)
                # the session: let it finish rather than lose the requeue
                try:
                    await asyncio.wait_for(asyncio.shield(task), self.request_timeout * 3)
                except (TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
                    pass
            else:
                task.cancel()  # e.g. the user stops the server during a grace period
        self._watch_task = None
        if self.child is None and self.child_state:
            self._construct_child()
        try:
            await self._stop_child(now=now)
        finally:
            await self._end_quietly(self._stop_reason)
            self._phase = "idle"

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict:
        state = super().get_state()
        if self.session_id:
            state["gpubudget_session"] = self.session_id
            state["placement"] = self.placement
        if self.child is not None:
            self.child_state = self.child.get_state()
        if self.child_state:
            state["child_state"] = self.child_state
        if self.child_cluster:
            state["gpubudget_cluster"] = self.child_cluster
        if self.pending_end:
            state["gpubudget_pending_end"] = self.pending_end
        if self.hibernated:
            state["gpubudget_hibernated"] = self.hibernated
        return state

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.session_id = state.get("gpubudget_session", "")
        self.placement = state.get("placement")
        self.child_state = state.get("child_state", {})
        self.child_cluster = state.get("gpubudget_cluster", "")
        self.pending_end = state.get("gpubudget_pending_end") or {}
        self.hibernated = state.get("gpubudget_hibernated") or {}
        if self.child_state:
            self._construct_child()

    def clear_state(self) -> None:
        super().clear_state()
        if self.child is not None:
            self.child.clear_state()
        self.child = None
        self.child_state = {}
        self.child_cluster = ""
        self.session_id = ""
        self.placement = None
        self._phase = "idle"
        self._server_url = ""
