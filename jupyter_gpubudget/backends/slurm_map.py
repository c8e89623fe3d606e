"""Pure mapping between the core's view and Slurm's (no I/O; ``backends/slurm.py`` runs the
commands).

- a placement (``SliceAlloc`` dicts) → ``sbatch`` arguments: ``--nodelist`` of the core's
  nodes, ``--gres`` per node (typed ``gpu:<type>:N``, MIG profiles through a profile → GRES
  type map, MPS shares as ``mps:<percent>``), ``--nodes``/``--ntasks-per-node`` for gangs, a
  heterogeneous job (``:``-separated components) when the nodes of a gang get different GRES,
  ``--gpu-bind=per_task:1`` on a gang's node holding MIG instances (one task per instance);
- ``scontrol show node -o`` → node records → a core ``Inventory`` and node health;
- ``squeue``/``sacct`` lines → job records; ledger intervals vs ``sacct`` → usage mismatches;
- the budgets' account tree → ``sacctmgr`` commands.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from jupyter_gpubudget.core.accounts import AccountTree
from jupyter_gpubudget.core.inventory import GPU_MEMORY_MIB, GpuSpec, Inventory, NodeSpec
from jupyter_gpubudget.core.mig import COMPUTE, MIG_TABLES


class SlurmMapError(ValueError):
    """A placement or Slurm output that cannot be mapped; the message names the field."""


# ============================================================ placement -> sbatch


@dataclass(frozen=True)
class Component:
    """One sbatch job component: identical nodes with identical per-node requests."""

    nodes: tuple[str, ...]
    gres: str = ""  # per node; "" for none
    ntasks_per_node: int = 1
    cpus_per_task: int = 0  # 0: the partition's default
    mem_mib: int = 0  # per node; 0: the partition's default
    # "per_task:1" for a gang's node holding MIG instances: a CUDA process sees one MIG
    # instance, so each task is bound to its own
    gpu_bind: str = ""


def _count_gres(counts: dict[str, int], key: str, n: int) -> None:
    counts[key] = counts.get(key, 0) + n


def node_gres(slices: list[dict], gpu_type: Callable[[str, int], str | None],
              mig_types: Mapping[str, str], where: str = "placement") -> str:
    """The ``--gres`` value for the slices placed on one node."""
    counts: dict[str, int] = {}
    for i, s in enumerate(slices):
        kind = s.get("kind", "gpu")
        gpu = s.get("gpu", -1)
        if kind == "cpu" or gpu is None or gpu < 0:
            continue
        if kind == "gpu":
            t = gpu_type(s["node"], gpu)
            _count_gres(counts, f"gpu:{t}" if t else "gpu", 1)
        elif kind == "mig":
            profile = s.get("profile")
            if not profile:
                raise SlurmMapError(f"{where}[{i}].profile: a MIG slice needs its profile")
            _count_gres(counts, f"gpu:{mig_types.get(profile, profile)}", 1)
        elif kind == "mps":
            milli = int(s.get("milli") or 0)
            if not 0 < milli <= 1000:
                raise SlurmMapError(f"{where}[{i}].milli: an MPS share is 1..1000, got {milli}")
            # Slurm counts MPS as percent of one GPU (gres.conf Count=100 per GPU)
            _count_gres(counts, "mps", max(1, round(milli / 10)))
        else:
            raise SlurmMapError(f"{where}[{i}].kind: unknown slice kind {kind!r}")
    return ",".join(f"{k}:{n}" for k, n in sorted(counts.items()))


def components(placement: list[dict], gpu_type: Callable[[str, int], str | None] | None = None,
               mig_types: Mapping[str, str] | None = None) -> list[Component]:
    """Group the placement's nodes into sbatch components (one unless the nodes differ)."""
    if not placement:
        raise SlurmMapError("placement: empty (the core always places a workload somewhere)")
    gpu_type = gpu_type or (lambda node, gpu: None)
    by_node: dict[str, list[dict]] = {}
    for i, s in enumerate(placement):
        node = s.get("node")
        if not isinstance(node, str) or not node:
            raise SlurmMapError(f"placement[{i}].node: a node name is required")
        by_node.setdefault(node, []).append(s)
    groups: dict[tuple, list[str]] = {}
    for node, slices in by_node.items():
        gres = node_gres(slices, gpu_type, mig_types or {})
        gpu_slices = sum(1 for s in slices if s.get("gpu", -1) >= 0 and s.get("kind") != "cpu")
        tasks = max(1, gpu_slices)
        cpu_milli = sum(int(s.get("cpu_milli") or 0) for s in slices)
        cpus = math.ceil(cpu_milli / 1000 / tasks) if cpu_milli else 0
        mem = sum(int(s.get("memory_mib") or 0) for s in slices)
        # a gang's MIG instances (Policy.gang_on_mig): one task per instance, bound to it
        bind = "per_task:1" if (len(by_node) > 1 and tasks > 1
                                and any(s.get("kind") == "mig" for s in slices)) else ""
        groups.setdefault((gres, tasks, cpus, mem, bind), []).append(node)
    return [Component(tuple(nodes), g, t, c, m, b) for (g, t, c, m, b), nodes in groups.items()]


