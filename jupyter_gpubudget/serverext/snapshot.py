"""Snapshots of this server's kernels, taken and restored here, inside the user's server.

The server is where the kernels are: it knows each kernel's process, connection and the
notebooks (sessions) it serves, and it runs as the user, so the namespace backend needs no
privilege here; CRIU's root-only steps go through :class:`~jupyter_gpubudget.snapshot.privcall
.Privileged` (``c.Privileged.command_prefix``, e.g. ``sudo -n``).

``GET  gpubudget/api/snapshots`` — what this server can do (methods, why not), its kernels,
the restore done at start-up (state and report), the last snapshot taken.

``POST gpubudget/api/snapshots`` ``{"reason": "user"|"preempt"|"hibernate", "freeze": bool,
"deadline": epoch, "request": id}`` — take a snapshot *set* now: every kernel, each with the
first backend that can capture it (``GpuBudgetSnapshots.methods``), verified by the store; the
set is recorded at the service (``PUT /snapshots/{id}``). ``freeze`` (preemption, hibernation):
the kernels are ended once their snapshot is verified (nothing they do afterwards would be
saved); a kernel whose snapshot failed runs on. Answers the set's summary (200), also when
some kernels could not be saved (each says why).

``POST gpubudget/api/restore`` ``{"snapshot": id, "request": id}`` — restore a set into this
server: each kernel of the notebooks it names is replaced by the restored one.

``GET  gpubudget/api/restore`` — the restore this server does at start-up (``$GPUBUDGET_RESTORE``,
set by BudgetSpawner): ``{"state": "none"|"restoring"|"done"|"failed", "report": ...}``.
BudgetSpawner waits for it before the hub lets the browser in, so the notebooks reconnect to
their restored kernels.

Restoring a set: it must verify (a snapshot that does not is marked bad, reported, and — at
start-up — the newest older set of the same session that verifies is used instead, saying
so). CRIU kernels come back whole, as the same processes, adopted by this server
(:mod:`.provisioner`); namespace kernels are fresh kernels of the same kernel name into which
the namespace is restored (variables restored, recomputed from their cells, or lost, each
named). Each restored kernel is attached to the notebooks and consoles it served.
"""

from __future__ import annotations

import asyncio
import json
import os
import posixpath
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from traitlets import Bool, Float, Int, List, Unicode, default
from traitlets.config import LoggingConfigurable

from jupyter_gpubudget.snapshot.base import KernelRef, SnapshotError
from jupyter_gpubudget.snapshot.criusnap import CriuSnapshotter
from jupyter_gpubudget.snapshot.namespace import NamespaceSnapshotter
from jupyter_gpubudget.snapshot.privcall import Privileged
from jupyter_gpubudget.snapshot.sets import Member, Sets
from jupyter_gpubudget.snapshot.store import ID_RE, Store

from . import provisioner
from .config import GpuBudgetLab
from .service import ServiceClient, ServiceUnavailable

AUTH_RESOURCE = "gpubudget"
REASONS = ("user", "preempt", "hibernate")
#: variables of the new server a CRIU-restored kernel is given (it keeps its old environment;
#: its watchdog's owner is set separately: GPUBUDGET_KERNEL_OWNER is kept as it was launched)
ENV_PREFIXES = ("CUDA_", "GPUBUDGET_", "JUPYTERHUB_")


