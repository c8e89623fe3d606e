"""What hardware exists: nodes, their GPUs (MIG-enabled or not), racks and NVLink domains.

A MIG GPU either has a fixed layout — the instances that exist, which are the only MIG slices
the core may place on (what a real node has: NVML reports it) — or none, and then it is carved
freely (``dynamic_mig``: simulations, and nodes where the privileged launcher may create
instances on an idle GPU). This is the pure description the core schedules onto. It comes from NVML discovery (see
``jupyter_gpubudget.inventory``) or from a declared YAML file, parsed here::

    nodes:
      - name: h100-a          # with replicas: h100-a-0, h100-a-1, ...
        replicas: 2
        rack: r1
        model: H100-80GB
        gpus: 8
        mig: [6, 7]           # GPU indices in MIG mode, or "all"
        mig_layout:           # the instances that exist on each MIG GPU (the admin's layout)
          6: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]    # starts as nvidia-smi gives them
          7: [4g.40gb@0, 3g.40gb@4]                  # or explicit: profile@start
        nvlink: [[0, 1, 2, 3, 4, 5, 6, 7]]
        cpu_milli: 96000
        host_memory_mib: 1048576
"""

from __future__ import annotations

from dataclasses import dataclass

from .mig import MIG_TABLES
from .yamlnodes import ConfigError, Node, parse

GPU_MEMORY_MIB = {"A100-40GB": 40960, "A100-80GB": 81920, "H100-80GB": 81559,
                  "H200-141GB": 143771}

InventoryError = ConfigError


@dataclass(frozen=True, slots=True)
class GpuSpec:
    index: int
    model: str
    memory_mib: int = 0
    mig: bool = False
    uuid: str = ""
    #: MIG GPUs: the instances that exist, (profile, start slot) — the only MIG slices the
    #: core places on; None: carved freely (dynamic MIG)
    mig_layout: tuple[tuple[str, int], ...] | None = None
    #: MIG GPUs discovered through NVML: (profile, start slot, UUID) of each instance that
    #: exists, so a placement on it names the instance's ``MIG-<uuid>`` (a declared
    #: inventory has none: its device ids are derived, not CUDA ids)
    mig_uuids: tuple[tuple[str, int, str], ...] = ()

    @property
    def layout(self) -> frozenset[tuple[str, int]] | None:
        return frozenset(self.mig_layout) if self.mig_layout is not None else None


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: tuple[GpuSpec, ...]
    rack: str = "default"
    cpu_milli: int = 0  # 0: not tracked
    memory_mib: int = 0  # host memory; 0: not tracked
    nvlink: tuple[tuple[int, ...], ...] = ()  # GPU index groups; () = all in one domain
    #: the named cluster the node belongs to (its own backend and inventory; docs/service.md,
    #: "Several clusters"): a gang never spans clusters, and a workload may name one
    cluster: str = "default"


@dataclass(frozen=True, slots=True)
class Inventory:
    nodes: tuple[NodeSpec, ...]
    source: str = "declared"  # "declared" (YAML) or "nvml"

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    @property
    def clusters(self) -> tuple[str, ...]:
        """The clusters the nodes belong to, in the order they first appear."""
        return tuple(dict.fromkeys(n.cluster for n in self.nodes))

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


def make_node(name: str, model: str, gpus: int, *, mig: tuple[int, ...] = (), rack: str = "default",
              cpu_milli: int = 0, memory_mib: int = 0, gpu_memory_mib: int | None = None,
              nvlink: tuple[tuple[int, ...], ...] = (),
              mig_layout: dict[int, tuple[tuple[str, int], ...]] | None = None,
              cluster: str = "default") -> NodeSpec:
    """A node; ``mig_layout`` gives the instances of MIG GPUs (GPUs in ``mig`` without one are
    carved freely)."""
    mem = gpu_memory_mib if gpu_memory_mib is not None else GPU_MEMORY_MIB.get(model, 0)
    layouts = mig_layout or {}
    specs = tuple(GpuSpec(i, model, mem, i in mig, f"GPU-{name}-{i}",
                          layouts.get(i) if i in mig else None) for i in range(gpus))
    return NodeSpec(name, specs, rack, cpu_milli, memory_mib, nvlink, cluster)


def merge_clusters(parts: dict[str, Inventory]) -> Inventory:
    """One inventory of several named clusters: every node of ``parts[name]`` is put in
    cluster ``name``. Node names must be unique across clusters (a placement names nodes
    only); a clash raises :class:`InventoryError` naming the node and both clusters."""
    from dataclasses import replace

    seen: dict[str, str] = {}
    nodes: list[NodeSpec] = []
    for name, inv in parts.items():
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            raise InventoryError(f"cluster name {name!r}: use letters, digits, - and _",
                                 source="clusters")
        for n in inv.nodes:
            if n.name in seen:
                raise InventoryError(f"node {n.name!r} is in cluster {seen[n.name]!r} and in "
                                     f"cluster {name!r}: node names must be unique across "
                                     "clusters", source="clusters")
            seen[n.name] = name
            nodes.append(replace(n, cluster=name))
    sources = {inv.source for inv in parts.values()}
    return Inventory(tuple(nodes), sources.pop() if len(sources) == 1 else "mixed")


