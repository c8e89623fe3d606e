"""What a poorer interconnect costs a gang: its progress rate on the placement it got.

The model (docs/simulator.md, "Interconnect"): a data-parallel gang spends a fraction
``comm`` of each step in all-reduce when its ranks have the best links a gang of its size
can have, the rest computing. A ring all-reduce runs at the bus bandwidth of its slowest
link, so on a placement whose slowest link has bandwidth ``got`` instead of ``best`` a step
takes ``(1 - comm) + comm * best / got`` times as long, and the gang progresses at the
inverse of that per second it holds its GPUs. Its held GPU-hours are charged as always; its
*useful* GPU-hours are the held ones times this rate.

Bus bandwidths (NCCL ``all_reduce_perf`` busbw at large sizes, GB/s), from the published
reference figures of nccl-tests runs (e.g. "NCCL-tests in practice", Alaya New, 2026:
8 x H100 SXM5 over NVLink-4 460-480; 8 x H100 PCIe without NVSwitch 35-45):

- ``nvlink``: ranks in one NVLink domain — 470;
- ``pcie``: ranks on one node across NVLink domains, peer-to-peer over PCIe — 40;
- ``network``: ranks on several nodes, one 400 Gb/s InfiniBand NDR adapter per GPU
  (DGX H100: eight ConnectX-7) at about 90 % of its 50 GB/s line rate — 45;
- ``host``: ranks on MIG instances of one node: a MIG instance has no peer-to-peer path
  (NVIDIA MIG user guide), so NCCL copies through host memory (its SHM transport), crossing
  PCIe twice — half the PCIe figure, 20.

``comm`` (``SimConfig.comm_fraction``, 0.1) is an assumption, not a measurement: a tenth of
a step in all-reduce on NVLink is typical of data-parallel training that overlaps its
gradient exchange with the backward pass; a gang that communicates more loses more.
"""

from __future__ import annotations

from ..core.capacity import Cluster
from ..core.model import Placement

BUS_GBPS = {"nvlink": 470.0, "pcie": 40.0, "network": 45.0, "host": 20.0}
COMM_FRACTION = 0.1


def slowest_link(cluster: Cluster, placement: Placement) -> str | None:
    """The slowest link between two of the placement's ranks (None: one rank, no traffic)."""
    ranks = [s for s in placement.slices if s.gpu >= 0]
    if len(ranks) < 2:
        return None
    per_node: dict[str, list] = {}
    for s in ranks:
        per_node.setdefault(s.node, []).append(s)
    links = {"network"} if len(per_node) > 1 else set()
    for node, here in per_node.items():
        if len(here) < 2:
            continue
        if any(s.kind == "mig" for s in here):
            links.add("host")
        else:
            gpus = cluster.by_name[node].gpus
            links.add("nvlink" if len({gpus[s.gpu].domain for s in here}) == 1 else "pcie")
    if not links:
        return None
    return min(links, key=lambda k: BUS_GBPS[k])


def best_bandwidth(cluster: Cluster, gpus: int) -> float:
    """The slowest link's bandwidth on the best placement a gang of ``gpus`` could have."""
    if gpus <= cluster.max_domain:
        return BUS_GBPS["nvlink"]
    best = BUS_GBPS["network"]
    if gpus <= cluster.max_node_whole:
        best = max(best, BUS_GBPS["pcie"])
    return best


def progress_rate(cluster: Cluster, placement: Placement, comm: float = COMM_FRACTION
                  ) -> float:
    """Work done per second held, on ``placement``, against the best links for its size (1.0:
    no slower than the best; a single GPU, MIG instance or share is always 1.0)."""
    link = slowest_link(cluster, placement)
    if link is None:
        return 1.0
    ranks = sum(1 for s in placement.slices if s.gpu >= 0)
    got, best = BUS_GBPS[link], best_bandwidth(cluster, ranks)
    if got >= best:
        return 1.0
    return 1.0 / ((1.0 - comm) + comm * best / got)