class GpuBudgetSnapshots(LoggingConfigurable):
    """Snapshots of this server's kernels (``c.GpuBudgetSnapshots.*``)."""

    enabled = Bool(True, help="Take and restore snapshots of this server's kernels (needs a "
                   "gpubudget session: $GPUBUDGET_SESSION).").tag(config=True)
    store_dir = Unicode(help="The snapshot store of this user (chunks, manifests, sets). "
                        "Default: $GPUBUDGET_SNAPSHOT_DIR, else "
                        "~/.local/share/jupyter-gpubudget/snapshots. Sessions restored on "
                        "another node need it on storage both nodes see (a shared home, a "
                        "persistent volume).").tag(config=True)
    methods = List(Unicode(), help="Snapshot methods in order of preference: the first that "
                   "can capture a kernel is used ('criu': the whole process, needs CRIU and "
                   "root through Privileged.command_prefix; 'namespace': the variables and "
                   "cell history, anywhere). Default: $GPUBUDGET_SNAPSHOT_METHODS "
                   "(comma-separated), else criu,namespace.").tag(config=True)
    snapshot_ready_kernels = Bool(True, help="Start this server's kernels so that CRIU can "
                                  "capture and restore them (the gpubudget-snapshot-ready "
                                  "kernel provisioner), unless another default provisioner "
                                  "is configured.").tag(config=True)
    kernel_log_dir = Unicode("", help="Where snapshot-ready kernels write stdout and stderr "
                             "(one file each). Empty: /dev/null (ipykernel sends output "
                             "through its channels; a log file that grows after a snapshot "
                             "makes that CRIU snapshot unrestorable).").tag(config=True)
    kernel_watchdog = Float(30.0, help="Seconds a snapshot-ready kernel outlives its server "
                            "when the server dies without shutting it down (it cannot use "
                            "ipykernel's parent poller: a restored kernel has another "
                            "parent).").tag(config=True)
    keep_last = Int(3, help="Snapshots kept per session when the service does not say (it "
                    "does: GpuBudgetService.snapshot_keep_last).").tag(config=True)
    timeout = Float(600.0, help="Seconds one kernel's snapshot or restore may take (a "
                    "preemption's deadline shortens it).").tag(config=True)
    restore_on_start = Unicode(help="Snapshot set restored when this server starts. "
                               "Default: $GPUBUDGET_RESTORE (set by BudgetSpawner).").tag(
        config=True)

    @default("store_dir")
    def _store_dir(self) -> str:
        return os.environ.get("GPUBUDGET_SNAPSHOT_DIR") or os.path.join(
            os.path.expanduser("~"), ".local", "share", "jupyter-gpubudget", "snapshots")

    @default("methods")
    def _methods(self) -> list[str]:
        raw = os.environ.get("GPUBUDGET_SNAPSHOT_METHODS", "")
        return [m.strip() for m in raw.split(",") if m.strip()] or ["criu", "namespace"]

    @default("restore_on_start")
    def _restore(self) -> str:
        return os.environ.get("GPUBUDGET_RESTORE", "")