def carve(model: str, profiles: list[tuple[str, int | None]]) -> tuple[tuple[str, int], ...]:
    """A MIG layout from profiles, each at its given start or, when None, at the highest free
    start that fits (as ``nvidia-smi mig -cgi`` does); ValueError when they do not all fit."""
    from . import mig as migtab

    table = migtab.profiles_for(model)
    mask = compute = 0
    out: list[tuple[str, int]] = []
    for name, start in profiles:
        if name not in table:
            raise ValueError(f"{model} has no MIG profile {name!r} (profiles: "
                             f"{', '.join(table)})")
        p = table[name]
        fits = migtab.fits(model, name, mask, compute)
        if start is None:
            if not fits:
                raise ValueError(f"{name} does not fit beside {', '.join(n for n, _ in out)}")
            start = max(fits)
        elif start not in fits:
            raise ValueError(f"{name} does not fit at slot {start} "
                             f"(free slots for it: {sorted(fits) or 'none'})")
        mask = migtab.occupy(p, start, mask)
        compute += p.compute
        out.append((name, start))
    return tuple(out)


_NODE_KEYS = {"name", "replicas", "rack", "model", "gpus", "mig", "nvlink", "cpu_milli",
              "host_memory_mib", "gpu_memory_mib", "mig_layout", "cluster"}


def load_inventory(text: str, source: str = "<inventory>") -> Inventory:
    """Parse a declared inventory; errors name the path and line and nothing is returned."""
    root = parse(text, source)
    top = root.mapping({"nodes"})
    if "nodes" not in top:
        raise root.error("missing required key 'nodes'")
    nodes: list[NodeSpec] = []
    names: dict[str, int] = {}
    for entry in top["nodes"].seq():
        f = entry.mapping(_NODE_KEYS)
        for req in ("name", "gpus"):
            if req not in f:
                raise entry.error(f"missing required key {req!r}")
        name = f["name"].string()
        count = int(f["gpus"].number(minimum=0, integer=True))
        model = f["model"].string() if "model" in f else "GPU"
        mig = _mig_indices(f.get("mig"), count, model)
        layouts = _mig_layouts(f.get("mig_layout"), mig, model)
        nvlink = _nvlink(f.get("nvlink"), count)
        replicas = int(f["replicas"].number(minimum=1, integer=True)) if "replicas" in f else 1
        kwargs = dict(
            mig=mig, rack=f["rack"].string() if "rack" in f else "default",
            cpu_milli=int(f["cpu_milli"].number(integer=True)) if "cpu_milli" in f else 0,
            memory_mib=int(f["host_memory_mib"].number(integer=True)) if "host_memory_mib" in f else 0,
            gpu_memory_mib=int(f["gpu_memory_mib"].number(integer=True)) if "gpu_memory_mib" in f else None,
            nvlink=nvlink, mig_layout=layouts,
            cluster=f["cluster"].string() if "cluster" in f else "default")
        for r in range(replicas):
            node_name = f"{name}-{r}" if replicas > 1 else name
            if node_name in names:
                raise f["name"].error(f"duplicate node name {node_name!r} "
                                      f"(also at line {names[node_name]})")
            names[node_name] = f["name"].line
            nodes.append(make_node(node_name, model, count, **kwargs))  # type: ignore[arg-type]
    if not nodes:
        raise top["nodes"].error("the inventory has no nodes")
    return Inventory(tuple(nodes), "declared")


def _mig_indices(node: Node | None, count: int, model: str) -> tuple[int, ...]:
    if node is None:
        return ()
    if node.value == "all":
        idx = list(range(count))
    else:
        idx = [int(n.number(minimum=0, integer=True)) for n in node.seq()]
        for n, i in zip(node.seq(), idx, strict=True):
            if i >= count:
                raise n.error(f"GPU index {i} does not exist (the node has {count} GPUs)")
    if idx and model not in MIG_TABLES:
        raise node.error(f"model {model!r} has no MIG profiles (known: {', '.join(MIG_TABLES)})")
    return tuple(sorted(set(idx)))


def _mig_layouts(node: Node | None, mig: tuple[int, ...], model: str
                 ) -> dict[int, tuple[tuple[str, int], ...]] | None:
    """``mig_layout``: a list of profiles for every MIG GPU of the node, or a mapping from GPU
    index to its list; each entry ``profile`` or ``profile@start``."""
    if node is None:
        return None

    def one(seq: Node) -> tuple[tuple[str, int], ...]:
        items: list[tuple[str, int | None]] = []
        for e in seq.seq():
            text = e.string()
            name, sep, at = text.partition("@")
            if sep and not at.isdigit():  # "1g.10gb@" or "1g.10gb@x": no start slot
                raise e.error(f"{text!r}: expected a profile or profile@start (e.g. 1g.10gb@6)")
            items.append((name, int(at) if at else None))
        try:
            return carve(model, items)
        except ValueError as err:
            raise seq.error(str(err)) from None

    if isinstance(node.value, list):
        layout = one(node)
        return dict.fromkeys(mig, layout)
    out = {}
    for key, seq in node.mapping().items():
        try:
            idx = int(key)
        except ValueError:
            raise seq.error(f"mig_layout: {key!r} is not a GPU index") from None
        if idx not in mig:
            raise seq.error(f"mig_layout: GPU {idx} is not in MIG mode (mig: {list(mig)})")
        out[idx] = one(seq)
    return out


def _nvlink(node: Node | None, count: int) -> tuple[tuple[int, ...], ...]:
    if node is None:
        return ()
    groups = []
    seen: set[int] = set()
    for g in node.seq():
        members = []
        for n in g.seq():
            i = int(n.number(minimum=0, integer=True))
            if i >= count:
                raise n.error(f"GPU index {i} does not exist (the node has {count} GPUs)")
            if i in seen:
                raise n.error(f"GPU {i} is in two NVLink domains")
            seen.add(i)
            members.append(i)
        groups.append(tuple(members))
    return tuple(groups)
