"""Pods on the real control plane as the tests watch them (tests/fixtures/k8s.py says which parts
are real): :class:`PodEvents` follows a real watch of the API server and keeps every event, so a
test can read what a deletion asked for (``deletionGracePeriodSeconds``) even though kwok removes
a deleted pod at once; :class:`LoopbackRuntime` plays the container runtime kwok lacks for
notebook pods: when kwok reports a pod Running it runs the pod's own command with the pod's own
environment as a local process (so JupyterHub reaches a real single-user server), and stops it
when the pod is deleted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fixtures.k8s import ControlPlane


@dataclass
class PodEvent:
    type: str  # ADDED, MODIFIED, DELETED
    pod: dict

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]

    @property
    def deleting(self) -> bool:
        return bool(self.pod["metadata"].get("deletionTimestamp"))


class PodEvents(threading.Thread):
    """One real watch of the pods of ``namespace`` (``selector``), from the moment of the
    start on; each event goes to ``on_event`` (in order, on this thread) and into
    :attr:`events`. A watch that times out is resumed from its last resourceVersion."""

    def __init__(self, k8s: ControlPlane, namespace: str, selector: str = "",
                 on_event: Callable[[PodEvent], None] | None = None) -> None:
        super().__init__(daemon=True, name=f"pod-events-{namespace}")
        self.k8s, self.ns, self.selector, self.on_event = k8s, namespace, selector, on_event
        self.events: list[PodEvent] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()
        path = f"/api/v1/namespaces/{namespace}/pods"
        self.path = path
        q = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        self.rv = k8s.admin.get(path + q)["metadata"]["resourceVersion"]

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self._watch_once()
        except BaseException as e:  # noqa: BLE001 - reported by check()
            self.error = e

    def _watch_once(self) -> None:
        q = {"watch": "1", "resourceVersion": self.rv, "timeoutSeconds": "2"}
        if self.selector:
            q["labelSelector"] = self.selector
        req = urllib.request.Request(f"{self.k8s.url}{self.path}?{urllib.parse.urlencode(q)}")
        req.add_header("Authorization", f"Bearer {self.k8s.admin_token}")
        with urllib.request.urlopen(req, context=self.k8s.admin.ctx, timeout=30) as r:
            for line in r:
                ev = json.loads(line)
                if ev["type"] == "ERROR":
                    raise AssertionError(f"the pod watch failed: {ev['object']}")
                if ev["type"] == "BOOKMARK":
                    continue
                e = PodEvent(ev["type"], ev["object"])
                self.rv = e.pod["metadata"]["resourceVersion"]
                self.events.append(e)
                if self.on_event is not None:
                    self.on_event(e)

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the pod watch stopped: {self.error!r}")

    def grace_asked(self, name: str) -> int | None:
        """The grace period the pod's deletion asked for, as the API server recorded it
        (the first event that shows the pod being deleted)."""
        for e in self.events:
            if e.name == name and e.deleting:
                return e.pod["metadata"].get("deletionGracePeriodSeconds")
        return None

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


@dataclass
class LoopbackRuntime:
    """The container runtime for notebook pods (kwok runs no process): a pod kwok marks
    Running gets its first container's ``command`` + ``args`` run here with the container's
    ``env`` (plain values) in a directory of its own; a pod being deleted or gone gets its
    process stopped (SIGTERM, then SIGKILL after ``grace`` seconds). Events are handled in
    their order, so a deleted pod's process is gone before a later pod's starts."""

    workdir: Path
    base_env: dict[str, str]
    grace: float = 10
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    log: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, e: PodEvent) -> None:
        name = e.name
        if e.type == "DELETED" or e.deleting:
            self._stop(name)
        elif (e.pod.get("status") or {}).get("phase") == "Running" and name not in self.procs:
            self._start(name, e.pod)

    def _start(self, name: str, pod: dict) -> None:
        c = pod["spec"]["containers"][0]
        argv = [*(c.get("command") or []), *(c.get("args") or [])]
        env = {**self.base_env, **{v["name"]: v["value"] for v in c.get("env") or []
                                   if "value" in v}}
        d = self.workdir / name
        d.mkdir(parents=True, exist_ok=True)
        env["HOME"] = str(d)
        out = open(d / "container.log", "ab")  # noqa: SIM115 - the process keeps it
        self.procs[name] = subprocess.Popen(argv, cwd=d, env=env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self.log.append((name, "started"))

    def _stop(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(self.grace)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        self.log.append((name, f"exited {p.returncode}"))

    def logtail(self, name: str, n: int = 4000) -> str:
        p = self.workdir / name / "container.log"
        return p.read_text(errors="replace")[-n:] if p.exists() else ""

    def close(self) -> None:
        for name in list(self.procs):
            self._stop(name)


def env_of(pod: dict) -> dict[str, Any]:
    return {x["name"]: x.get("value") for x in pod["spec"]["containers"][0].get("env") or []}