def _signal(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _words_bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


class SnapshotManager:
    """Takes and restores this server's snapshot sets (one at a time)."""

    def __init__(self, serverapp: Any, lab: GpuBudgetLab, cfg: GpuBudgetSnapshots,
                 client: ServiceClient) -> None:
        self.app, self.lab, self.cfg, self.client = serverapp, lab, cfg, client
        self.log = cfg.log
        self.problem: str | None = None
        if not cfg.enabled:
            self.problem = "snapshots are turned off (GpuBudgetSnapshots.enabled)"
        elif not lab.session_id:
            self.problem = "this server is not a gpubudget session (no $GPUBUDGET_SESSION)"
        unknown = [m for m in cfg.methods if m not in ("criu", "namespace")]
        if unknown:
            self.problem = f"GpuBudgetSnapshots.methods: unknown method {unknown[0]!r}"
        self.store: Store | None = None
        self.sets: Sets | None = None
        self.backends: list[Any] = []
        if self.problem is None:
            os.makedirs(cfg.store_dir, mode=0o700, exist_ok=True)
            self.store = Store(cfg.store_dir, keep_last=0, parent=cfg)
            self.sets = Sets(self.store, keep_last=cfg.keep_last)
            priv = Privileged(parent=cfg)
            by_name = {"criu": lambda: CriuSnapshotter(self.store, privileged=priv, parent=cfg),
                       "namespace": lambda: NamespaceSnapshotter(self.store, parent=cfg)}
            self.backends = [by_name[m]() for m in cfg.methods]
        self.lock = asyncio.Lock()
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="gpubudget-snapshot")
        self.taking = False
        self.last: dict | None = None
        self.restore_state: dict = {"state": "none"}
        if cfg.restore_on_start and self.problem is None:
            self.restore_state = {"state": "restoring", "snapshot": cfg.restore_on_start,
                                  "started_at": time.time()}

    # ------------------------------------------------------------ helpers
    @property
    def session(self) -> str:
        return self.lab.session_id

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def _service(self, method: str, path: str, body: Any = None) -> Any:
        """Tell the service (errors are logged: the snapshot stays in the store)."""
        try:
            a = await self.client.call(method, path, body=body)
        except ServiceUnavailable as e:
            self.log.warning("gpubudget: %s %s: %s", method, path, e.message)
            return None
        if a.status >= 400:
            self.log.warning("gpubudget: %s %s answered %s: %s", method, path, a.status,
                             (a.body or {}).get("message") if isinstance(a.body, dict) else a.body)
            return None
        return a.body

    async def _policy(self) -> None:
        """Retention and quota as the service says (the project's quota, less what other
        users' snapshots of the project occupy)."""
        assert self.sets is not None
        body = await self._service("GET", f"sessions/{self.session}/snapshots")
        if not isinstance(body, dict):
            return
        if isinstance(body.get("keep_last"), int) and body["keep_last"] > 0:
            self.sets.keep_last = body["keep_last"]
        quota = body.get("quota_bytes")
        if isinstance(quota, int) and quota > 0:
            self.sets.quota = max(1, quota - int(body.get("others_bytes") or 0))
        else:
            self.sets.quota = 0

    def _placement_env(self) -> tuple[tuple[str, ...], bool]:
        devs = tuple(d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d)
        return devs, bool(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))

    async def _kernels(self) -> list[tuple[str, Any, list[dict]]]:
        mkm = self.app.kernel_manager
        by_kernel: dict[str, list[dict]] = {}
        for s in await self.app.session_manager.list_sessions():
            k = (s.get("kernel") or {}).get("id")
            if k:
                by_kernel.setdefault(k, []).append(
                    {"path": s.get("path"), "name": s.get("name"), "type": s.get("type")})
        out = []
        for kid in list(mkm.list_kernel_ids()):
            km = mkm.get_kernel(kid)
            out.append((kid, km, by_kernel.get(kid, [])))
        return out

    def status(self) -> dict:
        kernels = self.app.kernel_manager.list_kernel_ids()
        return {"session": self.session or None, "enabled": self.problem is None,
                "problem": self.problem, "methods": [b.method for b in self.backends],
                "store": self.cfg.store_dir if self.problem is None else None,
                "kernels": len(kernels), "taking": self.taking, "last": self.last,
                "restore": self.restore_state}

    # ------------------------------------------------------------ taking
    async def take(self, reason: str, freeze: bool, deadline: float | None = None,
                   request: str | None = None, merge: str | None = None) -> dict:
        if self.problem:
            raise web.HTTPError(503, self.problem)
        async with self.lock:
            self.taking = True
            try:
                return await self._take(reason, freeze, deadline, request, merge)
            finally:
                self.taking = False

    async def _take(self, reason: str, freeze: bool, deadline: float | None,
                    request: str | None, merge: str | None) -> dict:
        assert self.sets is not None and self.store is not None
        await self._policy()
        t0, created = time.perf_counter(), time.time()
        set_id = self.sets.new_id(self.session)
        devices, mps = self._placement_env()
        members: list[Member] = []
        if merge:  # a retry: the kernels that earlier set saved (and ended) come along
            try:
                prev = await self._run(self.sets.load, merge)
            except SnapshotError as e:
                raise web.HTTPError(400, f"merge: {e.message}") from None
            if prev["session"] != self.session:
                raise web.HTTPError(400, f"merge: {merge} is not of this session")
            members = [Member(**x) for x in prev["members"] if x.get("snapshot")]
        carried = {m.kernel_id for m in members}
        done: list[tuple[str, Any, int]] = []  # (kernel id, km, pid) of kernels saved
        for kid, km, sessions in await self._kernels():
            if kid in carried:
                continue
            m = Member(kernel_id=kid, kernel_name=km.kernel_name or "", sessions=sessions)
            members.append(m)
            pid = getattr(km.provisioner, "pid", None) if km.provisioner else None
            if not pid:
                m.error = "the kernel has no local process (not started by this server)"
                continue
            ref = KernelRef(pid=pid, connection_file=km.connection_file, session=self.session,
                            project=self.lab.project, cwd=getattr(km.provisioner, "cwd", None)
                            and str(km.provisioner.cwd), gpu_devices=devices, mps=mps,
                            uid=os.getuid())
            left = self.cfg.timeout if deadline is None else max(5.0, deadline - time.time())
            snap, why = None, []
            # each method that can capture the kernel, in order, until one has: a CRIU dump
            # that fails (or is refused) leaves the kernel running, and the next method tries
            for b in self.backends:
                a = await self._run(b.available, ref)
                if not a.ok:
                    why.append(f"{b.method}: {a.reason}")
                    continue
                b.timeout = min(self.cfg.timeout, left)
                if b.method == "criu":
                    # frozen: stopped by the dump and left stopped until the whole set is safe
                    b.leave_running, b.keep_stopped = not freeze, freeze
                if freeze and hasattr(km, "stop_restarter"):
                    km.stop_restarter()  # it is ended once saved: not to be restarted
                try:
                    snap = await self._run(b.dump, ref)
                except SnapshotError as e:
                    why.append(f"{b.method}: {e.message}")
                    if freeze and hasattr(km, "start_restarter"):
                        km.start_restarter()  # the kernel runs on
                    continue
                backend = b
                break
            m.why_not = why
            if snap is None:
                m.error = "no snapshot method could capture this kernel: " + "; ".join(why)
                continue
            if freeze and backend.method != "criu":
                _signal(pid, signal.SIGSTOP)  # nothing it does now would be saved
            m.snapshot, m.method = snap.id, snap.method
            m.raw_bytes, m.stored_bytes = snap.raw_bytes, snap.stored_bytes
            m.seconds = float(sum(v for v in snap.seconds.values()
                                  if isinstance(v, int | float)))
            m.variables = list(snap.summary.get("variables") or [])
            m.unsaved = dict(snap.summary.get("unsaved") or {})
            done.append((kid, km, pid))
        seconds = time.perf_counter() - t0

        def resume_all() -> None:  # nothing was saved after all: the kernels go on
            for _, km, pid in done:
                if freeze:
                    _signal(pid, signal.SIGCONT)
                    if hasattr(km, "start_restarter"):
                        km.start_restarter()

        try:
            self.sets.write(set_id, session=self.session, project=self.lab.project,
                            reason=reason, members=members, created_at=created,
                            seconds=seconds, server=os.environ.get("JUPYTERHUB_SERVER_NAME", ""))
            pruned = self.sets.apply_retention(self.session)
            pruned += self.sets.make_room(set_id, self.lab.project)
        except SnapshotError as e:
            resume_all()
            raise web.HTTPError(507 if e.reason == "quota" else 500, e.message) from None
        except OSError as e:
            resume_all()
            raise web.HTTPError(500, f"the snapshot could not be written: {e}") from None
        summary = Sets.summary(self.sets.load(set_id))
        if freeze:  # saved: ended now (nothing they did after their snapshot is lost)
            for kid, _, _ in done:
                try:
                    await self.app.kernel_manager.shutdown_kernel(kid, now=True)
                except Exception:  # noqa: BLE001
                    pass
        summary["request"] = request
        await self._service("PUT", f"snapshots/{set_id}",
                            {**summary, "pruned": pruned, "request": request})
        self.last = {k: v for k, v in summary.items() if k != "members"}
        self.log.info("gpubudget: snapshot %s (%s): %d of %d kernels saved, %s, %.1f s",
                      set_id, reason, summary["saved"], summary["kernels"],
                      _words_bytes(summary["stored_bytes"]), seconds)
        return summary

    # ------------------------------------------------------------ restoring
    async def restore(self, set_id: str, *, fallback: bool = False, replace: bool = True,
                      request: str | None = None) -> dict:
        if self.problem:
            raise web.HTTPError(503, self.problem)
        async with self.lock:
            return await self._restore(set_id, fallback, replace, request)

    async def _restore(self, set_id: str, fallback: bool, replace: bool,
                       request: str | None) -> dict:
        assert self.sets is not None and self.store is not None
        t0 = time.perf_counter()
        if not ID_RE.fullmatch(set_id or ""):
            raise web.HTTPError(400, f"snapshot: {set_id!r} is not a snapshot id")
        session = ID_RE.fullmatch(set_id).group(1)  # type: ignore[union-attr]
        skipped: list[dict] = []
        chosen = set_id
        while True:
            problems = await self._run(self.sets.verify, chosen)
            kernels: list[dict] = []
            if not problems:
                manifest = await self._run(self.sets.load, chosen)
                for x in manifest["members"]:
                    kernels.append(await self._restore_member(x, replace))
                    if kernels[-1].get("verify_failed"):
                        problems = [kernels[-1]["error"]]
                        break
            if not problems:
                break
            # not used: marked bad (kept), reported; at start-up the previous one is tried
            reason = "; ".join(problems[:3])
            for k in kernels:
                if not k.get("error"):
                    await self._replace(set(k["notebooks"]), k["kernel_id"])
            await self._run(self.sets.mark_bad, chosen, reason)
            await self._service("POST", f"snapshots/{chosen}/bad", {"problem": reason})
            skipped.append({"id": chosen, "problem": reason})
            self.log.warning("gpubudget: snapshot %s failed verification and is not used: %s",
                             chosen, reason)
            if not fallback:
                raise web.HTTPError(409, f"snapshot {chosen} failed verification and was not "
                                         f"used: {reason}")
            usable, _ = await self._run(self.sets.usable, session)
            if usable is None:
                raise web.HTTPError(409, f"snapshot {set_id} failed verification ({reason}) "
                                         "and no earlier snapshot of the session verifies")
            chosen = usable["id"]
        report = {
            "snapshot": chosen, "asked": set_id, "skipped": skipped,
            "taken_at": manifest["created_at"], "reason": manifest["reason"],
            "restored_at": time.time(), "seconds": time.perf_counter() - t0,
            "kernels": kernels, "request": request,
        }
        report["summary"] = summarise(report)
        await self._service("POST", f"sessions/{self.session}/restored", report)
        self.log.info("gpubudget: restored %s: %s", chosen, report["summary"])
        return report

    async def _replace(self, paths: set[str], kernel_id: str) -> None:
        sm, mkm = self.app.session_manager, self.app.kernel_manager
        for s in await sm.list_sessions():
            if s.get("path") in paths or (s.get("kernel") or {}).get("id") == kernel_id:
                try:
                    await sm.delete_session(s["id"])
                except Exception:  # noqa: BLE001
                    pass
        if kernel_id in mkm:
            await mkm.shutdown_kernel(kernel_id, now=True)

    async def _restore_member(self, x: dict, replace: bool) -> dict:
        assert self.store is not None
        out: dict = {"kernel_id": x["kernel_id"], "kernel_name": x["kernel_name"],
                     "notebooks": [s["path"] for s in x["sessions"]], "method": x.get("method"),
                     "everything": False, "restored": [], "recomputed": {}, "lost": {},
                     "unsaved": x.get("unsaved") or {}, "notes": [], "error": None}
        if not x.get("snapshot"):
            out["error"] = f"not saved: {x.get('error') or 'no snapshot'}"
            return out
        mkm, sm = self.app.kernel_manager, self.app.session_manager
        paths = {s["path"] for s in x["sessions"] if s.get("path")}
        if replace:
            await self._replace(paths, x["kernel_id"])
        first = next(iter(sorted(paths)), None)
        path = posixpath.dirname(first) if first else ""
        snap, kid = None, None
        try:
            snap = await self._run(self.store.get, x["snapshot"])
            if snap.method == "criu":
                criu = next((b for b in self.backends if b.method == "criu"), None)
                if criu is None:
                    criu = CriuSnapshotter(self.store, privileged=Privileged(parent=self.cfg),
                                           parent=self.cfg)
                rep = await self._run(criu.restore, snap)
                conn = (await self._run(self.store.load, snap.id))["payload"]["connection"]
                kid = await mkm.start_kernel(
                    kernel_name=x["kernel_name"], path=path,
                    kernel_id=x["kernel_id"] if x["kernel_id"] not in mkm else None,
                    gpubudget_adopt={"pid": rep.kernel.pid, "connection": conn})
                out["everything"] = True
                out["notes"] = list(rep.notes) + await self._refresh_env(mkm.get_kernel(kid))
            else:
                ns = next((b for b in self.backends if b.method == "namespace"), None) or \
                    NamespaceSnapshotter(self.store, parent=self.cfg)
                kid = await mkm.start_kernel(kernel_name=x["kernel_name"], path=path)
                km = mkm.get_kernel(kid)
                if hasattr(km, "ready"):
                    await asyncio.wrap_future(km.ready) if not isinstance(
                        km.ready, asyncio.Future) else await km.ready
                target = KernelRef(pid=km.provisioner.pid, connection_file=km.connection_file,
                                   session=self.session, project=self.lab.project,
                                   uid=os.getuid())
                rep = await self._run(ns.restore, snap, target)
                out.update(restored=rep.restored, recomputed=rep.recomputed, lost=rep.lost,
                           notes=rep.notes, reimported=rep.reimported)
        except SnapshotError as e:
            out["error"] = e.message
            out["verify_failed"] = e.reason == "verify_failed"
            if kid is not None and snap is not None and snap.method != "criu":
                await self._replace(set(), kid)  # the fresh kernel it was going into
            return out
        out["kernel_id"] = kid
        for s in x["sessions"]:
            try:
                await sm.create_session(path=s["path"], name=s.get("name"),
                                        type=s.get("type") or "notebook", kernel_id=kid)
            except Exception as e:  # noqa: BLE001 - the kernel is there; say what failed
                out["notes"].append(f"could not attach {s['path']}: {e}")
        return out

    async def _refresh_env(self, km: Any) -> list[str]:
        """A CRIU-restored kernel still has its old server's environment: give it this
        server's placement, session and token (CUDA_*, GPUBUDGET_*, JUPYTERHUB_*)."""
        new = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
        code = ("(lambda e, new, pre: ([e.pop(k) for k in [k for k in e if k.startswith(pre) "
                f"and k != {provisioner.OWNER_ENV!r} "
                f"and k not in new]], e.update(new)))(__import__('os').environ, {new!r}, "
                f"{ENV_PREFIXES!r}); {provisioner.adopt_code()}")
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=30)
            reply = await kc.execute_interactive(code, silent=True, store_history=False,
                                                 timeout=30)
            ok = reply["content"]["status"] == "ok"
        except Exception:  # noqa: BLE001
            ok = False
        finally:
            kc.stop_channels()
        if not ok:
            return ["could not update the restored kernel's environment to this server's"]
        cuda = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return [f"its environment now names this server's slice (CUDA_VISIBLE_DEVICES="
                f"{cuda or 'none'})"]

    async def restore_at_start(self) -> None:
        set_id = self.cfg.restore_on_start
        if not set_id or self.problem:
            return
        self.log.info("gpubudget: restoring snapshot %s before the browser reconnects", set_id)
        try:
            report = await self.restore(set_id, fallback=True, replace=False)
            self.restore_state = {"state": "done", "snapshot": set_id, "report": report,
                                  "finished_at": time.time()}
        except web.HTTPError as e:
            msg = e.log_message or str(e)
            self.restore_state = {"state": "failed", "snapshot": set_id, "error": msg,
                                  "finished_at": time.time()}
            await self._service("POST", f"sessions/{self.session}/restored",
                                {"snapshot": None, "asked": set_id, "error": msg,
                                 "kernels": [], "summary": f"nothing restored: {msg}"})
            self.log.error("gpubudget: restoring %s failed: %s", set_id, msg)
        except Exception as e:  # noqa: BLE001 - the server must come up regardless
            self.restore_state = {"state": "failed", "snapshot": set_id,
                                  "error": f"{type(e).__name__}: {e}",
                                  "finished_at": time.time()}
            self.log.exception("gpubudget: restoring %s failed", set_id)