def slurm_time(seconds: float) -> str:
    """Seconds as Slurm's ``--time`` (D-HH:MM:SS), rounded up to whole minutes."""
    if not seconds or seconds <= 0 or not math.isfinite(seconds):
        raise SlurmMapError(f"time: a positive number of seconds is required, got {seconds!r}")
    m = math.ceil(seconds / 60)
    d, m = divmod(m, 24 * 60)
    h, m = divmod(m, 60)
    return f"{d}-{h:02d}:{m:02d}:00"


def job_time(time_limit: float | None, min_runtime: float, headroom: float,
             default: float) -> float:
    """The Slurm time limit: the declared limit, else the protected time plus headroom, else
    the default."""
    if time_limit:
        return float(time_limit)
    if min_runtime and min_runtime > 0:
        return float(min_runtime) + headroom
    return default


def component_args(c: Component, *, partition: str, account: str, time_s: float) -> list[str]:
    args = []
    if partition:
        args.append(f"--partition={partition}")
    if account:
        args.append(f"--account={account}")
    args += [f"--time={slurm_time(time_s)}", f"--nodes={len(c.nodes)}",
             f"--nodelist={','.join(c.nodes)}", f"--ntasks-per-node={c.ntasks_per_node}"]
    if c.gres:
        args.append(f"--gres={c.gres}")
    if c.cpus_per_task:
        args.append(f"--cpus-per-task={c.cpus_per_task}")
    if c.mem_mib:
        args.append(f"--mem={c.mem_mib}M")
    if c.gpu_bind:
        args.append(f"--gpu-bind={c.gpu_bind}")
    return args


def sbatch_args(placement: list[dict], *, account: str, partition: str, time_s: float,
                job_name: str, comment: str = "",
                gpu_type: Callable[[str, int], str | None] | None = None,
                mig_types: Mapping[str, str] | None = None,
                extra: Iterable[str] = ()) -> list[str]:
    """sbatch's arguments for one attempt: job-wide options, then each component's, with
    ``:`` between components of a heterogeneous job (a gang whose nodes differ)."""
    for what, v in (("account", account), ("job_name", job_name)):
        if not v or any(ch.isspace() for ch in v) or ":" in v:
            raise SlurmMapError(f"{what}: {v!r} is not a Slurm name")
    comps = components(placement, gpu_type, mig_types)
    out = ["--parsable", f"--job-name={job_name}", "--no-requeue", *extra]
    if comment:
        out.append(f"--comment={comment}")
    for i, c in enumerate(comps):
        if i:
            out.append(":")
        out += component_args(c, partition=partition, account=account, time_s=time_s)
    return out


# ============================================================ job names

def job_name(prefix: str, workload: str, attempt: int | None = None) -> str:
    """``<prefix>.<workload>.<attempt>`` (sessions, whose attempt the hub does not know:
    ``<prefix>.<workload>``)."""
    return f"{prefix}.{workload}" if attempt is None else f"{prefix}.{workload}.{attempt}"


def parse_job_name(prefix: str, name: str) -> tuple[str, int | None] | None:
    if not name.startswith(prefix + "."):
        return None
    rest = name[len(prefix) + 1:]
    wid, dot, att = rest.rpartition(".")
    if dot and att.isdigit() and wid:
        return wid, int(att)
    return (rest, None) if rest and "." not in rest else None


# ============================================================ scontrol show node -o

_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:]*)=")


