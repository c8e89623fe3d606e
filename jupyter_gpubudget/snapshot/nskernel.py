"""The part of the namespace backend that runs inside the kernel.

Its source (with :mod:`chunkio`'s before it) is sent to the kernel by
:class:`~jupyter_gpubudget.snapshot.namespace.NamespaceSnapshotter` and executed there as the
module ``_gpubudget_snapshot``; it needs only the standard library. It uses, when the kernel has
them: ``cloudpickle`` (functions and classes defined in cells), ``zstandard`` (compression) and
``torch`` (tensors are saved as CPU arrays; only when the kernel already imported torch).

Dump: the user namespace (without IPython's own names) is pickled with protocol 5; every
contiguous buffer (numpy arrays, pandas blocks, tensors moved to CPU) goes out of band, straight
from the object's memory into chunks, never copied into the pickle. Objects that cannot be
pickled are found one by one and listed with the reason; the cell history goes along.

Restore: the buffers are read back into writable memory the objects then use without another
copy; modules are imported again; a lost variable is recomputed by replaying the last cell that
bound it only when that replay is safe (see :func:`replay_verdict`), else it is reported lost.
"""

from __future__ import annotations

import ast
import io
import json
import pickle
import sys
import time
import types

if __name__ != "_gpubudget_snapshot":  # imported in the package; in the kernel, chunkio's
    from .chunkio import ChunkWriter, read_refs  # source is sent before this one

FORMAT = "gpubudget-namespace/1"
IPYTHON_NAMES = {"In", "Out", "exit", "quit", "get_ipython"}
# calls that a replayed cell must not make: they change things outside the kernel
UNSAFE_CALLS = {
    "write", "writelines", "remove", "unlink", "rmdir", "removedirs", "rmtree", "rename",
    "renames", "copyfile", "copytree", "system", "popen", "Popen", "run", "call",
    "check_call", "check_output", "spawn", "fork", "kill", "send", "sendall", "sendto", "post",
    "put", "patch", "delete", "request", "urlopen", "urlretrieve", "save", "savez",
    "savez_compressed", "savetxt", "tofile", "dump", "to_csv", "to_parquet", "to_pickle",
    "to_sql", "to_hdf", "to_json", "to_excel", "to_feather", "mkdir", "makedirs", "touch",
    "truncate", "chmod", "chown", "symlink", "link", "exec", "eval", "compile", "__import__",
    "input", "sleep", "connect", "execute", "commit", "upload", "download", "fit", "train",
    "backward", "step", "cuda", "to",
}
STATEMENTS = {"Expr": "an expression statement", "For": "a for loop", "AsyncFor": "a for loop",
              "While": "a while loop", "If": "an if statement", "With": "a with block",
              "AsyncWith": "a with block", "Try": "a try block", "AugAssign": "an augmented "
              "assignment", "Delete": "a del statement"}
# harmless on most objects, but not on these modules (os.replace, shutil.copy ...)
UNSAFE_MODULE_CALLS = {"os", "shutil", "subprocess", "socket", "requests", "urllib", "pathlib"}


def _user_names(ip) -> dict:  # noqa: ANN001
    hidden = ip.user_ns_hidden
    out = {}
    for k, v in ip.user_ns.items():
        if k.startswith("_") or k in IPYTHON_NAMES:
            continue
        if k in hidden and hidden[k] is v:
            continue
        out[k] = v
    return out


def _torch():  # noqa: ANN202
    return sys.modules.get("torch")  # never imported here: only if the user's code did


def _rebuild_tensor(array, dtype: str, requires_grad: bool, parameter: bool,
                    device: str, as_int: bool):  # noqa: ANN001, ANN201
    import torch

    t = torch.from_numpy(array)
    if as_int:  # bfloat16 and friends travel as raw integers of the same width
        t = t.view(getattr(torch, dtype))
    if device != "cpu":
        try:
            t = t.to(device)
        except Exception:  # noqa: BLE001 - no such device here: stays on the CPU
            pass
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad) if requires_grad else t


