"""BudgetSpawner: a JupyterHub spawner that queues a session in the gpubudget service, waits for
the scheduler to grant it a slice, then starts the server through a wrapped backend spawner.

- The spawn form offers the user's projects, the slices the inventory can offer (whole GPUs,
  MIG profiles, MPS shares, CPU only), ``min_runtime`` (capped by policy), and for each choice a
  quote: predicted start, protected time, GPU-hour cost of the protected time, backed or not.
- ``user_options`` for scripted spawns (``POST /hub/api/users/{name}/server``):
  ``{"project": "lattice-qcd", "slice": "gpu:1" | "mig:1g.10gb" | "1g.10gb" | "mps:250" |
  "cpu", "gpus": 2, "min_runtime": "2h"}``.
- While queued, progress events report the queue position and predicted start; the wait ends
  with a clear message after ``max_queue_wait``.
- The granted placement becomes the backend's environment (``CUDA_VISIBLE_DEVICES`` = GPU or
  MIG UUIDs, MPS variables). Stop, cull, preemption and a server that exits all end the charge.
- Idle detection: GPU utilisation via NVML where available, otherwise the hub's record of the
  server's (kernel) activity; a session idle past ``idle_limit`` is reported to the service
  (a notice for the user and the admin) and becomes preemptible.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote as urlquote

from jupyterhub.spawner import LocalProcessSpawner, Spawner
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from traitlets import Any as AnyTrait
from traitlets import Bool, Dict, Float, Type, Unicode, default

from .placement import describe, placement_env

_CHILD_TRAITS = ("user", "orm_spawner", "hub", "authenticator", "proxy_spec", "oauth_client_id",
                 "cookie_options", "cookie_host_prefix_enabled", "trusted_alt_names",
                 "public_url", "public_hub_url", "internal_ssl", "internal_trust_bundles",
                 "internal_certs_location", "_deprecated_db_session")


class ServiceError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _when(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return "unknown (when running sessions end)"
    now = time.time() if now is None else now
    delta = ts - now
    if delta <= 1:
        return "now"
    at = datetime.fromtimestamp(ts, UTC).strftime("%H:%M UTC")
    if delta < 3600:
        return f"in ~{max(1, round(delta / 60))} min ({at})"
    return f"in ~{delta / 3600:.1f} h ({at})"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def normalise_slice(opts: dict) -> dict:
    """user_options -> the service's session fields (slice key or gpus)."""
    out: dict[str, Any] = {}
    if "gpus" in opts and opts["gpus"] not in (None, ""):
        try:
            out["gpus"] = int(opts["gpus"])
        except (TypeError, ValueError):
            raise web.HTTPError(400, f"gpus: expected a whole number, got {opts['gpus']!r}") \
                from None
        return out
    sl = str(opts.get("slice") or "cpu")
    if sl.startswith("mig:"):
        sl = sl[4:]
    out["slice"] = sl
    return out