def summarise(report: dict) -> str:
    """One line for the user: what came back and how, kernel by kernel."""
    parts = []
    for k in report["kernels"]:
        where = ", ".join(posixpath.basename(p) for p in k["notebooks"]) or k["kernel_name"]
        if k.get("error"):
            parts.append(f"{where}: lost ({k['error']})")
        elif k.get("everything"):
            parts.append(f"{where}: everything (CRIU: the kernel's processes as they were)")
        else:
            bits = [f"{len(k['restored'])} variables restored"]
            if k["recomputed"]:
                bits.append("recomputed " + ", ".join(sorted(k["recomputed"])))
            if k["lost"]:
                bits.append("lost " + ", ".join(sorted(k["lost"])))
            parts.append(f"{where}: " + "; ".join(bits))
    if not parts:
        parts.append("no kernels were running")
    if report.get("skipped"):
        parts.append(f"(snapshot {report['asked']} failed verification; used "
                     f"{report['snapshot']})")
    return "; ".join(parts)


# ---------------------------------------------------------------- handlers
class _Base(APIHandler):
    auth_resource = AUTH_RESOURCE

    def initialize(self, mgr: SnapshotManager) -> None:
        self.mgr = mgr

    def send(self, status: int, body: Any) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body, default=str))

    def body(self) -> dict:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError as e:
            raise web.HTTPError(400, f"body: not valid JSON ({e})") from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "body: expected a JSON object")
        return body


