"""Validation of REST bodies and job files: every error names the field; nothing is applied."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

from jupyter_gpubudget.core.accounts import GRANT_DECIMALS, MAX_GRANT_HOURS, grant_in_steps
from jupyter_gpubudget.core.holds import AFTER_KINDS
from jupyter_gpubudget.core.model import INTERCONNECTS, SliceRequest
from jupyter_gpubudget.core.offer import not_offered
from jupyter_gpubudget.launcher.policy import (
    MAX_COMMAND_CHARS,
    MAX_NAME_CHARS,
    MAX_NOTE_CHARS,
    argv_problem,
    bad_text,
    env_problem,
)

from .preempt_warning import WARN_ENV, WARN_SIGNALS


class Invalid(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


#: the longest duration a request may give (seconds)
MAX_DURATION_S = 366 * 86400
#: a database integer (SQLite, PostgreSQL BIGINT)
MAX_DB_INT = 2**63 - 1

_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_MIG = re.compile(r"^(?:mig:)?(\d+)g\.(\d+)gb$")
_MPS = re.compile(r"^mps:(\d{1,6})(?::(\d{1,12}))?$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,199}$")

JOB_FIELDS = {"checkpoint", "command", "project", "gpus", "slice", "min_runtime", "resumable", "time_limit",
              "name", "kind", "gpu_model", "single_node", "env", "checkpoint_interval",
              "interconnect", "cluster", "array", "max_running", "after", "after_kind", "start",
              "warn_signal"}
#: the most tasks one job array may have
MAX_ARRAY_TASKS = 10_000
#: the most jobs one job may run after
MAX_AFTER = 100
GRANT_FIELDS = {"grant_hours", "share_pct", "note", "requested_by"}
EVENT_FIELDS = {"workload", "event", "at", "project", "user", "milli", "kind", "placement"}


def duration(value: Any, field: str) -> float:
    """Seconds from a number or a string such as ``90``, ``30m``, ``2h``, ``1.5d``."""
    if isinstance(value, bool):
        raise Invalid(field, "expected a duration such as 3600, '30m' or '2h'")
    if isinstance(value, int | float):
        # compared before float(): a 400-digit integer does not fit a float (OverflowError)
        if not 0 <= value <= MAX_DURATION_S:
            raise Invalid(field, "must be between 0 and 366 days")
        secs = float(value)
    elif isinstance(value, str) and (m := _DUR.fullmatch(value)):
        secs = float(m.group(1)) * _UNIT[m.group(2)]
    else:
        raise Invalid(field, f"expected a duration such as 3600, '30m' or '2h', got {value!r}")
    if not math.isfinite(secs) or secs < 0 or secs > MAX_DURATION_S:
        raise Invalid(field, "must be between 0 and 366 days")
    return secs


def query_int(raw: str | None, field: str, lo: int, hi: int, default: int | None = None
              ) -> int | None:
    """A whole number from a query argument, between ``lo`` and ``hi`` (a database integer
    holds at most 2**63 - 1: anything longer is a 400 naming ``field``, never a 500)."""
    if raw is None or raw == "":
        return default
    try:
        v = int(raw) if len(raw) <= 40 else None
    except ValueError:
        v = None
    if v is None:
        raise Invalid(field, f"expected a whole number, got {raw[:40]!r}")
    if not lo <= v <= hi:
        raise Invalid(field, f"must be between {lo} and {hi}")
    return v


def _check_keys(body: Any, allowed: set[str], where: str = "body") -> dict:
    if not isinstance(body, dict):
        raise Invalid(where, "expected a JSON object")
    for k in body:
        if k not in allowed:
            raise Invalid(str(k), f"unknown field (allowed: {', '.join(sorted(allowed))})")
    return body


def _str(body: dict, key: str, required: bool = False, pattern: re.Pattern | None = None,
         default: str | None = None) -> str | None:
    if key not in body or body[key] is None:
        if required:
            raise Invalid(key, "is required")
        return default
    v = body[key]
    if not isinstance(v, str) or not v.strip():
        raise Invalid(key, "expected a non-empty string")
    if len(v) > 200:
        raise Invalid(key, "at most 200 characters")
    if bad_text(v):
        raise Invalid(key, bad_text(v) or "")
    if pattern is not None and not pattern.fullmatch(v):
        raise Invalid(key, f"{v!r} is not a valid name")
    return v


def _text(body: dict, key: str, limit: int) -> str:
    """An optional free-text field (a name, a note): at most ``limit`` characters of text."""
    v = body.get(key, "")
    if v is None:
        return ""
    if not isinstance(v, str) or len(v) > limit:
        raise Invalid(key, f"expected a string of at most {limit} characters")
    why = bad_text(v)
    if why:
        raise Invalid(key, why)
    return v


def check_strings(obj: Any, limit: int = 100_000) -> None:
    """Refuse a parsed JSON body holding a string no database or process can take (a NUL, a
    lone surrogate), naming its field; walks iteratively (any depth) over at most ``limit``
    values."""
    stack: list[tuple[str, Any]] = [("", obj)]
    seen = 0
    while stack:
        path, v = stack.pop()
        seen += 1
        if seen > limit:
            raise Invalid("body", f"more than {limit} values")
        if isinstance(v, str):
            why = bad_text(v)
            if why:
                raise Invalid(path or "body", why)
        elif isinstance(v, dict):
            for k, x in v.items():
                why = bad_text(k)
                if why:
                    raise Invalid(path or "body", f"a key {why}")
                stack.append((f"{path}.{k}" if path else k, x))
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", x) for i, x in enumerate(v))


def check_offered(inventory: Any, req: SliceRequest) -> None:
    """400 (naming the field) for a request no hardware here could ever hold: one check for
    batch jobs and sessions alike."""
    why = not_offered(inventory, req)
    if why is not None:
        raise Invalid(*why)
    clusters = inventory.clusters
    if req.cluster is None and len(clusters) > 1:
        # a workload never spans clusters: one of them must be able to hold all of it
        per = {c: not_offered(inventory, replace(req, cluster=c)) for c in clusters}
        if all(w is not None for w in per.values()):
            first = next(w for w in per.values() if w is not None)
            raise Invalid(first[0], "no single cluster can hold it (a workload never spans "
                          "clusters): " + "; ".join(f"{c}: {w[1]}" for c, w in per.items()
                                                    if w is not None))


def _bool(body: dict, key: str, default: bool = False) -> bool:
    v = body.get(key, default)
    if not isinstance(v, bool):
        raise Invalid(key, "expected true or false")
    return v


_CLUSTER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def parse_slice(body: dict) -> SliceRequest:
    """The slice a body asks for, with the cluster it names (``cluster``; whether the
    inventory has it is :func:`check_offered`'s to say)."""
    req = _parse_slice(body)
    cluster = body.get("cluster")
    if cluster is None:
        return req
    if not isinstance(cluster, str) or not _CLUSTER.fullmatch(cluster):
        raise Invalid("cluster", "expected a cluster's name (letters, digits, - and _)")
    return replace(req, cluster=cluster)


def _parse_slice(body: dict) -> SliceRequest:
    gpu_model = _str(body, "gpu_model")
    single_node = _bool(body, "single_node")
    interconnect = body.get("interconnect")
    if interconnect is not None and interconnect not in INTERCONNECTS:
        raise Invalid("interconnect", f"expected one of {', '.join(INTERCONNECTS)}")
    if interconnect is not None and "slice" in body:
        raise Invalid("interconnect", "only whole GPUs (gpus) declare an interconnect")
    if "gpus" in body and "slice" in body:
        raise Invalid("slice", "give either 'gpus' or 'slice', not both")
    if "slice" in body:
        s = body["slice"]
        if not isinstance(s, str):
            raise Invalid("slice", "expected a MIG profile such as '1g.18gb' or 'mps:300[:MiB]'")
        if m := _MIG.fullmatch(s):
            return SliceRequest.mig(f"{m.group(1)}g.{m.group(2)}gb", gpu_model=gpu_model)
        if m := _MPS.fullmatch(s):
            milli = int(m.group(1))
            if not 1 <= milli <= 1000:
                raise Invalid("slice", "an MPS share is 1..1000 thousandths of a GPU")
            return SliceRequest.mps(milli, int(m.group(2) or 0), gpu_model=gpu_model)
        raise Invalid("slice", f"{s!r} is neither a MIG profile ('1g.18gb') nor 'mps:<milli>'")
    gpus = body.get("gpus", 1)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= 1024:
        raise Invalid("gpus", "expected a whole number of GPUs, 0..1024")
    if gpus == 0:
        return SliceRequest.cpu_only()
    return SliceRequest.whole(gpus, gpu_model=gpu_model, single_node=single_node,
                              interconnect=interconnect)


_RANGE = re.compile(r"^(\d{1,6})(?:-(\d{1,6}))?$")


def parse_array(value: Any) -> list[int]:
    """A job array's indices: ``"0-99"``, ``"0-9,20,30-32"`` or a list of whole numbers,
    each from 0 to 999999, no index twice, at most ``MAX_ARRAY_TASKS``."""
    if isinstance(value, list):
        if not value or not all(isinstance(i, int) and not isinstance(i, bool)
                                for i in value):
            raise Invalid("array", "expected indices such as '0-99' or a list of whole numbers")
        out = list(value)
    elif isinstance(value, str) and value.strip():
        out = []
        for part in value.replace(" ", "").split(","):
            m = _RANGE.fullmatch(part)
            if not m:
                raise Invalid("array", f"{part[:40]!r} is not an index or a range such as "
                                       "'0-99'")
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if hi < lo:
                raise Invalid("array", f"range {part!r} ends before it starts")
            if hi - lo + 1 + len(out) > MAX_ARRAY_TASKS:
                raise Invalid("array", f"at most {MAX_ARRAY_TASKS} tasks")
            out.extend(range(lo, hi + 1))
    else:
        raise Invalid("array", "expected indices such as '0-99' or a list of whole numbers")
    if len(out) > MAX_ARRAY_TASKS:
        raise Invalid("array", f"at most {MAX_ARRAY_TASKS} tasks")
    if any(not 0 <= i <= 999_999 for i in out):
        raise Invalid("array", "indices are whole numbers from 0 to 999999")
    if len(set(out)) != len(out):
        raise Invalid("array", "an index is given twice")
    return out


def _parse_after(body: dict) -> tuple[list[str], str] | None:
    kind = body.get("after_kind", "afterok")
    if kind not in AFTER_KINDS:
        raise Invalid("after_kind", f"expected one of {', '.join(AFTER_KINDS)}")
    after = body.get("after")
    if after is None:
        if "after_kind" in body:
            raise Invalid("after_kind", "only with 'after' (the jobs this one runs after)")
        return None
    if isinstance(after, str):
        after = [after]
    if not isinstance(after, list) or not after or not all(isinstance(a, str) for a in after):
        raise Invalid("after", "expected a job id or a list of job or array ids")
    if len(after) > MAX_AFTER:
        raise Invalid("after", f"at most {MAX_AFTER} jobs")
    for a in after:
        if not _NAME.fullmatch(a):
            raise Invalid("after", f"{a[:40]!r} is not a job id")
    return list(dict.fromkeys(after)), kind


def _checkpoint_env(body: dict, env: dict) -> dict:
    """``checkpoint``: how a resumable job keeps its progress over a preemption: ``auto`` (the
    default: its process tree is checkpointed and restored where it is requeued) or ``self``
    (it saves its own: it gets SIGTERM, a grace period and GPUBUDGET_DUE_AT). Carried to the
    backend in the job's environment as GPUBUDGET_CHECKPOINT=self (auto needs nothing)."""
    mode = body.get("checkpoint")
    if mode is None:
        return env
    if mode not in ("auto", "self"):
        raise Invalid("checkpoint", "expected 'auto' (checkpointed for the job) or 'self' (the "
                                    "job saves its own progress)")
    if body.get("resumable") is not True:
        raise Invalid("checkpoint", "only for a resumable job (resumable: true): a job that is "
                                    "not requeued has nothing to resume")
    return {**env, "GPUBUDGET_CHECKPOINT": "self"} if mode == "self" else env


def _warn_env(body: dict, env: dict) -> dict:
    """``warn_signal``: a signal (USR1, USR2, INT, TERM or HUP; no default: a signal the job
    does not handle would end it) the job's processes get when its likely preemption is
    within the service's notice lead time, to save its work. Carried in the job's
    environment as GPUBUDGET_WARN_SIGNAL."""
    sig = body.get("warn_signal")
    if sig is None:
        return env
    name = sig.upper().removeprefix("SIG") if isinstance(sig, str) else None
    if name not in WARN_SIGNALS:
        raise Invalid("warn_signal", "expected one of " + ", ".join(WARN_SIGNALS)
                      + " (the signal the job gets ahead of a likely preemption)")
    return {**env, WARN_ENV: name}


def parse_job(body: Any) -> dict:
    """A batch job from a REST body or a job YAML file (same fields)."""
    body = _check_keys(body, JOB_FIELDS)
    cmd = body.get("command")
    if isinstance(cmd, str) and cmd.strip():
        if len(cmd) > MAX_COMMAND_CHARS:
            raise Invalid("command", f"at most {MAX_COMMAND_CHARS} characters")
        if bad_text(cmd):
            raise Invalid("command", bad_text(cmd) or "")
        command = ["/bin/sh", "-c", cmd]
    elif cmd is None:
        raise Invalid("command", "is required")
    else:
        why = argv_problem(cmd)
        if why:
            raise Invalid(*why)
        command = list(cmd)
    project = _str(body, "project", required=True)
    kind = _str(body, "kind", default="batch")
    if kind not in ("batch", "debug"):
        raise Invalid("kind", "a job is 'batch' or 'debug'")
    env = body.get("env", {})
    why = env_problem(env)
    if why:
        raise Invalid(*why)
    name = _text(body, "name", MAX_NAME_CHARS)
    env = _warn_env(body, _checkpoint_env(body, env))
    tl = body.get("time_limit")
    ci = body.get("checkpoint_interval")
    array = parse_array(body["array"]) if body.get("array") is not None else None
    max_running = body.get("max_running")
    if max_running is not None:
        if array is None:
            raise Invalid("max_running", "only with 'array' (how many of its tasks run at once)")
        if isinstance(max_running, bool) or not isinstance(max_running, int) \
                or not 1 <= max_running <= MAX_ARRAY_TASKS:
            raise Invalid("max_running", f"expected a whole number from 1 to {MAX_ARRAY_TASKS}")
    return {
        "array": array, "max_running": max_running or 0, "after": _parse_after(body),
        "command": command, "project": project, "kind": kind, "name": name, "env": env,
        "request": parse_slice(body),
        "min_runtime": duration(body.get("min_runtime", 0), "min_runtime"),
        "resumable": _bool(body, "resumable"),
        "time_limit": duration(tl, "time_limit") if tl is not None else None,
        # how often the job saves its progress: what a preemption of it throws away
        "checkpoint_interval": duration(ci, "checkpoint_interval") if ci is not None else None,
        "start": _start(body),
    }


#: when a job may start: ``now`` (as soon as it is ranked first, the default) or ``off-peak``
#: (it waits for the next off-peak window, core/pricing.py)
JOB_STARTS = ("now", "off-peak")


def _start(body: dict) -> str:
    v = body.get("start", "now")
    if v not in JOB_STARTS:
        raise Invalid("start", "expected 'now' (the default) or 'off-peak' (wait for the next "
                               f"off-peak window), got {str(v)[:40]!r}")
    return str(v)


def _number(body: dict, key: str, lo: float, hi: float) -> float | None:
    if key not in body or body[key] is None:
        return None
    v = body[key]
    # no math.isfinite(v): it raises OverflowError on a 400-digit integer; NaN fails the
    # comparison and infinities the bounds
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise Invalid(key, f"expected a number between {lo:g} and {hi:g}")
    return float(v)


def _grant_number(body: dict, key: str, hi: float, unit: str) -> float | None:
    """A grant's figure: a finite number from 0 to ``hi`` in steps of 0.001 (at most three
    decimals). -0.0, subnormals such as 1e-320 and finer fractions are refused (400), not
    rounded: a grant is money-like, and what is stored is what the admin typed."""
    if key not in body or body[key] is None:
        return None
    v = body[key]
    ok = not isinstance(v, bool) and isinstance(v, int | float) and 0 <= v <= hi \
        and grant_in_steps(float(v))
    if not ok:
        raise Invalid(key, f"expected {unit} from 0 to {hi:g} in steps of 0.001 (at most "
                           f"{GRANT_DECIMALS} decimals), got {str(v)[:40]}")
    return float(v)


def parse_grant(body: Any) -> dict:
    body = _check_keys(body, GRANT_FIELDS)
    hours = _grant_number(body, "grant_hours", MAX_GRANT_HOURS, "GPU-hours")
    share = _grant_number(body, "share_pct", 100, "a percent")
    if hours is not None and share is not None:
        raise Invalid("share_pct", "give either 'grant_hours' or 'share_pct', not both")
    if hours is None and share is None:
        raise Invalid("grant_hours", "give 'grant_hours' or 'share_pct'")
    note = _text(body, "note", MAX_NOTE_CHARS)
    # who asked for a change that an admin or another manager makes for them (approves)
    asked = _str(body, "requested_by", pattern=_NAME)
    return {"grant_hours": hours, "share_pct": share, "note": note, "requested_by": asked}


def parse_event(body: Any) -> dict:
    """A usage event reported by an external backend: start / checkpoint / stop at a time."""
    body = _check_keys(body, EVENT_FIELDS)
    wid = _str(body, "workload", required=True, pattern=_NAME)
    ev = body.get("event")
    if ev not in ("start", "checkpoint", "stop"):
        raise Invalid("event", "expected 'start', 'checkpoint' or 'stop'")
    at = _number(body, "at", 0, 1e11)
    if at is None:
        raise Invalid("at", "is required (UNIX seconds)")
    out: dict = {"workload": wid, "event": ev, "at": at}
    if ev == "start":
        out["project"] = _str(body, "project", required=True)
        out["user"] = _str(body, "user", required=True)
        milli = body.get("milli")
        if isinstance(milli, bool) or not isinstance(milli, int) or not 0 <= milli <= 1_000_000:
            raise Invalid("milli", "expected whole thousandths of a GPU, 0..1000000")
        out["milli"] = milli
        kind = body.get("kind", "interactive")
        if kind not in ("interactive", "batch", "debug"):
            raise Invalid("kind", "expected 'interactive', 'batch' or 'debug'")
        out["kind"] = kind
        placement = body.get("placement", [])
        if not isinstance(placement, list) or not all(isinstance(p, dict) for p in placement):
            raise Invalid("placement", "expected a list of slice objects")
        out["placement"] = placement
    else:
        for k in ("project", "user", "milli", "kind", "placement"):
            if k in body:
                raise Invalid(k, "only allowed with event 'start'")
    return out


def request_from_choice(key: str) -> SliceRequest:
    """A spawn form's slice key — ``cpu``, ``gpu:N``, ``mig:<profile>``, ``mps:<milli>`` —
    as a SliceRequest."""
    if key == "cpu":
        return SliceRequest.cpu_only()
    if key.startswith("gpu:"):
        n = key[4:]
        if not (n.isascii() and n.isdigit() and len(n) <= 40) or int(n) == 0:
            raise Invalid("slice", f"gpu:N wants a whole number of GPUs from 1, got {n[:20]!r}")
        # any count: check_offered says what the cluster has (a count past it is refused
        # there, naming the most it offers, never read as something else)
        return SliceRequest.whole(int(n))
    if key.startswith("mig:"):
        return parse_slice({"slice": key[4:]})
    if key.startswith("mps:"):
        return parse_slice({"slice": key})
    raise Invalid("slice", f"{key!r} is not one of cpu, gpu:N, mig:<profile>, mps:<milli>")


QUOTE_ARGS = ("user", "project", "slice", "gpus", "min_runtime", "cluster")


def quote_slice(args: dict[str, str | None]) -> str:
    """The slice key a quote asks about, from its query arguments: ``slice`` (a key such as
    ``gpu:2``, ``mig:1g.10gb``, ``mps:250``, ``cpu``; default ``cpu``) or ``gpus`` (a count of
    whole GPUs) — never both. An argument no quote knows is refused, naming it: a misspelt
    one must not yield a CPU slice's quote."""
    unknown = sorted(k for k in args if k not in QUOTE_ARGS)
    if unknown:
        raise Invalid(unknown[0], f"unknown argument (a quote takes {', '.join(QUOTE_ARGS)})")
    key, gpus = args.get("slice"), args.get("gpus")
    if gpus is not None:
        if key is not None:
            raise Invalid("gpus", "give either 'gpus' or 'slice', not both")
        if not (gpus.isascii() and gpus.isdigit() and len(gpus) <= 40):
            raise Invalid("gpus", f"expected a whole number of GPUs, got {gpus[:20]!r}")
        return "cpu" if int(gpus) == 0 else f"gpu:{int(gpus)}"
    return key or "cpu"


SESSION_FIELDS = {"user", "project", "gpus", "slice", "min_runtime", "name", "gpu_model",
                  "cluster"}


def parse_session(body: Any) -> dict:
    """An interactive session request (what BudgetSpawner posts)."""
    body = _check_keys(body, SESSION_FIELDS)
    for k in ("user", "project"):
        v = body.get(k)
        if not isinstance(v, str) or not _NAME.fullmatch(v):
            raise Invalid(k, "is required (a name)" if v is None else f"{v!r} is not a valid name")
    sl = body.get("slice")
    if isinstance(sl, str) and (sl == "cpu" or sl.startswith(("gpu:", "mig:"))):
        req = request_from_choice(sl)
        if "cluster" in body:
            req = replace(req, cluster=parse_slice({"cluster": body["cluster"]}).cluster)
    else:
        req = parse_slice({k: body[k] for k in ("gpus", "slice", "gpu_model", "cluster")
                           if k in body})
    name = _text(body, "name", MAX_NAME_CHARS)
    return {"user": body["user"], "project": body["project"], "request": req, "name": name,
            "min_runtime": duration(body.get("min_runtime", 0), "min_runtime")}