class BudgetSpawner(Spawner):
    """Queues the session in the gpubudget service, then starts it with a backend spawner."""

    backend_spawner_class = Type(
        LocalProcessSpawner, klass=Spawner, config=True,
        help="Spawner class that runs the server once the scheduler granted a slice "
             "(LocalProcessSpawner family for the local backend). Its own config sections "
             "(e.g. c.LocalProcessSpawner.*, c.Spawner.*) apply.")
    backend_spawner_config = Dict(
        {}, config=True, help="Trait values set on the backend spawner (e.g. {'cmd': [...]}).")
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

    @default("service_api_url")
    def _default_api(self) -> str:
        return os.environ.get("GPUBUDGET_API_URL",
                              "http://127.0.0.1:10101/services/gpubudget/api/v1").rstrip("/")

    @default("service_token")
    def _default_token(self) -> str:
        return os.environ.get("GPUBUDGET_SPAWNER_TOKEN", "")

    @default("start_timeout")
    def _default_start_timeout(self) -> int:
        return int(self.max_queue_wait + self.backend_start_timeout + 30)

    @default("options_form")
    def _default_form(self) -> Any:
        return _render_form

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.child: Spawner | None = None
        self._phase = "idle"  # idle, queued, starting, running
        self._session: dict = {}
        self._changed = asyncio.Event()
        self._last_beat = 0.0
        self._idle_reported = False
        self._stop_reason = "stop"
        self._offer: dict | None = None
        self._discovery: Any = None
        self._blocked: list[str] = []
        self._watch_task: asyncio.Task | None = None

    # ------------------------------------------------------------------ the service
    async def api(self, method: str, path: str, body: Any = None,
                  headers: dict | None = None) -> dict:
        hdrs = {"Authorization": f"token {self.service_token}", "Accept": "application/json"}
        if body is not None:
            hdrs["Content-Type"] = "application/json"
        hdrs.update(headers or {})
        req = HTTPRequest(self.service_api_url + path, method=method, headers=hdrs,
                          body=json.dumps(body) if body is not None else
                          (b"" if method == "POST" else None),
                          request_timeout=self.request_timeout)
        try:
            resp = await AsyncHTTPClient().fetch(req, raise_error=False)
        except Exception as e:  # connection refused, DNS
            raise ServiceError(503, f"the gpubudget service is unreachable ({e})") from e
        try:
            data = json.loads(resp.body or b"{}")
        except ValueError:
            data = {"message": (resp.body or b"").decode(errors="replace")[:300]}
        if resp.code >= 400 or resp.code == 599:
            msg = data.get("message") or resp.reason or str(resp.error)
            raise ServiceError(resp.code if resp.code != 599 else 503,
                               f"gpubudget service: {msg}")
        return data

    async def offer(self, min_runtime: str | None = None) -> dict:
        q = f"/sessions/offer?user={urlquote(self.user.name)}"
        if min_runtime:
            q += f"&min_runtime={urlquote(min_runtime)}"
        self._offer = await self.api("GET", q)
        self.log.info("gpubudget: %s", self._offer.get("inventory_message") or
                      f"inventory in use: {self._offer.get('inventory')} "
                      f"({self._offer.get('inventory_gpus')} GPUs)")
        return self._offer

    # ------------------------------------------------------------------ form
    def options_from_form(self, formdata: dict) -> dict:
        def one(k: str, d: str = "") -> str:
            return (formdata.get(k) or [d])[0].strip()

        opts = {"project": one("project"), "slice": one("slice", "cpu"),
                "min_runtime": one("min_runtime", self.default_min_runtime)}
        offer = self._offer
        if offer is not None and opts["project"] not in offer.get("projects", []):
            raise web.HTTPError(
                403, f"You are not a member of project {opts['project']!r}; your projects: "
                     f"{', '.join(offer.get('projects') or []) or 'none'}.")
        return opts

    # ------------------------------------------------------------------ spawning
    async def _session_body(self) -> dict:
        opts = dict(self.user_options or {})
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

    async def start(self) -> Any:
        body = await self._session_body()
        self._phase, self._session, self._stop_reason = "queued", {}, "stop"
        self._idle_reported = False
        key = f"{self.user.name}-{self.name or 'default'}-{uuid.uuid4().hex[:12]}"
        try:
            sess = await self.api("POST", "/sessions", body, {"Idempotency-Key": key})
        except ServiceError as e:
            self._phase = "idle"
            raise web.HTTPError(e.status if e.status < 500 else 503, e.message) from None
        self.session_id = sess["id"]
        self._set_session(sess)
        self.log.info("gpubudget: session %s for %s queued (project %s, %s)", self.session_id,
                      self.user.name, body["project"], body.get("slice") or body.get("gpus"))
        deadline = time.monotonic() + self.max_queue_wait
        try:
            while sess["state"] == "pending":
                if time.monotonic() > deadline:
                    await self._end("timeout")
                    raise web.HTTPError(
                        503, f"Still queued after {_hours(self.max_queue_wait)} (position "
                             f"{sess.get('queue_position')}); the request was withdrawn and "
                             f"nothing was charged. Try a smaller slice or later.")
                wait = max(0.0, min(self.queue_poll_interval, deadline - time.monotonic()))
                try:
                    sess = await self.api("GET", f"/sessions/{self.session_id}?wait={wait:.2f}")
                except ServiceError as e:
                    if e.status < 500:
                        raise
                    # the service is restarting: keep the place in the queue, try again
                    self.log.warning("gpubudget: %s; still waiting", e.message)
                    await asyncio.sleep(min(2.0, self.queue_poll_interval))
                    continue
                self._set_session(sess)
            if sess["state"] != "running":
                raise web.HTTPError(500, f"session {self.session_id} ended while queued: "
                                         f"{sess['state']} {sess.get('reason', '')}".strip())
            self.placement = sess.get("placement") or []
            self._phase = "starting"
            self._changed.set()
            while sess.get("blocked_by") and time.monotonic() < deadline:
                # granted a slice a preempted session still holds: wait until it is released
                self._blocked = list(sess["blocked_by"])
                self._changed.set()
                await asyncio.sleep(self.queue_poll_interval)
                sess = await self.api("GET", f"/sessions/{self.session_id}")
                self._set_session(sess)
            self._blocked = []
            child = self._construct_child()
            env = placement_env(self.placement, self._get_discovery())
            env.update({"GPUBUDGET_SESSION": self.session_id, "GPUBUDGET_PROJECT":
                        str(body["project"]), "GPUBUDGET_INVENTORY": str(sess.get("inventory"))})
            self.configure_child(child, self.placement, {
                "env": env, "session": self.session_id, "project": str(body["project"]),
                "user": self.user.name, "protected_until": sess.get("protected_until"),
                "min_runtime": sess.get("min_runtime"), "kind": "interactive"})
            self.log.info("gpubudget: session %s granted %s; CUDA_VISIBLE_DEVICES=%s", self.session_id,
                          describe(self.placement), env["CUDA_VISIBLE_DEVICES"] or "(none)")
            url = await asyncio.wait_for(child.start(), self.backend_start_timeout)
        except (Exception, asyncio.CancelledError) as e:
            self._phase = "idle"
            self._changed.set()
            reason = "stop" if isinstance(e, asyncio.CancelledError) else "failed"
            try:
                await self._end(reason)
            except Exception:  # noqa: BLE001 - the original error matters more
                self.log.exception("gpubudget: could not end session %s", self.session_id)
            if self.child is not None:
                try:
                    await self.child.stop(now=True)
                except Exception:  # noqa: BLE001
                    pass
            raise
        self._phase = "running"
        self._changed.set()
        self._start_watch()
        return url

    def configure_child(self, child: Spawner, placement: list[dict], meta: dict) -> None:
        """Apply the granted placement to the backend spawner (see ``child_configurer``)."""
        if not self.child_configurer:
            child.environment = {**child.environment, **meta["env"]}
            return
        import importlib

        mod, _, fn = self.child_configurer.partition(":")
        getattr(importlib.import_module(mod), fn)(child, placement, meta)

    def _set_session(self, sess: dict) -> None:
        self._session = sess
        self._changed.set()

    def _construct_child(self) -> Spawner:
        if self.child is None:
            kw = {k: getattr(self, k) for k in _CHILD_TRAITS if self.has_trait(k)}
            self.child = self.backend_spawner_class(config=self.config, **kw,
                                                    **self.backend_spawner_config)
            if self.child_state:
                self.child.load_state(self.child_state)
        c = self.child
        c.user_options = dict(self.user_options or {})
        c.api_token = self.api_token
        c.admin_access = self.admin_access
        c.cert_paths = self.cert_paths
        c.handler = self.handler
        return c

    def _get_discovery(self) -> Any:
        if not self.use_nvml or self._session.get("inventory") != "nvml":
            return None
        if self._discovery is None:
            try:
                from jupyter_gpubudget.inventory.nvml import NoNvidiaDriver, discover

                self._discovery = discover()
            except (ImportError, NoNvidiaDriver) as e:
                self.log.warning("gpubudget: NVML unavailable for device UUIDs (%s)", e)
        return self._discovery

    async def _end(self, reason: str) -> None:
        if not self.session_id:
            return
        sid = self.session_id
        try:
            await self.api("DELETE", f"/sessions/{sid}?reason={reason}")
            self.log.info("gpubudget: session %s ended (%s); charge closed", sid, reason)
        except ServiceError as e:
            if e.status != 404:
                raise

    async def progress(self) -> Any:
        last = None
        n = 0
        while self._phase == "queued":
            s = self._session
            if s:
                pos = s.get("queue_position")
                msg = (f"Queued in project {s.get('project')} for {_ask(s.get('request'))}: "
                       f"position {pos if pos is not None else '?'} in the queue, predicted "
                       f"start {_when(s.get('predicted_start'))}.")
                if msg != last:
                    n += 1
                    last = msg
                    yield {"progress": min(40, 5 + n), "message": msg,
                           "gpubudget": {"queue_position": pos,
                                         "predicted_start": s.get("predicted_start"),
                                         "session": s.get("id")}}
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), 5)
            except TimeoutError:
                pass
        if self._phase in ("starting", "running"):
            s = self._session
            prot = ""
            if s.get("protected_until"):
                prot = f"; protected for {_hours(max(0, s['protected_until'] - time.time()))}"
            elif not s.get("backed"):
                prot = "; unbacked (not protected, preempted first)"
            yield {"progress": 50, "message": f"Granted {describe(self.placement)}{prot}."}
            while self._blocked and self._phase == "starting":
                yield {"progress": 55, "message": "Waiting for a preempted session to release "
                                                  "the slice..."}
                self._changed.clear()
                try:
                    await asyncio.wait_for(self._changed.wait(), 5)
                except TimeoutError:
                    pass
            yield {"progress": 60, "message": "Starting the server..."}
            if self.child is not None:
                async for ev in self.child.progress():
                    yield ev

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
            if self.session_id:
                await self._end_quietly(self._stop_reason)
            return status
        if self.session_id and self._watch_task is None:
            self._start_watch()  # e.g. after a hub restart
        return None

    def _start_watch(self) -> None:
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        """While the server runs: heartbeat (checkpoints the charge), stop the server when the
        scheduler preempted the session, report idleness."""
        while self.session_id and self.child is not None:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                sess = await self.api("POST", f"/sessions/{self.session_id}/heartbeat")
            except ServiceError as e:
                self.log.warning("gpubudget: heartbeat for %s failed: %s", self.session_id, e)
                continue
            except asyncio.CancelledError:
                raise
            self._session = sess
            if sess.get("state") != "running" or sess.get("preempt_requested"):
                why = sess.get("preempt_requested") or f"session is {sess.get('state')}"
                self.log.warning("gpubudget: stopping %s's server (session %s): %s",
                                 self.user.name, self.session_id, why)
                self._stop_reason = "preempt"
                try:
                    await self.child.stop(now=False)
                finally:
                    await self._end_quietly("preempt")
                return  # the hub's next poll sees the server gone and cleans up
            try:
                await self._check_idle()
            except Exception:  # noqa: BLE001 - idle detection must not kill the watcher
                self.log.exception("gpubudget: idle check failed")

    async def _end_quietly(self, reason: str) -> None:
        try:
            await self._end(reason)
        except ServiceError as e:
            self.log.warning("gpubudget: ending session %s failed: %s", self.session_id, e)

    async def idle_seconds(self) -> tuple[float, str] | None:
        """Seconds the session has been idle, and how that was measured."""
        from .idle import gpu_busy

        ids = (self.child.environment.get("CUDA_VISIBLE_DEVICES", "")
               if self.child is not None else "")
        if self.use_nvml and ids:
            busy = gpu_busy(ids.split(","), self.gpu_idle_utilisation)
            if busy is not None:
                if busy:
                    self._gpu_busy_at = time.time()
                since = getattr(self, "_gpu_busy_at", None) or self._session.get("started_at") \
                    or time.time()
                return time.time() - since, "GPU utilisation (NVML)"
        last = getattr(self.orm_spawner, "last_activity", None)
        if last is None:
            return None
        if last.tzinfo is None:
            last = last.replace(tzinfo=UTC)
        return (datetime.now(UTC) - last).total_seconds(), "kernel activity"

    async def _check_idle(self) -> None:
        if self.idle_limit <= 0 or self._idle_reported or not self.session_id:
            return
        got = await self.idle_seconds()
        if got is None or got[0] < self.idle_limit:
            return
        idle_s, source = got
        self._idle_reported = True
        self.log.warning("gpubudget: %s's session %s idle for %s (%s): reported; now "
                         "preemptible", self.user.name, self.session_id, _hours(idle_s), source)
        try:
            await self.api("POST", f"/sessions/{self.session_id}/idle",
                           {"idle_s": idle_s, "source": source})
        except ServiceError as e:
            self.log.warning("gpubudget: idle report failed: %s", e)

    async def stop(self, now: bool = False) -> None:
        if self._watch_task is not None and self._watch_task is not asyncio.current_task():
            self._watch_task.cancel()
        self._watch_task = None
        if self.child is None and self.child_state:
            self._construct_child()
        try:
            if self.child is not None:
                await self.child.stop(now=now)
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
        return state

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.session_id = state.get("gpubudget_session", "")
        self.placement = state.get("placement")
        self.child_state = state.get("child_state", {})
        if self.child_state:
            self._construct_child()

    def clear_state(self) -> None:
        super().clear_state()
        if self.child is not None:
            self.child.clear_state()
        self.child = None
        self.child_state = {}
        self.session_id = ""
        self.placement = None
        self._phase = "idle"