class SnapshotsHandler(_Base):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.send(200, self.mgr.status())

    @web.authenticated
    @authorized
    async def post(self) -> None:
        b = self.body()
        reason = b.get("reason", "user")
        if reason not in REASONS:
            raise web.HTTPError(400, f"reason: one of {', '.join(REASONS)}")
        freeze = b.get("freeze", reason != "user")
        if not isinstance(freeze, bool):
            raise web.HTTPError(400, "freeze: expected true or false")
        deadline = b.get("deadline")
        if deadline is not None and (isinstance(deadline, bool)
                                     or not isinstance(deadline, int | float)):
            raise web.HTTPError(400, "deadline: expected seconds since the epoch")
        request = b.get("request")
        if request is not None and (not isinstance(request, str) or len(request) > 64):
            raise web.HTTPError(400, "request: expected a request id")
        merge = b.get("merge")
        if merge is not None and (not isinstance(merge, str) or not ID_RE.fullmatch(merge)):
            raise web.HTTPError(400, "merge: expected a snapshot id")
        if self.mgr.taking:
            raise web.HTTPError(409, "a snapshot is being taken right now")
        self.send(200, await self.mgr.take(reason, freeze, deadline, request, merge))


class RestoreHandler(_Base):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.send(200, self.mgr.restore_state)

    @web.authenticated
    @authorized
    async def post(self) -> None:
        b = self.body()
        sid = b.get("snapshot")
        if not isinstance(sid, str) or not ID_RE.fullmatch(sid):
            raise web.HTTPError(400, "snapshot: expected a snapshot id")
        request = b.get("request")
        if request is not None and (not isinstance(request, str) or len(request) > 64):
            raise web.HTTPError(400, "request: expected a request id")
        self.send(200, await self.mgr.restore(sid, request=request))