def parse_kv_line(line: str) -> dict[str, str]:
    """One ``scontrol ... -o`` line: Key=Value pairs; values may contain spaces."""
    out: dict[str, str] = {}
    matches = list(_KEY.finditer(line))
    for m, nxt in zip(matches, [*matches[1:], None], strict=True):
        end = nxt.start() if nxt is not None else len(line)
        out[m.group(1)] = line[m.end():end].strip()
    return out


@dataclass(frozen=True)
class Gres:
    name: str  # gpu, mps, ...
    type: str | None
    count: int


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: frozenset[str]
    reason: str = ""
    gres: tuple[Gres, ...] = ()
    cpus: int = 0
    memory_mib: int = 0
    partitions: tuple[str, ...] = ()


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        out.append("".join(cur))
    return [p for p in (x.strip() for x in out) if p]


def parse_gres(text: str, where: str = "Gres") -> tuple[Gres, ...]:
    """``gpu:h100:2(S:0-1),gpu:1g.18gb:7,mps:200`` → Gres records; ``(null)`` → ()."""
    if not text or text in ("(null)", "N/A"):
        return ()
    out = []
    for part in _split_top(text):
        part = part.split("(", 1)[0]
        bits = part.split(":")
        try:
            count = int(bits[-1]) if len(bits) > 1 else 1
        except ValueError:
            raise SlurmMapError(f"{where}: bad GRES count in {part!r}") from None
        if len(bits) == 1 or len(bits) == 2:
            out.append(Gres(bits[0], None, count))
        else:
            out.append(Gres(bits[0], ":".join(bits[1:-1]), count))
    return tuple(out)


def parse_nodes(text: str) -> list[SlurmNode]:
    nodes = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip().startswith("NodeName="):
            continue
        f = parse_kv_line(line.strip())
        where = f"scontrol line {lineno}"

        def num(key: str, default: int = 0, f: dict = f, where: str = where) -> int:
            v = f.get(key, "")
            if not v or v in ("N/A", "(null)"):
                return default
            try:
                return int(v)
            except ValueError:
                raise SlurmMapError(f"{where}: {key}={v!r} is not a number") from None

        reason = f.get("Reason", "")
        parts = f.get("Partitions", "")
        nodes.append(SlurmNode(
            name=f["NodeName"], state=frozenset(f.get("State", "UNKNOWN").split("+")),
            reason=reason if reason not in ("(null)", "None") else "",
            gres=parse_gres(f.get("Gres", ""), f"{where}: Gres"),
            cpus=num("CPUTot"), memory_mib=num("RealMemory"),
            partitions=tuple(p for p in parts.split(",") if p and p != "(null)")))
    return nodes


def _mig_profile(gres_type: str, mig_types: Mapping[str, str]) -> str | None:
    """The MIG profile a GRES type stands for: mapped in ``mig_types``, the profile name
    itself, or Slurm's AutoDetect=nvml name ending in it (``nvidia_h200_3g.71gb``)."""
    rev = {v: k for k, v in mig_types.items()}
    if gres_type in rev:
        return rev[gres_type]
    for cand in (gres_type, gres_type.rsplit("_", 1)[-1]):
        if any(cand in t for t in MIG_TABLES.values()):
            return cand
    return None


def _mig_model(profile: str, gres_type: str, gpu_models: Mapping[str, str]) -> str:
    if gres_type in gpu_models and profile in MIG_TABLES.get(gpu_models[gres_type], {}):
        return gpu_models[gres_type]
    for model, table in MIG_TABLES.items():
        if profile in table:
            return model
    raise SlurmMapError(f"MIG GRES type {gres_type!r}: no GPU model has profile {profile!r}")