def _ask(request: dict | None) -> str:
    if not request:
        return "a session"
    kind = request.get("kind")
    if kind == "mig":
        return f"MIG {request.get('profile')}"
    if kind == "mps":
        return f"an MPS share of {request.get('milli', 0) / 10:g}%"
    if kind == "gpu":
        n = request.get("gpus", 1)
        return f"{n} GPU{'s' if n != 1 else ''}"
    return "CPU only"


async def _render_form(spawner: BudgetSpawner) -> str:
    try:
        offer = await spawner.offer(spawner.default_min_runtime)
    except ServiceError as e:
        return (f"<div class='alert alert-danger'>The GPU budget service is not answering "
                f"({html.escape(e.message)}). Try again in a moment.</div>")
    return render_form_html(offer, spawner.default_min_runtime)


def render_form_html(offer: dict, min_runtime: str) -> str:
    e = html.escape
    projects = offer.get("projects") or []
    if not projects:
        return ("<div class='alert alert-warning'>You are not a member of any project, so no "
                "session can be charged. Ask an admin to add you to a project in the budgets "
                "file.</div>")
    inv = offer.get("inventory")
    inv_text = ("GPUs discovered with NVML" if inv == "nvml" else
                "a <b>declared</b> inventory (no GPU driver here: demo / test hardware)")
    cap = offer.get("min_runtime_cap") or 0
    now = offer.get("now") or time.time()
    out = [f"<p class='gpubudget-inventory'>Inventory in use: {inv_text}, "
           f"{offer.get('inventory_gpus', 0)} GPUs.</p>",
           "<div class='form-group'><label for='gpubudget-project'>Project (charged for the "
           "session)</label><select class='form-control' id='gpubudget-project' "
           "name='project'>"]
    for i, p in enumerate(projects):
        out.append(f"<option value='{e(p)}'{' selected' if i == 0 else ''}>{e(p)}</option>")
    out.append("</select></div>")
    out.append(f"<div class='form-group'><label for='gpubudget-min-runtime'>Minimum runtime "
               f"(protected time; at most {_hours(cap)})</label><input class='form-control' "
               f"id='gpubudget-min-runtime' name='min_runtime' value='{e(min_runtime)}'></div>")
    out.append("<fieldset class='form-group'><legend>Slice</legend>")
    for i, ch in enumerate(offer.get("choices") or []):
        key = ch["key"]
        out.append(f"<div class='gpubudget-choice'><label><input type='radio' name='slice' "
                   f"value='{e(key)}'{' checked' if i == 0 else ''}> {e(ch['label'])}</label>"
                   "<ul class='gpubudget-quotes'>")
        for p in projects:
            q = (offer.get("quotes") or {}).get(p, {}).get(key)
            if not q:
                continue
            backed = "backed" if q.get("backed") else "unbacked (never protected, preempted first)"
            out.append(f"<li data-project='{e(p)}'>{e(p)}: starts "
                       f"{e(_when(q.get('predicted_start'), now))}; protected "
                       f"{_hours(q.get('protected_s') or 0)}; cost "
                       f"{q.get('cost_gpu_hours', 0):.2f} GPU-h; {backed}</li>")
        out.append("</ul></div>")
    out.append("</fieldset>")
    return "\n".join(out)