_BASE = pickle.Pickler
try:
    import cloudpickle

    _BASE = cloudpickle.Pickler
    PICKLER = f"cloudpickle {cloudpickle.__version__}"
except ImportError:
    cloudpickle = None
    PICKLER = "pickle"


class _Pickler(_BASE):
    """Protocol 5 pickler: buffers out of band, torch tensors as CPU numpy arrays."""

    devices: dict

    def reducer_override(self, obj):  # noqa: ANN001, ANN201
        torch = _torch()
        if torch is not None and isinstance(obj, torch.Tensor) and type(obj) in (
                torch.Tensor, torch.nn.Parameter) and not obj.is_sparse:
            t = obj.detach()
            device = str(t.device)
            if device != "cpu":
                self.devices[device] = self.devices.get(device, 0) + 1
                t = t.cpu()
            t = t.contiguous()
            dtype = str(t.dtype).split(".")[-1]
            as_int = False
            try:
                arr = t.numpy()
            except TypeError:  # no numpy dtype (bfloat16 ...): carry the raw bits
                width = t.element_size()
                arr = t.view({1: torch.int8, 2: torch.int16, 4: torch.int32,
                              8: torch.int64}[width]).numpy()
                as_int = True
            return (_rebuild_tensor, (arr, dtype, bool(obj.requires_grad),
                                      isinstance(obj, torch.nn.Parameter), device, as_int))
        if cloudpickle is not None:
            return super().reducer_override(obj)
        return NotImplemented


class _Sink:
    def write(self, b) -> int:  # noqa: ANN001
        return len(b)


def _pickle(obj, buffers: list | None, devices: dict, out) -> None:  # noqa: ANN001
    def keep(pb) -> bool:  # noqa: ANN001
        try:
            m = pb.raw()
        except BufferError:
            return True  # not contiguous: in band
        if buffers is not None:
            buffers.append(m)
        return False

    p = _Pickler(out, protocol=5, buffer_callback=keep)
    p.devices = devices
    p.dump(obj)


def _source(obj) -> str | None:  # noqa: ANN001
    import inspect

    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None


last_json = ""  # the last dump's payload or restore's report, read back as a user expression


def dump(chunk_root: str, options: dict) -> None:
    """Write the namespace's chunks into ``chunk_root``; its description (JSON) is left in
    ``last_json``."""
    global last_json
    from IPython import get_ipython

    t0 = time.perf_counter()
    ip = get_ipython()
    names = _user_names(ip)
    modules, values, unsaved, sources, types_ = {}, {}, {}, {}, {}
    for k, v in names.items():
        if isinstance(v, types.ModuleType):
            if v.__name__ in sys.modules and v.__name__ != "__main__":
                modules[k] = v.__name__
            else:
                unsaved[k] = f"module {v.__name__!r} is not importable by name"
            continue
        values[k] = v
        types_[k] = f"{type(v).__module__}.{type(v).__qualname__}"
        if isinstance(v, (types.FunctionType, type)) and getattr(v, "__module__", "") in (
                "__main__", None):
            src = _source(v)
            if src is not None:
                sources[k] = src
    devices: dict = {}
    # the whole namespace in one pickle keeps shared references; when it fails, find every
    # culprit by pickling each variable alone (buffers are not copied: this is cheap)
    try:
        _pickle(values, None, {}, _Sink())
    except Exception:  # noqa: BLE001 - any object may raise anything from __reduce__
        for k in list(values):
            try:
                _pickle(values[k], None, {}, _Sink())
            except Exception as e:  # noqa: BLE001
                unsaved[k] = f"{type(e).__name__}: {e}"[:500]
                del values[k]
    buffers: list = []
    stream = io.BytesIO()
    _pickle(values, buffers, devices, stream)
    t_pickle = time.perf_counter() - t0
    w = ChunkWriter(chunk_root, threads=options.get("threads"),
                    compress=options.get("compress", "auto"), fsync=options.get("fsync", True))
    try:
        fut_stream = w.put(stream.getbuffer())
        fut_bufs = [w.put(b) for b in buffers]
        refs_stream = w.refs(fut_stream)
        refs_bufs = [w.refs(f) for f in fut_bufs]
    except BaseException:
        w.abandon()
        raise
    w.close()
    del buffers
    hm = ip.history_manager
    cells = list(hm.input_hist_raw)
    payload = {
        "format": FORMAT, "python": sys.version.split()[0], "pickler": PICKLER,
        "stream": refs_stream, "buffers": refs_bufs, "variables": types_,
        "unsaved": unsaved, "modules": modules, "sources": sources,
        "cells": cells, "execution_count": ip.execution_count,
        "gpu_tensors": devices,
        "raw_bytes": w.raw_bytes, "written_bytes": w.written_bytes, "reused_chunks": w.reused,
        "direct_bytes": w.direct_bytes,
        "fresh": w.fresh,
        "seconds": {"pickle": t_pickle, "total": time.perf_counter() - t0,
                    **{f"busy_{k}": v for k, v in w.busy.items()}},
    }
    last_json = json.dumps(payload)