def node_gpus(n: SlurmNode, gpu_models: Mapping[str, str],
              mig_types: Mapping[str, str]) -> tuple[list[GpuSpec], dict[int, str]]:
    """The core GPUs of one Slurm node, and index → Slurm GPU type for whole GPUs."""
    specs: list[GpuSpec] = []
    types: dict[int, str] = {}
    mig_compute: dict[str, int] = {}
    for g in n.gres:
        if g.name != "gpu":
            continue
        profile = _mig_profile(g.type, mig_types) if g.type else None
        if profile is not None:
            model = _mig_model(profile, g.type or "", gpu_models)
            p = MIG_TABLES[model][profile]
            mig_compute[model] = mig_compute.get(model, 0) + p.compute * g.count
            continue
        model = gpu_models.get(g.type or "", g.type or "GPU")
        for _ in range(g.count):
            i = len(specs)
            specs.append(GpuSpec(i, model, GPU_MEMORY_MIB.get(model, 0), False,
                                 f"slurm-{n.name}-{i}"))
            if g.type:
                types[i] = g.type
    for model, compute in sorted(mig_compute.items()):
        for _ in range(math.ceil(compute / COMPUTE)):
            i = len(specs)
            specs.append(GpuSpec(i, model, GPU_MEMORY_MIB.get(model, 0), True,
                                 f"slurm-{n.name}-{i}"))
    return specs, types


def inventory_from_nodes(nodes: Iterable[SlurmNode], gpu_models: Mapping[str, str],
                         mig_types: Mapping[str, str], partition: str = "",
                         rack_of: Mapping[str, str] | None = None) -> Inventory:
    """The core's inventory from Slurm's nodes (only ``partition``'s, when given)."""
    specs = []
    for n in nodes:
        if partition and partition not in n.partitions:
            continue
        gpus, _ = node_gpus(n, gpu_models, mig_types)
        specs.append(NodeSpec(n.name, tuple(gpus), (rack_of or {}).get(n.name, "default"),
                              n.cpus * 1000, n.memory_mib))
    if not specs:
        raise SlurmMapError(f"scontrol: no nodes{f' in partition {partition!r}' if partition else ''}")
    return Inventory(tuple(specs), "slurm")


#: states in which a node takes no new work at once (an admin's or Slurm's own decision)
UNHEALTHY = frozenset({"DOWN", "DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING", "INVAL",
                       "MAINT", "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "FUTURE",
                       "REBOOT_ISSUED", "REBOOT_REQUESTED"})
#: states that may be a blip (a slurmctld restart, a missed ping): unhealthy after a grace
TRANSIENT = frozenset({"NOT_RESPONDING", "UNKNOWN", "NO_RESPOND"})


def node_health(nodes: Iterable[SlurmNode], first_bad: Mapping[str, float], now: float,
                grace: float) -> tuple[dict[str, str], dict[str, float]]:
    """(unhealthy node → reason, when each transiently bad node was first seen so)."""
    out: dict[str, str] = {}
    seen: dict[str, float] = {}
    for n in nodes:
        hard = sorted(n.state & UNHEALTHY)
        soft = sorted(n.state & TRANSIENT)
        if soft:
            seen[n.name] = first_bad.get(n.name, now)
        if hard or (soft and now - seen[n.name] >= grace):
            out[n.name] = "slurm: " + "+".join(sorted(n.state)) + (
                f" ({n.reason})" if n.reason else "")
    return out, seen


def is_drained(n: SlurmNode) -> bool:
    return bool(n.state & {"DRAIN", "DRAINING", "DRAINED"})


# ============================================================ squeue / sacct


@dataclass(frozen=True)
class JobRecord:
    job_id: str  # the job (for a heterogeneous job: its leader's id)
    name: str
    state: str
    user: str = ""
    nodes: str = ""
    start: float | None = None
    end: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    gres: tuple[str, ...] = field(default=())
    reason: str = ""  # squeue's: why a pending job waits (JobHeldUser, Dependency, ...)


ALIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                   "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SIGNALING",
                   "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})
#: ended without the job's own exit status: the node or the system lost it
LOST = frozenset({"NODE_FAIL", "BOOT_FAIL", "LAUNCH_FAILED"})

SQUEUE_FORMAT = "%i|%j|%T|%u|%N|%b|%S|%e|%r"
SACCT_FIELDS = "JobID,JobName,State,ExitCode,Start,End,NodeList,User,AllocTRES"


def _epoch(v: str) -> float | None:
    v = v.strip()
    if not v or v in ("Unknown", "None", "N/A"):
        return None
    try:
        return float(v)
    except ValueError:
        return None


def _base_id(job_id: str) -> str:
    """The job's id without a heterogeneous component's ``+N``; a task of a job array keeps
    its ``_<index>`` (``123_4``: each task is a job of its own), as does an array's pending
    remainder (``123_[5-9%3]``)."""
    return job_id.split("+", 1)[0]


