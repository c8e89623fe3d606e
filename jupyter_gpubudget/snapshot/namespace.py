"""The kernel-namespace backend: portable (MIG, MPS, another node), driven from outside the
kernel through jupyter_client. The work inside the kernel is :mod:`nskernel`'s."""

from __future__ import annotations

import json
import time
from pathlib import Path

from traitlets import Float, Int
from traitlets.config import LoggingConfigurable

from . import kernels
from .base import Availability, KernelRef, RestoreReport, Snapshot, SnapshotError
from .store import Store

MODULE = "_gpubudget_snapshot"


def kernel_source() -> str:
    """The source executed in the kernel: chunkio, then nskernel, as one module."""
    here = Path(__file__).parent
    parts = []
    for name in ("chunkio.py", "nskernel.py"):
        text = (here / name).read_text()
        parts.append("\n".join(ln for ln in text.splitlines()
                               if not ln.startswith("from __future__ import")))
    return "from __future__ import annotations\n" + "\n".join(parts)


def _call(function: str, *args: object) -> str:
    """One expression statement that (re)loads the helper module and calls it: it binds no
    name in the user's namespace and, run silently, leaves no trace in the history."""
    src = kernel_source()
    return (
        f"(lambda m: (exec(compile({src!r}, '<gpubudget-snapshot>', 'exec'), m.__dict__), "
        f"m.{function}(*{args!r})))(__import__('sys').modules.setdefault({MODULE!r}, "
        f"__import__('types').ModuleType({MODULE!r})));")


class NamespaceSnapshotter(LoggingConfigurable):
    """Serialise the kernel's user namespace (pickle protocol 5, buffers out of band, straight
    into the store's chunks) plus its cell history; restore into a fresh kernel."""

    method = "namespace"
    timeout = Float(600.0, help="Seconds a dump or restore may take inside the kernel.").tag(
        config=True)
    threads = Int(0, help="Threads hashing, compressing and writing chunks in the kernel "
                  "(0: up to 4, as many as CPUs).").tag(config=True)


    def __init__(self, store: Store, **kw) -> None:  # noqa: ANN003
        super().__init__(**kw)
        self.store = store

    def capabilities(self) -> dict:
        return {"method": self.method, "whole_process": False, "gpu_memory": "tensors to CPU",
                "mig": True, "mps": True, "other_node": True,
                "restores_into": "a fresh kernel"}

    def available(self, kernel: KernelRef) -> Availability:
        if not kernels.answers(kernel):
            return Availability(False, "the kernel does not answer on its connection file")
        return Availability(True)

    def _options(self) -> dict:
        return {"threads": self.threads or None, "compress": self.store.compress_arg,
                "fsync": self.store.fsync}

    def dump(self, kernel: KernelRef) -> Snapshot:
        staging = self.store.begin(kernel.session, kernel.project, self.method)
        t0 = time.perf_counter()
        kc = kernels.client(kernel)
        try:
            r = kernels.execute(kc, _call("dump", staging.chunk_root, self._options()),
                                silent=True, timeout=self.timeout,
                                user_expressions={"p": f"__import__('sys').modules[{MODULE!r}]"
                                                  ".last_json"})
        except SnapshotError as e:
            self.store.abort(staging)
            raise SnapshotError("dump_failed", f"namespace dump: {e.message}") from None
        finally:
            kc.stop_channels()
        if r.status != "ok":
            self.store.abort(staging)
            raise SnapshotError("dump_failed", f"namespace dump failed in the kernel: {r.error}")
        payload = json.loads(kernels.expression_str(r.expressions.get("p")))
        fresh = payload.pop("fresh", None) or {}
        t_kernel = time.perf_counter() - t0
        refs = list(payload["stream"]) + [ref for b in payload["buffers"] for ref in b]
        summary = {"variables": sorted(payload["variables"]), "unsaved": payload["unsaved"],
                   "modules": payload["modules"], "cells": len(payload["cells"]) - 1,
                   "pickler": payload["pickler"], "gpu_tensors": payload["gpu_tensors"]}
        return self.store.commit(
            staging, payload, refs, raw_bytes=payload["raw_bytes"],
            written_bytes=payload["written_bytes"],
            seconds={"kernel": t_kernel, **{f"kernel_{k}": v
                                            for k, v in payload["seconds"].items()}},
            summary=summary, fresh=fresh)

    def restore(self, snapshot: Snapshot, target: KernelRef | None = None) -> RestoreReport:
        if target is None:
            raise SnapshotError("bad_input", "target: the namespace backend restores into a "
                                "fresh kernel; none was given")
        problems = self.store.verify(snapshot.id, deep=False)  # chunks are checked as read
        if problems:
            self.store.mark_bad(snapshot.id, "; ".join(problems[:5]))
            raise SnapshotError("verify_failed", f"snapshot {snapshot.id}: {problems[0]}")
        t0 = time.perf_counter()
        kc = kernels.client(target)
        try:
            r = kernels.execute(kc, _call("restore", self.store.chunk_root, snapshot.manifest,
                                          self._options()),
                                silent=True, timeout=self.timeout,
                                user_expressions={"r": f"__import__('sys').modules[{MODULE!r}]"
                                                  ".last_json"})
        finally:
            kc.stop_channels()
        if r.status != "ok":
            if "ChunkError" in r.error:
                self.store.mark_bad(snapshot.id, r.error.splitlines()[0])
                raise SnapshotError("verify_failed", f"snapshot {snapshot.id}: {r.error}")
            raise SnapshotError("restore_failed", f"namespace restore failed: {r.error}")
        rep = json.loads(kernels.expression_str(r.expressions.get("r")))
        return RestoreReport(
            snapshot_id=snapshot.id, method=self.method, kernel=target, everything=False,
            restored=rep["restored"], recomputed=rep["recomputed"], lost=rep["lost"],
            reimported=rep["reimported"], notes=rep["notes"],
            seconds={"total": time.perf_counter() - t0,
                     **{f"kernel_{k}": v for k, v in rep["seconds"].items()}})