# ------------------------------------------------------------------ restore
def _bound_names(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out.add((a.asname or a.name).split(".")[0])
    return out


def _top_bound(tree: ast.Module) -> set[str]:
    """Names a cell binds at top level other than by import (what replaying it would
    overwrite; importing a module again changes nothing)."""
    out: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(stmt.name)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue
        else:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    out.add(node.id)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                     ast.Lambda)):
                    break
    return out


def _call_name(node: ast.Call) -> str:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return ""


def _open_writes(node: ast.Call) -> bool:
    mode = node.args[1] if len(node.args) > 1 else None
    for kw in node.keywords:
        if kw.arg == "mode":
            mode = kw.value
    if mode is None:
        return False
    if not isinstance(mode, ast.Constant) or not isinstance(mode.value, str):
        return True  # a computed mode: assume the worst
    return any(c in mode.value for c in "wax+")


def replay_verdict(code: str, restored: set[str]) -> str | None:
    """Why replaying this (already transformed) cell is not safe, or None when it is.

    Safe means: only imports, definitions and plain assignments at top level; no call that
    changes anything outside the kernel (files, processes, network, devices: ``UNSAFE_CALLS``,
    ``open`` for writing, shell and magics); and it rebinds no variable that was restored
    (that would overwrite a newer value)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return f"does not parse ({e.msg})"
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name == "get_ipython" or name.startswith("run_line_magic") or name in (
                    "run_cell_magic", "system", "getoutput"):
                return "runs a magic or shell command"
            if name == "open" and _open_writes(node):
                return "opens a file for writing"
            f = node.func
            if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                    and f.value.id in UNSAFE_MODULE_CALLS and not f.attr.startswith(("get", "is"))):
                return f"calls {f.value.id}.{f.attr}(), which may change something outside"
            if name in UNSAFE_CALLS:
                return f"calls {name}(), which may change something outside the kernel"
    for stmt in tree.body:
        if not isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign,
                                 ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue
            kind = STATEMENTS.get(type(stmt).__name__, type(stmt).__name__.lower() + " statement")
            return f"has {kind} at top level (run for its effects)"
    clobbers = sorted(_top_bound(tree) & restored)
    if clobbers:
        return f"would overwrite restored variables {', '.join(clobbers)}"
    return None


def restore(chunk_root: str, manifest_path: str, options: dict) -> None:
    """Restore a namespace snapshot into this (fresh) kernel; the report (JSON) is left in
    ``last_json``. A chunk that is missing or corrupt raises (nothing is restored then)."""
    global last_json
    from IPython import get_ipython

    t0 = time.perf_counter()
    ip = get_ipython()
    with open(manifest_path) as f:
        payload = json.load(f)["payload"]
    if payload.get("format") != FORMAT:
        raise ValueError(f"not a namespace snapshot: format {payload.get('format')!r}")
    ns = ip.user_ns
    restored: list[str] = []
    recomputed: dict[str, str] = {}
    lost: dict[str, str] = {}
    reimported: list[str] = []
    notes: list[str] = []
    # 1. values
    values: dict = {}
    stream = read_refs(chunk_root, payload["stream"])  # checked chunk by chunk: raises
    bufs = [read_refs(chunk_root, refs) for refs in payload["buffers"]]
    t_read = time.perf_counter() - t0
    try:
        values = pickle.loads(stream, buffers=bufs)
        del stream, bufs
    except Exception as e:  # noqa: BLE001 - report and fall back to sources and cells
        notes.append(f"the saved values could not be loaded ({type(e).__name__}: {e}); "
                     "falling back to definitions and cell history")
        values = {}
    ns.update(values)
    restored = sorted(values)
    if payload.get("gpu_tensors"):
        notes.append("tensors saved from " + ", ".join(sorted(payload["gpu_tensors"]))
                     + " were moved back where that device exists, else kept on the CPU")
    # 2. modules
    import importlib

    for name, mod in sorted(payload.get("modules", {}).items()):
        try:
            ns[name] = importlib.import_module(mod)
            reimported.append(name)
        except Exception as e:  # noqa: BLE001
            lost[name] = f"import {mod} failed: {type(e).__name__}: {e}"
    # 3. functions and classes by source when their values did not come back
    for name, src in sorted(payload.get("sources", {}).items()):
        if name in ns:
            continue
        try:
            exec(compile(src, f"<restored {name}>", "exec"), ns)  # noqa: S102
            recomputed[name] = "from its source"
        except Exception as e:  # noqa: BLE001
            lost[name] = f"its source did not run: {type(e).__name__}: {e}"
    # 4. everything else that is missing: replay its last defining cell when that is safe
    missing = [k for k in list(payload.get("variables", {})) + list(payload.get("unsaved", {}))
               if k not in ns and k not in lost]
    cells = payload.get("cells", [])
    have = set(restored) | set(reimported)
    replayed: set[int] = set()
    for name in missing:
        why = payload.get("unsaved", {}).get(name, "its value could not be loaded")
        cell_no, code = None, None
        for i in range(len(cells) - 1, 0, -1):
            try:
                c = ip.transform_cell(cells[i])
                if name in _bound_names(ast.parse(c)):
                    cell_no, code = i, c
                    break
            except SyntaxError:
                continue
        if code is None:
            lost[name] = f"{why}; no cell in the history defines it"
            continue
        verdict = replay_verdict(code, have)
        if verdict is not None:
            lost[name] = f"{why}; cell {cell_no} was not replayed: it {verdict}"
            continue
        if cell_no not in replayed:
            result = ip.run_cell(code, store_history=False, silent=True)
            replayed.add(cell_no)
            err = result.error_before_exec or result.error_in_exec
            if err is not None:
                lost[name] = f"{why}; replaying cell {cell_no} failed: {type(err).__name__}: {err}"
                continue
        if name in ns:
            recomputed[name] = f"by replaying cell {cell_no}"
        else:
            lost[name] = f"{why}; replaying cell {cell_no} did not define it"
    # 5. the cell history, so In[n] and the execution count go on where they were
    hm = ip.history_manager
    if ip.execution_count <= 1 and len(hm.input_hist_raw) <= 1 and cells:
        hm.input_hist_raw[:] = cells
        hm.input_hist_parsed[:] = [ip.transform_cell(c) if c else c for c in cells]
        ip.execution_count = payload.get("execution_count", len(cells))
    report = {
        "restored": restored, "recomputed": recomputed, "lost": lost, "reimported": reimported,
        "notes": notes, "seconds": {"read": t_read, "total": time.perf_counter() - t0},
    }
    last_json = json.dumps(report)