def array_spec(indices: Iterable[int], max_running: int = 0) -> str:
    """sbatch's ``--array`` value: the indices as ranges (``0-4,7``), ``%max_running``."""
    xs = sorted(set(indices))
    if not xs:
        raise SlurmMapError("array: no task to submit")
    parts, lo = [], xs[0]
    for prev, x in zip(xs, [*xs[1:], None], strict=True):
        if x is None or x != prev + 1:
            parts.append(str(lo) if lo == prev else f"{lo}-{prev}")
            lo = x if x is not None else lo
    return ",".join(parts) + (f"%{max_running}" if max_running else "")


def array_indices(job_id: str) -> tuple[str, set[int]] | None:
    """The job array and the task indices a squeue id names: ``123_4`` -> ('123', {4}),
    ``123_[0-2,5%3]`` -> ('123', {0, 1, 2, 5}); None: not a job array's id."""
    base, us, rest = job_id.partition("_")
    if not us or not base.isdigit():
        return None
    rest = rest.strip("[]").split("%", 1)[0]
    out: set[int] = set()
    for part in rest.split(","):
        lo, dash, hi = part.partition("-")
        try:
            out.update(range(int(lo), int(hi) + 1) if dash else (int(lo),))
        except ValueError:
            return None
    return base, out


def parse_squeue(text: str) -> list[JobRecord]:
    """``squeue -h -o '%i|%j|%T|%u|%N|%b|%S|%e'`` lines (times as epochs via
    SLURM_TIME_FORMAT=%s); heterogeneous components merged."""
    merged: dict[str, JobRecord] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 5:
            continue
        jid, name, state, user, nodes = parts[:5]
        gres = tuple(g for g in (parts[5:6] or [""]) if g and g not in ("N/A", "(null)"))
        start = _epoch(parts[6]) if len(parts) > 6 else None
        end = _epoch(parts[7]) if len(parts) > 7 else None
        reason = parts[8].strip() if len(parts) > 8 else ""
        state = state.split()[0] if state else ""
        base = _base_id(jid)
        prev = merged.get(base)
        if prev is None:
            merged[base] = JobRecord(base, name, state, user, nodes, start,
                                     None if state in ALIVE else end, gres=gres,
                                     reason=reason)
        else:  # a job is alive while any component is
            st = prev.state if prev.state in ALIVE else state
            starts = [t for t in (prev.start, start) if t is not None]
            ends = [t for t in (prev.end, end) if t is not None]
            merged[base] = JobRecord(base, name, st, user,
                                     ",".join(x for x in (prev.nodes, nodes) if x),
                                     min(starts) if starts else None,
                                     None if st in ALIVE or not ends else max(ends),
                                     gres=prev.gres + gres)
    return list(merged.values())


def _state_rank(s: str) -> int:
    order = ["COMPLETED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "PREEMPTED", "FAILED",
             "NODE_FAIL", "BOOT_FAIL"]
    return order.index(s) if s in order else len(order)


def parse_sacct(text: str) -> list[JobRecord]:
    """``sacct -X -n -P --format=<SACCT_FIELDS>`` lines (times as epochs via
    SLURM_TIME_FORMAT=%s); heterogeneous components merged."""
    merged: dict[str, JobRecord] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 8:
            continue
        jid, name, state, exitcode, start, end, nodes, user = parts[:8]
        tres = parts[8] if len(parts) > 8 else ""
        state = state.split()[0] if state else ""  # "CANCELLED by 0"
        try:
            code_s, sig_s = exitcode.split(":", 1)
            code, sig = int(code_s), int(sig_s)
        except ValueError:
            code, sig = None, None
        gres = tuple(t for t in tres.split(",") if t.startswith("gres/"))
        rec = JobRecord(_base_id(jid), name, state, user, nodes, _epoch(start), _epoch(end),
                        code, sig, gres)
        prev = merged.get(rec.job_id)
        if prev is None:
            merged[rec.job_id] = rec
            continue
        starts = [t for t in (prev.start, rec.start) if t is not None]
        ends = [t for t in (prev.end, rec.end) if t is not None]
        alive = prev.state in ALIVE or rec.state in ALIVE
        worst = prev if _state_rank(prev.state) >= _state_rank(rec.state) else rec
        merged[rec.job_id] = JobRecord(
            rec.job_id, name, prev.state if prev.state in ALIVE else
            (rec.state if alive else worst.state), user,
            ",".join(x for x in (prev.nodes, rec.nodes) if x and x != "None assigned"),
            min(starts) if starts else None, None if alive else (max(ends) if ends else None),
            worst.exit_code, worst.signal, prev.gres + rec.gres)
    return list(merged.values())


