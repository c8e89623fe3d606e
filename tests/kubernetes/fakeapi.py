"""An in-process **fake API server** for the Kubernetes backend tests (no Kubernetes cluster).

It speaks enough of the Kubernetes REST API, over real HTTP on 127.0.0.1, for the real
kubernetes-asyncio client and the real KubeSpawner:

- objects: pods, events, nodes, namespaces, services, secrets, persistentvolumeclaims,
  batch/v1 jobs, resource.k8s.io/v1 resourceclaims and resourceclaimtemplates (stored only);
- verbs: list (label and field selectors, resourceVersion), watch (chunked stream of JSON
  lines, from a resourceVersion, ``timeoutSeconds``; a resourceVersion older than the
  retained history answers an ERROR event with code **410 Gone**, as a real API server does
  after compaction), get, create (``generateName``, 409 AlreadyExists), replace (409 on a
  stale resourceVersion), patch (merge, strategic treated as merge, JSON patch), delete
  (``gracePeriodSeconds``, ``propagationPolicy`` Orphan/Background/Foreground; a Job's
  default is Orphan, as in batch/v1), owner-reference garbage collection;
- optional bearer-token authentication.

Controllers that run inside it:

- a **fake scheduler**: binds a Pending pod to a Ready, schedulable node that satisfies its
  required node affinity (``matchFields``/``matchExpressions``), node selector, required pod
  anti-affinity on the hostname and extended-resource requests (allocatable minus what the
  node's other pods hold); otherwise ``PodScheduled=False/Unschedulable`` and an event;
- a **fake kubelet**: runs each container's command as a real local process (env from the
  pod spec; the pod's ``0.0.0.0`` becomes its own loopback pod IP 127.x.y.z, standing in for
  the pod's network namespace; images are ignored) and moves the pod Pending -> Running ->
  Succeeded/Failed by the process's exit code; on deletion it runs the container's preStop
  exec hook, sends SIGTERM, waits the grace period, then SIGKILL, then removes the pod; a pod
  given ``nodeName`` directly is admitted only if its extended resources fit (else Failed
  ``OutOf<resource>``), as the kubelet does;
- a **fake Job controller**: Indexed Jobs (one pod per completion index, with
  ``JOB_COMPLETION_INDEX`` and the completion-index annotation), ``backoffLimit`` (a failed
  pod over the limit fails the Job and terminates its other pods), Complete/Failed conditions.

It is kept only for what the real control plane of tests/fixtures/k8s.py cannot do: kwok runs
no container, so no preStop hook, no SIGTERM, no grace period (a deleted pod goes at once)
and every pod of a Job ends alike. The tests that use it, each saying why:
test_fake_api_jobs.py (one part of a gang failing while the others run; a pod that outlives
its Job's deletion through SIGTERM, the grace period and SIGKILL) and
test_fake_api_notebooks.py (every KubeSpawner watch dropped at one chosen moment).
What it does not emulate is listed in docs/backends.md.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
import re
import signal
import string
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS = [
    Kind("", "v1", "pods", "Pod"), Kind("", "v1", "events", "Event"),
    Kind("", "v1", "nodes", "Node", False), Kind("", "v1", "namespaces", "Namespace", False),
    Kind("", "v1", "services", "Service"), Kind("", "v1", "secrets", "Secret"),
    Kind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
    Kind("batch", "v1", "jobs", "Job"),
    Kind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim"),
    Kind("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate"),
]
BY_PATH = {(k.group, k.version, k.plural): k for k in KINDS}
BY_KIND = {k.kind: k for k in KINDS}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


# ---------------------------------------------------------------------------- selectors


def _split_selector(sel: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in sel:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def label_match(selector: str, labels: dict[str, str]) -> bool:
    for term in _split_selector(selector or ""):
        m = re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", term)
        if m:
            vals = {v.strip() for v in m.group(3).split(",") if v.strip()}
            has = m.group(1) in labels and labels[m.group(1)] in vals
            if (m.group(2) == "in") != has:
                return False
            continue
        m = re.fullmatch(r"([^!=\s]+)\s*(==|=|!=)\s*(\S*)", term)
        if m:
            k, op, v = m.groups()
            eq = labels.get(k) == v
            if (op == "!=" and eq) or (op != "!=" and not eq):
                return False
            continue
        if term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _path(obj: dict, dotted: str) -> Any:
    cur: Any = obj
    for p in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(p)
    return cur


def field_match(selector: str, obj: dict) -> bool:
    for term in _split_selector(selector or ""):
        m = re.fullmatch(r"([^!=]+)(==|=|!=)(.*)", term)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector {term!r}")
        k, op, v = m.groups()
        val = _path(obj, k)
        eq = ("" if val is None else str(val)) == v
        if (op == "!=" and eq) or (op != "!=" and not eq):
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def json_patch(target: dict, ops: list[dict]) -> dict:
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                else:
                    parent.insert(int(last), op["value"]) if op["op"] == "add" else \
                        parent.__setitem__(int(last), op["value"])
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            else:
                parent.pop(last, None)
        else:
            raise ApiError(422, "Invalid", f"unsupported JSON patch op {op['op']!r}")
    return doc


# ---------------------------------------------------------------------------- the store


@dataclass
class Watcher:
    kind: Kind
    namespace: str | None
    labels: str
    fields: str
    queue: asyncio.Queue


@dataclass
class PodRuntime:
    proc: asyncio.subprocess.Process | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    task: asyncio.Task | None = None
    terminating: bool = False


class FakeApiServer:
    """Start with :meth:`start` (a thread with its own event loop); ``url`` is its address."""

    def __init__(self, workdir: Path, token: str | None = None,
                 run_processes: bool = True,
                 history: int = 10_000) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.run_processes = run_processes
        self.history_max = history
        self.objects: dict[str, dict[tuple[str, str], dict]] = {k.plural: {} for k in KINDS}
        self.rv = 1
        self.history: list[tuple[int, str, str, dict]] = []  # (rv, plural, type, obj)
        self.compacted = 0  # watches from a resourceVersion below this get 410 Gone
        self.watchers: list[Watcher] = []
        self.requests: list[tuple[str, str, str]] = []  # (method, path, query)
        self.kubelet_log: list[tuple[float, str, str]] = []  # (time, pod, what)
        self.runtimes: dict[tuple[str, str], PodRuntime] = {}
        self._ip_base = random.randint(64, 250)
        self._next_ip = 2
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._kick: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self.url = ""
        self.port = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FakeApiServer:
        ready = threading.Event()
        err: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve())
            except BaseException as e:  # noqa: BLE001
                err.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True, name="fake-apiserver")
        self._thread.start()
        ready.wait(30)
        if err:
            raise err[0]
        self.objects["namespaces"][("", "default")] = self._stamp(
            BY_KIND["Namespace"], {"metadata": {"name": "default"}}, "")
        return self

    async def _serve(self) -> None:
        app = web.Application(client_max_size=8 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{self.port}"
        self._kick = asyncio.Event()
        self._tasks.append(asyncio.ensure_future(self._controllers()))

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown() -> None:
            self._stopping = True
            for w in list(self.watchers):
                w.queue.put_nowait(None)
            for t in self._tasks:
                t.cancel()
            for rt in list(self.runtimes.values()):
                self._kill(rt, signal.SIGKILL)
            if self._runner is not None:
                await self._runner.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(15)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(10)

    def call(self, fn: Callable[[], Any], timeout: float = 10) -> Any:
        """Run ``fn`` on the server's loop (the store is only touched there)."""
        assert self._loop is not None

        async def wrap() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(wrap(), self._loop).result(timeout)

    # ------------------------------------------------------------------ test helpers
    def add_node(self, name: str, labels: dict[str, str] | None = None,
                 allocatable: dict[str, str] | None = None) -> dict:
        obj = {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                      **(labels or {})}},
               "spec": {},
               "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
                                          **(allocatable or {})},
                          "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110",
                                       **(allocatable or {})},
                          "conditions": [{"type": "Ready", "status": "True",
                                          "reason": "KubeletReady"}]}}
        return self.call(lambda: self._create(BY_KIND["Node"], "", obj))

    def get(self, plural: str, name: str, namespace: str = "default") -> dict | None:
        ns = "" if not BY_PATH_PLURAL[plural].namespaced else namespace
        return self.call(lambda: copy.deepcopy(self.objects[plural].get((ns, name))))

    def list(self, plural: str, selector: str = "") -> list[dict]:
        return self.call(lambda: [copy.deepcopy(o) for o in self.objects[plural].values()
                                  if label_match(selector, o["metadata"].get("labels") or {})])

    def drop_watches(self) -> None:
        """Close every open watch (as an API server restart would)."""
        def do() -> None:
            for w in list(self.watchers):
                w.queue.put_nowait(None)
        self.call(do)

    def wait_for(self, pred: Callable[[], Any], timeout: float = 30, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            got = pred()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or pred}")
            time.sleep(0.05)

    def count_requests(self, method: str, path_re: str) -> int:
        return sum(1 for m, p, _ in list(self.requests) if m == method and re.search(path_re, p))

    # ------------------------------------------------------------------ store primitives
    def _stamp(self, kind: Kind, obj: dict, namespace: str) -> dict:
        obj = copy.deepcopy(obj)
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        md = obj.setdefault("metadata", {})
        if kind.namespaced:
            md["namespace"] = namespace
        md.setdefault("uid", str(uuid.uuid4()))
        md.setdefault("creationTimestamp", now_iso())
        self.rv += 1
        md["resourceVersion"] = str(self.rv)
        return obj

    def _emit(self, kind: Kind, typ: str, obj: dict) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self.history.append((rv, kind.plural, typ, copy.deepcopy(obj)))
        if len(self.history) > self.history_max:
            drop = len(self.history) - self.history_max
            self.compacted = self.history[drop - 1][0] + 1
            del self.history[:drop]
        for w in list(self.watchers):
            if w.kind is kind and self._visible(w, obj):
                w.queue.put_nowait((typ, obj))
        if self._kick is not None:
            self._kick.set()

    def _visible(self, w: Watcher, obj: dict) -> bool:
        md = obj["metadata"]
        if w.namespace is not None and md.get("namespace") != w.namespace:
            return False
        return label_match(w.labels, md.get("labels") or {}) and field_match(w.fields, obj)

    def _create(self, kind: Kind, namespace: str, body: dict) -> dict:
        md = body.setdefault("metadata", {})
        if not md.get("name"):
            if not md.get("generateName"):
                raise ApiError(422, "Invalid", "metadata.name: Required value")
            md["name"] = md["generateName"] + "".join(
                random.choices(string.ascii_lowercase + string.digits, k=5))
        ns = namespace if kind.namespaced else ""
        if kind.namespaced and ("", ns) not in self.objects["namespaces"]:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
        if (ns, md["name"]) in self.objects[kind.plural]:
            raise ApiError(409, "AlreadyExists",
                           f'{kind.plural} "{md["name"]}" already exists')
        for k in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp"):
            md.pop(k, None)
        obj = self._stamp(kind, body, ns)
        if kind.kind == "Pod":
            obj.setdefault("status", {})
            obj["status"] = {"phase": "Pending", **{k: v for k, v in obj["status"].items()
                                                    if k != "phase"}}
            obj["spec"].setdefault("terminationGracePeriodSeconds", 30)
        elif kind.kind == "Job":
            obj["status"] = {}
            obj["spec"].setdefault("backoffLimit", 6)
            obj["spec"].setdefault("completions", 1)
            obj["spec"].setdefault("parallelism", 1)
            obj["spec"].setdefault("completionMode", "NonIndexed")
        self.objects[kind.plural][(ns, md["name"])] = obj
        self._emit(kind, "ADDED", obj)
        return obj

    def _put(self, kind: Kind, obj: dict) -> dict:
        md = obj["metadata"]
        key = (md.get("namespace", "") if kind.namespaced else "", md["name"])
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[kind.plural][key] = obj
        self._emit(kind, "MODIFIED", obj)
        if md.get("deletionTimestamp") and not md.get("finalizers") and kind.kind != "Pod":
            self._remove(kind, obj)
        return obj

    def _remove(self, kind: Kind, obj: dict) -> None:
        md = obj["metadata"]
        key = (md.get("namespace", "") if kind.namespaced else "", md["name"])
        if self.objects[kind.plural].pop(key, None) is None:
            return
        self.rv += 1
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(kind, "DELETED", gone)
        self._collect(md["uid"])

    def _dependents(self, uid: str) -> list[tuple[Kind, dict]]:
        out = []
        for k in KINDS:
            for o in self.objects[k.plural].values():
                if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or []):
                    out.append((k, o))
        return out

    def _collect(self, uid: str) -> None:
        """Garbage collection: dependents of a removed owner are deleted (background)."""
        for k, o in self._dependents(uid):
            self._delete(k, o, None, "Background")

    def _delete(self, kind: Kind, obj: dict, grace: int | None, policy: str | None) -> dict:
        md = obj["metadata"]
        if policy is None:
            policy = "Orphan" if kind.kind == "Job" else "Background"
        if policy == "Orphan":
            for k, dep in self._dependents(md["uid"]):
                d = copy.deepcopy(dep)
                d["metadata"]["ownerReferences"] = [
                    r for r in d["metadata"]["ownerReferences"] if r.get("uid") != md["uid"]]
                self._put(k, d)
        if kind.kind == "Pod":
            return self._delete_pod(obj, grace)
        if policy == "Foreground":
            deps = self._dependents(md["uid"])
            if deps:
                new = copy.deepcopy(obj)
                new["metadata"]["deletionTimestamp"] = now_iso()
                fins = new["metadata"].setdefault("finalizers", [])
                if "foregroundDeletion" not in fins:
                    fins.append("foregroundDeletion")
                new = self._put(kind, new)
                for k, d in deps:
                    self._delete(k, d, None, "Background")
                return new
        self._remove(kind, obj)
        return obj

    def _delete_pod(self, pod: dict, grace: int | None) -> dict:
        md = pod["metadata"]
        key = (md["namespace"], md["name"])
        rt = self.runtimes.get(key)
        if grace is None:
            grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        alive = rt is not None and rt.proc is not None and rt.proc.returncode is None
        if not alive or grace <= 0:
            if rt is not None:
                self._kill(rt, signal.SIGKILL)
                self.kubelet_log.append((time.time(), md["name"], "killed"))
            self.runtimes.pop(key, None)
            self._remove(BY_KIND["Pod"], pod)
            return pod
        if md.get("deletionTimestamp"):
            return pod
        new = copy.deepcopy(pod)
        new["metadata"]["deletionTimestamp"] = now_iso()
        new["metadata"]["deletionGracePeriodSeconds"] = grace
        new = self._put(BY_KIND["Pod"], new)
        assert rt is not None
        rt.terminating = True
        asyncio.ensure_future(self._terminate(key, grace))
        return new

    async def _terminate(self, key: tuple[str, str], grace: int) -> None:
        """The kubelet's graceful stop: preStop hook, SIGTERM, grace period, SIGKILL."""
        rt = self.runtimes.get(key)
        pod = self.objects["pods"].get(key)
        if rt is None or pod is None:
            return
        deadline = time.monotonic() + grace
        c = pod["spec"]["containers"][0]
        hook = ((c.get("lifecycle") or {}).get("preStop") or {}).get("exec")
        if hook:
            self.kubelet_log.append((time.time(), key[1], "preStop"))
            try:
                p = await asyncio.create_subprocess_exec(
                    *hook["command"], env=rt.env, cwd=rt.cwd,
                    stdout=open(Path(rt.cwd) / "prestop.log", "ab"),  # noqa: SIM115
                    stderr=asyncio.subprocess.STDOUT)
                try:
                    await asyncio.wait_for(p.wait(), max(0.1, deadline - time.monotonic()))
                    self.kubelet_log.append((time.time(), key[1], f"preStop exit {p.returncode}"))
                except TimeoutError:
                    p.kill()
                    self.kubelet_log.append((time.time(), key[1], "preStop timed out"))
            except OSError as e:
                self.kubelet_log.append((time.time(), key[1], f"preStop failed: {e}"))
        self.kubelet_log.append((time.time(), key[1], "SIGTERM"))
        self._kill(rt, signal.SIGTERM)
        if rt.proc is not None:
            try:
                await asyncio.wait_for(rt.proc.wait(),
                                       max(0.05, deadline - time.monotonic()))
            except TimeoutError:
                self.kubelet_log.append((time.time(), key[1], "SIGKILL"))
                self._kill(rt, signal.SIGKILL)
                await rt.proc.wait()
        self.runtimes.pop(key, None)
        pod = self.objects["pods"].get(key)
        if pod is not None:
            self._remove(BY_KIND["Pod"], pod)

    @staticmethod
    def _kill(rt: PodRuntime, sig: int) -> None:
        if rt.proc is not None and rt.proc.returncode is None:
            try:
                os.killpg(rt.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    # ------------------------------------------------------------------ HTTP
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path, request.query_string))
        try:
            if self.token is not None and \
                    request.headers.get("Authorization") != f"Bearer {self.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            review = self._review(request.method, request.path)
            if review is not None:  # the one token may do everything
                return web.json_response(review, status=201)
            kind, ns, name, sub = self._route(request.path)
            if request.method == "GET" and name is None:
                if request.query.get("watch", "").lower() in ("1", "true"):
                    return await self._watch(request, kind, ns)
                return web.json_response(self._list(kind, ns, request.query))
            if request.method == "GET":
                return web.json_response(self._get(kind, ns, name))
            body = await request.read()
            data = json.loads(body) if body else {}
            if request.method == "POST" and name is None:
                return web.json_response(self._create(kind, ns or "", data), status=201)
            if request.method == "PUT" and name is not None:
                return web.json_response(self._replace(kind, ns, name, data, sub))
            if request.method == "PATCH" and name is not None:
                return web.json_response(self._patch(kind, ns, name, data,
                                                     request.content_type, sub))
            if request.method == "DELETE" and name is not None:
                grace = request.query.get("gracePeriodSeconds", data.get("gracePeriodSeconds"))
                policy = request.query.get("propagationPolicy", data.get("propagationPolicy"))
                if data.get("orphanDependents") is True:
                    policy = "Orphan"
                obj = self._get(kind, ns, name)
                return web.json_response(self._delete(
                    kind, obj, int(grace) if grace is not None else None, policy))
            raise ApiError(405, "MethodNotAllowed", f"{request.method} {request.path}")
        except ApiError as e:
            return web.json_response(e.status(), status=e.code)
        except (ValueError, KeyError, TypeError) as e:
            err = ApiError(400, "BadRequest", f"bad request: {e}")
            return web.json_response(err.status(), status=400)

    @staticmethod
    def _review(method: str, path: str) -> dict | None:
        """SelfSubjectAccessReview (always allowed) and SelfSubjectReview answers."""
        if method != "POST":
            return None
        if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
            return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                    "spec": {}, "status": {"allowed": True}}
        if path == "/apis/authentication.k8s.io/v1/selfsubjectreviews":
            return {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
                    "status": {"userInfo": {"username": "fake-admin"}}}
        return None

    def _route(self, path: str) -> tuple[Kind, str | None, str | None, str | None]:
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["api"]:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"]:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", f"no route {path}")
        ns = None
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            ns, rest = rest[1], rest[2:]
        if not rest:
            raise ApiError(404, "NotFound", f"no route {path}")
        kind = BY_PATH.get((group, version, rest[0]))
        if kind is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested "
                                            f"resource ({path})")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        return kind, ns, name, sub

    def _key(self, kind: Kind, ns: str | None, name: str) -> tuple[str, str]:
        return (ns or "" if kind.namespaced else "", name)

    def _get(self, kind: Kind, ns: str | None, name: str) -> dict:
        obj = self.objects[kind.plural].get(self._key(kind, ns, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{kind.plural} "{name}" not found')
        return obj

    def _list(self, kind: Kind, ns: str | None, q: Any) -> dict:
        rv = q.get("resourceVersion")
        if rv not in (None, "", "0") and q.get("resourceVersionMatch") == "Exact" and \
                int(rv) < self.compacted:
            raise ApiError(410, "Expired", "too old resource version")
        items = [o for o in self.objects[kind.plural].values()
                 if (ns is None or o["metadata"].get("namespace") == ns)
                 and label_match(q.get("labelSelector", ""), o["metadata"].get("labels") or {})
                 and field_match(q.get("fieldSelector", ""), o)]
        return {"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(self.rv)}, "items": items}

    async def _watch(self, request: web.Request, kind: Kind, ns: str | None
                     ) -> web.StreamResponse:
        q = request.query
        w = Watcher(kind, ns, q.get("labelSelector", ""), q.get("fieldSelector", ""),
                    asyncio.Queue())
        rv = q.get("resourceVersion")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)

        async def send(typ: str, obj: dict) -> None:
            await resp.write(json.dumps({"type": typ, "object": obj}).encode() + b"\n")

        if rv not in (None, "", "0") and int(rv) < self.compacted:
            await send("ERROR", ApiError(410, "Expired",
                                         f"too old resource version: {rv} "
                                         f"({self.compacted})").status())
            await resp.write_eof()
            return resp
        if rv in (None, "", "0"):
            backlog = [("ADDED", o) for o in self.objects[kind.plural].values()
                       if self._visible(w, o)]
        else:
            backlog = [(t, o) for (r, p, t, o) in self.history
                       if p == kind.plural and r > int(rv) and self._visible(w, o)]
        self.watchers.append(w)
        deadline = time.monotonic() + min(float(q.get("timeoutSeconds", 1800)), 1800)
        try:
            for typ, obj in backlog:
                await send(typ, obj)
            while not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(w.queue.get(), left)
                except TimeoutError:
                    break
                if item is None:
                    break
                await send(*item)
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            if w in self.watchers:
                self.watchers.remove(w)
        return resp

    def _replace(self, kind: Kind, ns: str | None, name: str, data: dict,
                 sub: str | None) -> dict:
        cur = self._get(kind, ns, name)
        given = (data.get("metadata") or {}).get("resourceVersion")
        if given and given != cur["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified; please apply your "
                                            "changes to the latest version and try again")
        new = copy.deepcopy(data)
        keep = {k: cur["metadata"][k] for k in ("uid", "creationTimestamp", "namespace",
                                                "deletionTimestamp") if k in cur["metadata"]}
        new.setdefault("metadata", {}).update(keep)
        new["apiVersion"], new["kind"] = kind.api_version, kind.kind
        if sub != "status":
            new["status"] = cur.get("status", {})
        return self._put(kind, new)

    def _patch(self, kind: Kind, ns: str | None, name: str, data: Any, ctype: str,
               sub: str | None) -> dict:
        cur = self._get(kind, ns, name)
        if ctype == "application/json-patch+json":
            new = json_patch(cur, data)
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            new = merge_patch(cur, data)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {ctype}")
        for k in ("uid", "creationTimestamp", "namespace", "name"):
            if k in cur["metadata"]:
                new["metadata"][k] = cur["metadata"][k]
        return self._put(kind, new)

    # ------------------------------------------------------------------ controllers
    async def _controllers(self) -> None:
        assert self._kick is not None
        while not self._stopping:
            try:
                await asyncio.wait_for(self._kick.wait(), 0.5)
            except TimeoutError:
                pass
            self._kick.clear()
            try:
                self._reconcile()
            except Exception as e:  # noqa: BLE001 - a controller bug must be visible in tests
                self.kubelet_log.append((time.time(), "-", f"controller error: {e!r}"))
                raise

    def _reconcile(self) -> None:
        for job in list(self.objects["jobs"].values()):
            self._job_controller(job)
        for pod in list(self.objects["pods"].values()):
            if pod["metadata"].get("deletionTimestamp"):
                continue
            if pod["status"].get("phase") != "Pending":
                continue
            if not pod["spec"].get("nodeName"):
                self._schedule(pod)
            elif (pod["metadata"]["namespace"], pod["metadata"]["name"]) not in self.runtimes:
                self._kubelet_start(pod)
        for kind in KINDS:  # finish foreground deletions whose dependents are gone
            if kind.kind == "Pod":
                continue
            for o in list(self.objects[kind.plural].values()):
                md = o["metadata"]
                if md.get("deletionTimestamp") and "foregroundDeletion" in \
                        (md.get("finalizers") or []) and not self._dependents(md["uid"]):
                    self._remove(kind, o)

    def _event(self, pod: dict, reason: str, message: str, typ: str = "Normal") -> None:
        md = pod["metadata"]
        self._create(BY_KIND["Event"], md["namespace"], {
            "metadata": {"generateName": md["name"] + "."},
            "involvedObject": {"kind": "Pod", "name": md["name"], "namespace": md["namespace"],
                               "uid": md["uid"], "apiVersion": "v1"},
            "reason": reason, "message": message, "type": typ, "count": 1,
            "firstTimestamp": now_iso(), "lastTimestamp": now_iso(),
            "source": {"component": "fake-apiserver"}})

    # -- scheduler ---------------------------------------------------------------
    def _requests(self, pod: dict) -> dict[str, float]:
        need: dict[str, float] = {}
        for c in pod["spec"].get("containers") or []:
            res = c.get("resources") or {}
            merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
            for r, v in merged.items():
                if "/" in r:
                    need[r] = need.get(r, 0) + float(v)
        return need

    def _used(self, node: str) -> dict[str, float]:
        used: dict[str, float] = {}
        for p in self.objects["pods"].values():
            if p["spec"].get("nodeName") == node and \
                    p["status"].get("phase") not in ("Succeeded", "Failed"):
                for r, v in self._requests(p).items():
                    used[r] = used.get(r, 0) + v
        return used

    def _fits(self, pod: dict, node: dict) -> str | None:
        name = node["metadata"]["name"]
        alloc = node["status"].get("allocatable") or {}
        used = self._used(name)
        for r, v in self._requests(pod).items():
            if used.get(r, 0) + v > float(alloc.get(r, 0)):
                return f"Insufficient {r}"
        return None

    def _node_affinity_ok(self, pod: dict, node: dict) -> bool:
        spec = pod["spec"]
        labels = node["metadata"].get("labels") or {}
        for k, v in (spec.get("nodeSelector") or {}).items():
            if labels.get(k) != v:
                return False
        req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
               .get("requiredDuringSchedulingIgnoredDuringExecution"))
        if not req:
            return True
        for term in req.get("nodeSelectorTerms") or []:
            ok = True
            for e in term.get("matchFields") or []:
                ok &= self._expr(e, {"metadata.name": node["metadata"]["name"]})
            for e in term.get("matchExpressions") or []:
                ok &= self._expr(e, labels)
            if ok:
                return True
        return False

    @staticmethod
    def _expr(e: dict, values: dict[str, str]) -> bool:
        v, op, vals = values.get(e["key"]), e["operator"], e.get("values") or []
        if op == "In":
            return v in vals
        if op == "NotIn":
            return v not in vals
        if op == "Exists":
            return v is not None
        if op == "DoesNotExist":
            return v is None
        if op in ("Gt", "Lt") and v is not None:
            return int(v) > int(vals[0]) if op == "Gt" else int(v) < int(vals[0])
        return False

    def _anti_affinity_ok(self, pod: dict, node: dict) -> bool:
        terms = (((pod["spec"].get("affinity") or {}).get("podAntiAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution")) or []
        for t in terms:
            if t.get("topologyKey") != "kubernetes.io/hostname":
                continue
            sel = ",".join(f"{k}={v}" for k, v in
                           ((t.get("labelSelector") or {}).get("matchLabels") or {}).items())
            for p in self.objects["pods"].values():
                if p is pod or p["spec"].get("nodeName") != node["metadata"]["name"]:
                    continue
                if p["status"].get("phase") in ("Succeeded", "Failed"):
                    continue
                if label_match(sel, p["metadata"].get("labels") or {}):
                    return False
        return True

    def _schedule(self, pod: dict) -> None:
        why = []
        for node in sorted(self.objects["nodes"].values(), key=lambda n: n["metadata"]["name"]):
            name = node["metadata"]["name"]
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in node["status"].get("conditions") or [])
            if not ready:
                why.append(f"{name}: not ready")
                continue
            if node.get("spec", {}).get("unschedulable"):
                why.append(f"{name}: unschedulable")
                continue
            if not self._node_affinity_ok(pod, node):
                why.append(f"{name}: node affinity/selector")
                continue
            if not self._anti_affinity_ok(pod, node):
                why.append(f"{name}: pod anti-affinity")
                continue
            short = self._fits(pod, node)
            if short:
                why.append(f"{name}: {short}")
                continue
            new = copy.deepcopy(pod)
            new["spec"]["nodeName"] = name
            new["status"]["conditions"] = [{"type": "PodScheduled", "status": "True",
                                            "lastTransitionTime": now_iso()}]
            self._put(BY_KIND["Pod"], new)
            self._event(new, "Scheduled", f"Successfully assigned "
                                          f"{pod['metadata']['namespace']}/"
                                          f"{pod['metadata']['name']} to {name}")
            return
        self._unschedulable(pod, "; ".join(why) or "no nodes")

    def _unschedulable(self, pod: dict, msg: str) -> None:
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": msg}
        old = [c for c in pod["status"].get("conditions") or [] if c.get("type") == "PodScheduled"]
        if old and old[0].get("message") == msg:
            return
        new = copy.deepcopy(pod)
        new["status"]["conditions"] = [cond]
        self._put(BY_KIND["Pod"], new)
        self._event(new, "FailedScheduling", msg, "Warning")

    # -- kubelet -----------------------------------------------------------------
    def _pod_ip(self) -> str:
        n = self._next_ip
        self._next_ip += 1
        return f"127.{self._ip_base}.{n // 250}.{n % 250 + 2}"

    def _kubelet_start(self, pod: dict) -> None:
        md = pod["metadata"]
        key = (md["namespace"], md["name"])
        node = self.objects["nodes"].get(("", pod["spec"]["nodeName"]))
        if node is None:
            return
        bound_by_us = any(c.get("type") == "PodScheduled" and c.get("status") == "True"
                          for c in pod["status"].get("conditions") or [])
        if not bound_by_us:  # nodeName given directly: the kubelet's own admission
            short = self._fits_excluding(pod, node)
            if short:
                new = copy.deepcopy(pod)
                res = short.split(" ", 1)[1]
                new["status"].update({"phase": "Failed", "reason": f"OutOf{res}",
                                      "message": f"Pod was rejected: Node didn't have enough "
                                                 f"resource: {res}"})
                self._put(BY_KIND["Pod"], new)
                self._event(new, f"OutOf{res}", new["status"]["message"], "Warning")
                return
        ip = self._pod_ip()
        rt = PodRuntime()
        self.runtimes[key] = rt
        cwd = self.workdir / f"{md['namespace']}_{md['name']}"
        cwd.mkdir(parents=True, exist_ok=True)
        rt.cwd = str(cwd)
        c = pod["spec"]["containers"][0]

        def subst(s: str) -> str:
            return s.replace("0.0.0.0", ip)

        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd),
               "HOSTNAME": pod["spec"].get("hostname") or md["name"]}
        for e in c.get("env") or []:
            if "value" in e:
                env[e["name"]] = subst(str(e["value"]))
            elif "valueFrom" in e and "fieldRef" in e["valueFrom"]:
                fp = e["valueFrom"]["fieldRef"]["fieldPath"]
                env[e["name"]] = {"status.podIP": ip}.get(fp) or str(_path(pod, fp) or "")
        rt.env = env
        argv = [subst(a) for a in (c.get("command") or []) + (c.get("args") or [])]
        now = now_iso()
        new = copy.deepcopy(pod)
        new["status"].update({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                              "hostIP": "127.0.0.1", "startTime": now})
        new["status"]["conditions"] = (new["status"].get("conditions") or []) + [
            {"type": "Ready", "status": "True", "lastTransitionTime": now}]
        new["status"]["containerStatuses"] = [{
            "name": c["name"], "ready": True, "restartCount": 0, "image": c.get("image", ""),
            "imageID": "", "started": True, "state": {"running": {"startedAt": now}}}]
        self._put(BY_KIND["Pod"], new)
        self._event(new, "Started", f"Started container {c['name']}")
        self.kubelet_log.append((time.time(), md["name"], "started"))
        rt.task = asyncio.ensure_future(self._run(key, argv, env, str(cwd)))

    def _fits_excluding(self, pod: dict, node: dict) -> str | None:
        alloc = node["status"].get("allocatable") or {}
        used: dict[str, float] = {}
        for p in self.objects["pods"].values():
            if p is not pod and p["spec"].get("nodeName") == node["metadata"]["name"] and \
                    p["status"].get("phase") not in ("Succeeded", "Failed", "Pending"):
                for r, v in self._requests(p).items():
                    used[r] = used.get(r, 0) + v
        for r, v in self._requests(pod).items():
            if used.get(r, 0) + v > float(alloc.get(r, 0)):
                return f"Insufficient {r}"
        return None

    async def _run(self, key: tuple[str, str], argv: list[str], env: dict[str, str],
                   cwd: str) -> None:
        rt = self.runtimes[key]
        log = open(Path(cwd) / "container.log", "ab")  # noqa: SIM115
        code: int
        if not self.run_processes or not argv:
            code = 0
        else:
            try:
                rt.proc = await asyncio.create_subprocess_exec(
                    *argv, env=env, cwd=cwd, stdout=log, stderr=asyncio.subprocess.STDOUT,
                    stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
                code = await rt.proc.wait()
            except OSError as e:
                log.write(f"fake kubelet: cannot start {argv}: {e}\n".encode())
                code = 128
        log.close()
        if code < 0:
            code = 128 - code  # killed by a signal: the container runtime reports 128+N
        self.kubelet_log.append((time.time(), key[1], f"exited {code}"))
        pod = self.objects["pods"].get(key)
        if pod is None:
            return
        if rt.terminating:
            return  # _terminate removes it
        self.runtimes.pop(key, None)
        new = copy.deepcopy(pod)
        new["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        new["status"]["conditions"] = [c for c in new["status"].get("conditions") or []
                                       if c.get("type") != "Ready"] + [
            {"type": "Ready", "status": "False", "reason": "PodCompleted"}]
        cs = new["status"]["containerStatuses"][0]
        cs["ready"] = False
        cs["started"] = False
        cs["state"] = {"terminated": {"exitCode": code,
                                      "reason": "Completed" if code == 0 else "Error",
                                      "finishedAt": now_iso()}}
        self._put(BY_KIND["Pod"], new)

    # -- Job controller ------------------------------------------------------------
    def _job_controller(self, job: dict) -> None:
        md, spec = job["metadata"], job["spec"]
        if md.get("deletionTimestamp"):
            return
        st = job.get("status") or {}
        if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in st.get("conditions") or []):
            return
        pods = [p for p in self.objects["pods"].values()
                if any(r.get("uid") == md["uid"] for r in p["metadata"].get("ownerReferences")
                       or [])]
        indexed = spec.get("completionMode") == "Indexed"
        completions = int(spec.get("completions", 1))
        failed = [p for p in pods if p["status"].get("phase") == "Failed"]
        succeeded = [p for p in pods if p["status"].get("phase") == "Succeeded"]
        active = [p for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")]
        done_idx = sorted({int(p["metadata"]["annotations"].get(
            "batch.kubernetes.io/job-completion-index", -1)) for p in succeeded})
        new_status: dict[str, Any] = {"startTime": st.get("startTime") or now_iso(),
                                      "active": len(active), "succeeded": len(succeeded),
                                      "failed": len(failed)}
        if indexed and done_idx:
            new_status["completedIndexes"] = ",".join(str(i) for i in done_idx)
        conds = []
        if len(failed) > int(spec.get("backoffLimit", 6)):
            conds = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                      "message": "Job has reached the specified backoff limit",
                      "lastTransitionTime": now_iso()}]
            for p in active:
                self._delete_pod(p, None)
        elif (len(done_idx) if indexed else len(succeeded)) >= completions:
            conds = [{"type": "Complete", "status": "True", "lastTransitionTime": now_iso()}]
            new_status["completionTime"] = now_iso()
        else:
            have = {int(p["metadata"]["annotations"].get(
                "batch.kubernetes.io/job-completion-index", -1)) for p in active + succeeded}
            want = [i for i in range(completions) if i not in have] if indexed else \
                [-1] * max(0, min(int(spec.get("parallelism", 1)),
                                  completions - len(succeeded)) - len(active))
            for i in want[: max(0, int(spec.get("parallelism", 1)) - len(active))]:
                self._job_pod(job, i)
                new_status["active"] += 1
        if conds:
            new_status["conditions"] = conds
            new_status["active"] = 0 if conds[0]["type"] == "Complete" else len(active)
        if {k: st.get(k) for k in new_status} != new_status:
            j = copy.deepcopy(job)
            j["status"] = {**st, **new_status}
            self._put(BY_KIND["Job"], j)

    def _job_pod(self, job: dict, index: int) -> None:
        md = job["metadata"]
        tpl = copy.deepcopy(job["spec"]["template"])
        pmd = tpl.setdefault("metadata", {})
        labels = pmd.setdefault("labels", {})
        labels.update({"batch.kubernetes.io/job-name": md["name"], "job-name": md["name"],
                       "batch.kubernetes.io/controller-uid": md["uid"],
                       "controller-uid": md["uid"]})
        ann = pmd.setdefault("annotations", {})
        base = md["name"]
        if index >= 0:
            labels["batch.kubernetes.io/job-completion-index"] = str(index)
            ann["batch.kubernetes.io/job-completion-index"] = str(index)
            base = f"{md['name']}-{index}"
            tpl["spec"]["hostname"] = base
            for c in tpl["spec"]["containers"]:
                c.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX",
                                                "value": str(index)})
        pmd["generateName"] = base + "-"
        pmd["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": md["name"],
                                   "uid": md["uid"], "controller": True,
                                   "blockOwnerDeletion": True}]
        self._create(BY_KIND["Pod"], md["namespace"], {"metadata": pmd, "spec": tpl["spec"]})


BY_PATH_PLURAL = {k.plural: k for k in KINDS}


def kubeconfig(url: str, token: str | None, namespace: str = "default") -> str:
    user: dict = {"token": token} if token else {}
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": user}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                  "namespace": namespace}}]})