def _use_snapshot_ready_kernels(serverapp: Any, cfg: GpuBudgetSnapshots) -> None:
    if not cfg.snapshot_ready_kernels:
        return
    provisioner.LOG_DIR[0] = cfg.kernel_log_dir
    provisioner.WATCHDOG_GRACE[0] = cfg.kernel_watchdog
    from jupyter_client.provisioning.factory import KernelProvisionerFactory

    configured = "default_provisioner_name" in serverapp.config.get(
        "KernelProvisionerFactory", {})
    if configured or os.environ.get(KernelProvisionerFactory.default_provisioner_name_env):
        return  # the admin chose one
    os.environ[KernelProvisionerFactory.default_provisioner_name_env] = provisioner.NAME
    if KernelProvisionerFactory.initialized():
        KernelProvisionerFactory.instance().default_provisioner_name = provisioner.NAME


def routes(base_url: str, lab: GpuBudgetLab) -> list:
    serverapp = lab.parent
    cfg = GpuBudgetSnapshots(parent=serverapp, log=lab.log)
    mgr = SnapshotManager(serverapp, lab, cfg, ServiceClient(lab))
    serverapp.web_app.settings["gpubudget_snapshots"] = mgr
    if mgr.problem is None:
        _use_snapshot_ready_kernels(serverapp, cfg)
    kw = {"mgr": mgr}
    api = url_path_join(base_url, "gpubudget", "api")
    return [
        (url_path_join(api, "snapshots"), SnapshotsHandler, kw),
        (url_path_join(api, "restore"), RestoreHandler, kw),
    ]


async def start(serverapp: Any) -> None:
    """Runs once the server's event loop runs: the start-up restore, in the background
    (BudgetSpawner waits for it before the browser is let in)."""
    mgr = serverapp.web_app.settings.get("gpubudget_snapshots")
    if mgr is not None and mgr.restore_state.get("state") == "restoring":
        mgr._restore_task = asyncio.ensure_future(mgr.restore_at_start())