def exit_status(rec: JobRecord) -> int | None:
    """The attempt's exit code as the ledger records it: the job's own code, 128+signal when
    it was killed by one, None when Slurm lost it (node failure)."""
    if rec.state in LOST:
        return None
    if rec.signal:
        return 128 + rec.signal
    if rec.state == "CANCELLED" and not rec.exit_code:
        return 143  # scancel: SIGTERM (sacct -X keeps 0:0 for the allocation)
    if rec.exit_code is None:
        return None
    if rec.state != "COMPLETED" and rec.exit_code == 0:
        return 1  # FAILED/TIMEOUT/OUT_OF_MEMORY without a code of its own
    return rec.exit_code


# ============================================================ usage reconciliation


@dataclass(frozen=True)
class Interval:
    workload: str
    seq: int
    start: float
    end: float


def usage_mismatches(intervals: Iterable[Interval],
                     jobs: Mapping[str, list[tuple[int | None, JobRecord]]],
                     threshold: float) -> list[dict]:
    """Ledger intervals against Slurm's own start/end of the same attempt.

    ``jobs``: workload → [(attempt or None, record)]. A job named without its attempt (a
    session) matches the workload's intervals in start order. An interval with no Slurm job,
    or whose start or end differs by more than ``threshold`` seconds, is a mismatch."""
    by_wl: dict[str, list[Interval]] = {}
    for iv in intervals:
        by_wl.setdefault(iv.workload, []).append(iv)
    out = []
    for wid, ivs in sorted(by_wl.items()):
        ivs.sort(key=lambda i: i.seq)
        recs = jobs.get(wid, [])
        with_att = {a: r for a, r in recs if a is not None}
        without = sorted((r for a, r in recs if a is None),
                         key=lambda r: r.start if r.start is not None else math.inf)
        for k, iv in enumerate(ivs):
            rec = with_att.get(iv.seq) or (without[k] if k < len(without) else None)
            m = {"workload": wid, "attempt": iv.seq, "ledger_start": iv.start,
                 "ledger_end": iv.end, "ledger_seconds": iv.end - iv.start}
            if rec is None:
                out.append({**m, "slurm_job": None, "slurm_seconds": 0.0,
                            "difference_s": iv.end - iv.start, "why": "no Slurm job found"})
                continue
            s_start = rec.start if rec.start is not None else iv.start
            s_end = rec.end if rec.end is not None else s_start
            diff = max(abs(s_start - iv.start), abs(s_end - iv.end))
            if rec.start is None or diff > threshold:
                out.append({**m, "slurm_job": rec.job_id, "slurm_start": rec.start,
                            "slurm_end": rec.end, "slurm_seconds": max(0.0, s_end - s_start),
                            "difference_s": diff,
                            "why": "never started in Slurm" if rec.start is None else
                            f"start/end differ by {diff:.0f} s (threshold {threshold:.0f} s)"})
    return out


# ============================================================ accounts (sacctmgr)

_SLURM_NAME = re.compile(r"^[a-z0-9_][a-z0-9_.-]*$")


def account_names(tree: AccountTree, mapping: Mapping[str, str] | None = None) -> dict[str, str]:
    """Budget account → Slurm account (lower case; ``mapping`` overrides). Two budget accounts
    that would share one Slurm name are an error."""
    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for name in tree.accounts:
        slurm = (mapping or {}).get(name, name.lower())
        if not _SLURM_NAME.fullmatch(slurm):
            raise SlurmMapError(f"accounts.{name}: {slurm!r} is not a valid Slurm account name")
        if slurm in seen:
            raise SlurmMapError(f"accounts.{name}: Slurm account {slurm!r} is also the name of "
                                f"{seen[slurm]!r}; map one of them in SlurmBackend.account_map")
        seen[slurm] = name
        out[name] = slurm
    return out


