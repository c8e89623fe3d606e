"""What hardware exists: nodes, their GPUs (MIG-enabled or not), racks and NVLink domains.

This is the pure description the core schedules onto. It comes from NVML discovery (see
``jupyter_gpubudget.inventory``) or from a declared YAML file, parsed here::

    nodes:
      - name: h100-a          # with replicas: h100-a-0, h100-a-1, ...
        replicas: 2
        rack: r1
        model: H100-80GB
        gpus: 8
        mig: [6, 7]           # GPU indices in MIG mode, or "all"
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


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: tuple[GpuSpec, ...]
    rack: str = "default"
    cpu_milli: int = 0  # 0: not tracked
    memory_mib: int = 0  # host memory; 0: not tracked
    nvlink: tuple[tuple[int, ...], ...] = ()  # GPU index groups; () = all in one domain


@dataclass(frozen=True, slots=True)
class Inventory:
    nodes: tuple[NodeSpec, ...]
    source: str = "declared"  # "declared" (YAML) or "nvml"

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


def make_node(name: str, model: str, gpus: int, *, mig: tuple[int, ...] = (), rack: str = "default",
              cpu_milli: int = 0, memory_mib: int = 0, gpu_memory_mib: int | None = None,
              nvlink: tuple[tuple[int, ...], ...] = ()) -> NodeSpec:
    mem = gpu_memory_mib if gpu_memory_mib is not None else GPU_MEMORY_MIB.get(model, 0)
    specs = tuple(GpuSpec(i, model, mem, i in mig, f"GPU-{name}-{i}") for i in range(gpus))
    return NodeSpec(name, specs, rack, cpu_milli, memory_mib, nvlink)


_NODE_KEYS = {"name", "replicas", "rack", "model", "gpus", "mig", "nvlink", "cpu_milli",
              "host_memory_mib", "gpu_memory_mib"}


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
        nvlink = _nvlink(f.get("nvlink"), count)
        replicas = int(f["replicas"].number(minimum=1, integer=True)) if "replicas" in f else 1
        kwargs = dict(
            mig=mig, rack=f["rack"].string() if "rack" in f else "default",
            cpu_milli=int(f["cpu_milli"].number(integer=True)) if "cpu_milli" in f else 0,
            memory_mib=int(f["host_memory_mib"].number(integer=True)) if "host_memory_mib" in f else 0,
            gpu_memory_mib=int(f["gpu_memory_mib"].number(integer=True)) if "gpu_memory_mib" in f else None,
            nvlink=nvlink)
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