@dataclass(frozen=True)
class AccountPlan:
    add_accounts: tuple[tuple[str, str], ...]  # (account, parent) in creation order
    move_accounts: tuple[tuple[str, str], ...]  # (account, new parent)
    add_users: tuple[tuple[str, str], ...]  # (user, account)
    remove_users: tuple[tuple[str, str], ...]
    remove_accounts: tuple[str, ...]  # deepest first

    @property
    def empty(self) -> bool:
        return not (self.add_accounts or self.move_accounts or self.add_users
                    or self.remove_users or self.remove_accounts)

    def commands(self) -> list[list[str]]:
        """sacctmgr argument lists (without the program name), in a safe order."""
        cmds = []
        for acct, parent in self.add_accounts:
            cmds.append(["-i", "add", "account", acct, f"parent={parent}",
                         "Organization=gpubudget", f"Description=gpubudget {acct}"])
        for acct, parent in self.move_accounts:
            cmds.append(["-i", "modify", "account", "where", f"name={acct}", "set",
                         f"parent={parent}"])
        for user, acct in self.add_users:
            cmds.append(["-i", "add", "user", user, f"account={acct}"])
        for user, acct in self.remove_users:
            cmds.append(["-i", "delete", "user", user, "where", f"account={acct}"])
        for acct in self.remove_accounts:
            cmds.append(["-i", "delete", "account", acct])
        return cmds


def account_plan(tree: AccountTree, existing_accounts: Mapping[str, str],
                 existing_users: Iterable[tuple[str, str]], *, root: str = "gpubudget",
                 mapping: Mapping[str, str] | None = None, prune: bool = False) -> AccountPlan:
    """What ``sacctmgr`` must do so Slurm's accounts below ``root`` mirror the budgets tree:
    every program/project an account (same parent chain), every user an association with each
    project they may charge. ``existing_accounts``: Slurm account → parent;
    ``existing_users``: (user, account) associations. With ``prune``, associations and
    accounts below ``root`` that the tree no longer has are removed."""
    names = account_names(tree, mapping)
    want_parent: dict[str, str] = {}
    order: list[str] = []

    def walk(name: str, parent: str) -> None:
        want_parent[names[name]] = parent
        order.append(names[name])
        for c in tree.get(name).children:
            walk(c, names[name])

    for r in tree.roots:
        walk(r, root)
    add, move = [], []
    if root not in existing_accounts:
        add.append((root, "root"))
    for acct in order:
        parent = want_parent[acct]
        if acct not in existing_accounts:
            add.append((acct, parent))
        elif existing_accounts[acct] != parent:
            move.append((acct, parent))
    users: set[tuple[str, str]] = set()
    members: set[str] = set()
    for a in tree.accounts.values():
        members |= set(a.members) | set(a.managers)
    for u in sorted(members):
        for p in tree.projects_of(u):
            users.add((u, names[p]))
    have = set(existing_users)
    add_users = sorted(users - have)
    rm_users: list[tuple[str, str]] = []
    rm_accounts: list[str] = []
    if prune:
        ours = _below(existing_accounts, root)
        rm_users = sorted((u, a) for u, a in have - users if a in ours)
        gone = [a for a in ours if a not in want_parent]
        depth = {a: _depth(existing_accounts, a) for a in gone}
        rm_accounts = sorted(gone, key=lambda a: (-depth[a], a))
    return AccountPlan(tuple(add), tuple(move), tuple(add_users), tuple(rm_users),
                       tuple(rm_accounts))


def _below(parents: Mapping[str, str], root: str) -> set[str]:
    out = set()
    for a in parents:
        cur, hops = a, 0
        while cur in parents and cur != root and hops < 100:
            cur, hops = parents[cur], hops + 1
        if cur == root and a != root:
            out.add(a)
    return out


def _depth(parents: Mapping[str, str], a: str) -> int:
    d = 0
    while a in parents and d < 100:
        a, d = parents[a], d + 1
    return d


def parse_sacctmgr_accounts(text: str) -> dict[str, str]:
    """``sacctmgr -n -P show associations format=Account,ParentName,User`` account rows →
    account → parent (the root account has parent "")."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or parts[2]:  # user associations have a User
            continue
        out[parts[0]] = parts[1]
    return out


def parse_sacctmgr_users(text: str) -> set[tuple[str, str]]:
    out = set()
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 3 and parts[2]:
            out.add((parts[2], parts[0]))
    return out
