"""Predictions for multi-node jobs no machine here has: flat NCCL across nodes against conccl's
hierarchical collectives (NCCL between nodes, copy engines inside each). A model, not a
measurement: every figure it gives is labelled a prediction wherever it is shown.

The job: ``N`` nodes of ``L`` GPUs, ``W = N * L`` ranks, one NIC per GPU (a rail-optimised node,
as DGX/HGX H100 and H200 nodes are built). A collective of ``size`` bytes per rank (the
project's convention: the output on each rank) moves chunks of ``c`` bytes
(``Layout.chunk_bytes``); ``F = W * c`` is the whole tensor (an all-gather's output, a
reduce-scatter's input, an all-reduce's buffer). ``bf(n)`` is the registry's bus factor,
(n-1)/n for all-gather and reduce-scatter, 2(n-1)/n for all-reduce.

Links (per GPU, bytes/s): ``B_net`` the network, ``B_ce`` NVLink as copy engines reach it,
``B_nccl`` NVLink as NCCL's SM kernels reach it, ``R`` the reduction kernel's HBM rate (bytes
read + written).

**Flat NCCL** (the baseline: NCCL's ring over all W ranks; NCCL runs all-gather and
reduce-scatter as rings whenever a node has more than one rank, and its ring all-reduce has the
same bandwidth term as its tree)::

    t_flat = lat_ring(W, N) + bf(W) * F / busbw
    busbw  = B_nccl                                   (N = 1)
           = min(L * B_net, B_nccl * L / (L - 1))     (N > 1; L = 1: B_net)

NCCL builds one ring per channel and rotates which GPU a ring leaves each node by, so the
rings together use all L NICs of a node: a node sends ``bf(W) * F`` per GPU in all through
``L * B_net``, and each GPU sends (L-1)/L of its ring traffic over NVLink. (The naive "(W-1)/W
of the output over the slowest link" would put all of it through one NIC: L times too slow
for such nodes.) ``lat_ring`` is NCCL's own tuning model for a ring with the Simple protocol
(``src/graph/tuning.cc``): ``base + (steps - inter) * intra + inter * net`` with ``steps =
bf(W) * W`` (W-1, or 2(W-1) for all-reduce), ``inter = bf(N) * N`` of them crossing nodes,
base 8.4 us, intra 3.4 us (its NVLink ring step), net 14 us (its network ring step).

**Hierarchical** (what :mod:`conccl.group.hierarchical` runs; the steps run one after the other within a call, as
that code does, not pipelined)::

    all-gather:     network all-gather (N ranks of equal local index, F/L) ; node all-gather (L ranks, F)
    reduce-scatter: node reduce-scatter (L ranks, F) ; network reduce-scatter (N ranks, F/L)
    all-reduce:     node reduce-scatter (L, F) ; network all-reduce (N, F/L) ; node all-gather (L, F)

    network step:   t = base + bf(N) * N * net + bf(N) * (F/L) / B_net       (none when N = 1)
    node step:      t = a_ce + bf(L) * F / B_ce  [+ (L + 1) * (F/L) / R]     (none when L = 1)

A node step of a reducing collective sums L operands of F/L bytes after its copies land (the
reduce-scatter's schedule waits for every peer's DONE, then reduces): L reads and one write.
``a_ce`` is conccl's fixed cost per call on the GPU (27 us: a 1 MiB 4-rank push all-gather on
H200 x4, where the bytes take 2 us: docs/results.md, small calls); a node all-gather of
N chunks per peer queues N * (L-1) copies per call, whose extra cost is not modelled.
``pipelined_bound_s`` is what overlapping the steps could reach at best (the longest step):
not built, shown so a reader sees what the serial composition costs.

**SM time** (SM-seconds per GPU per call): flat NCCL holds ``C`` CTAs, one SM each, for its
whole duration: ``C * t_flat``. The hierarchical path holds them only during its network steps,
and the reduction kernel's ``K`` CTAs (half the SMs: ``executors/cuda_reduce.grid_bound``)
during its sums; copy engines hold none::

    sm_flat = C * t_flat        sm_hier = C * sum(t_network) + K * sum(t_sum)

``C`` defaults to the CTAs the profile found NCCL needs on one node (``timing.default_ctas``:
32 for bandwidth-bound sizes on H200), for both NCCL communicators: NCCL likely runs fewer
channels on the one-rank-per-node communicator, so the saving is if anything understated.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .. import collectives
from ..units import format_size
from .plan import PlanError
from .profile import HardwareProfile
from .timing import default_ctas

FORMAT = "conccl-multinode-prediction/1"  # conccl plan --nodes --json: one call's links and result
SWEEP_FORMAT = "conccl-multinode-sweep/1"  # conccl study --nodes: results, a (links, result) per call

# One 400 Gb/s NIC per GPU: the DGX/HGX H100 and H200 node (8 x ConnectX-7 NDR, one per GPU).
# Its line rate: what NCCL reaches over it is lower, so give a measured figure where you have one.
DEFAULT_NETWORK_GBPS = 400.0
# NCCL's tuning model, ring algorithm, Simple protocol (src/graph/tuning.cc: baseLat, hwLat).
NCCL_BASE_LATENCY_S = 8.4e-6
NCCL_INTRA_STEP_S = 3.4e-6  # hwLat[NVLINK][RING][SIMPLE]
NCCL_NET_STEP_S = 14.0e-6  # hwLat[NET][RING][SIMPLE]
# conccl's fixed GPU time per call: a 1 MiB push all-gather on H200 x4 (27.3 us of GPU time,
# docs/results.md, small calls); its host time (~70 us) is hidden where the host runs
# ahead of the GPU, as it does in an FSDP step.
CE_CALL_S = 27e-6
# The reduction kernel's rate as a share of the profile's HBM bandwidth: 8 bf16 operands of
# 256 MiB summed in 0.712-0.714 ms on one H200 = 3.39 TB/s read + written, 0.84 of the 4.04
# the profile measured (2 operands: 0.90; docs/results.md, the reduction kernel).
REDUCE_HBM_SHARE = 0.84

# The hierarchical compositions, in call order: (where, collective), where "network" is NCCL
# over the N ranks of equal local index (whole tensor F / L) and "node" copy engines over the
# L GPUs of a node (whole tensor F).
HIERARCHY: dict[str, tuple[tuple[str, str], ...]] = {
    "all_gather": (("network", "all_gather"), ("node", "all_gather")),
    "reduce_scatter": (("node", "reduce_scatter"), ("network", "reduce_scatter")),
    "all_reduce": (("node", "reduce_scatter"), ("network", "all_reduce"), ("node", "all_gather")),
}


def gbps(gbit_per_s: float) -> float:
    """Gbit/s (as links are rated) -> bytes/s."""
    return gbit_per_s * 1e9 / 8


@dataclass(frozen=True)
class Links:
    """A job's shape and links: what the model predicts from. Bandwidths per GPU in bytes/s."""
    nodes: int
    gpus_per_node: int
    network_bytes_per_s: float  # B_net
    nvlink_bytes_per_s: float  # B_ce: copy engines
    nccl_nvlink_bytes_per_s: float  # B_nccl: NCCL's SM kernels over NVLink (bus bandwidth)
    reduce_bytes_per_s: float  # R: the reduction kernel, bytes read + written
    nccl_ctas: int  # C
    reduce_ctas: int  # K
    ce_call_s: float = CE_CALL_S
    nccl_base_s: float = NCCL_BASE_LATENCY_S
    nccl_intra_step_s: float = NCCL_INTRA_STEP_S
    nccl_net_step_s: float = NCCL_NET_STEP_S
    source: dict = field(default_factory=dict)  # where each default came from

    def __post_init__(self):
        for name in ("nodes", "gpus_per_node", "nccl_ctas", "reduce_ctas"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanError(f"{name} must be a whole number >= 1, got {v!r}")
        if self.world < 2:
            raise PlanError(f"{self.nodes} node(s) x {self.gpus_per_node} GPU(s) is one rank: no collective to predict")
        for name in ("network_bytes_per_s", "nvlink_bytes_per_s", "nccl_nvlink_bytes_per_s", "reduce_bytes_per_s",
                     "ce_call_s", "nccl_base_s", "nccl_intra_step_s", "nccl_net_step_s"):
            v = getattr(self, name)
            lo_ok = v > 0 if name.endswith("bytes_per_s") else v >= 0
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo_ok or not math.isfinite(v):
                raise PlanError(f"{name} must be a finite number {'> 0' if name.endswith('bytes_per_s') else '>= 0'}, "
                                f"got {v!r}")

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


def links_from_profile(p: HardwareProfile, nodes: int, gpus_per_node: int, network_bytes_per_s: float | None = None,
                       nvlink_bytes_per_s: float | None = None, nccl_ctas: int | None = None,
                       collective: str = "all_gather", size: int = 1 << 30) -> Links:
    """:class:`Links` with every link not given taken from the profile (and the defaults above).

    ``nvlink_bytes_per_s`` given: NCCL's NVLink rate is scaled with it by the profile's ratio of
    NCCL's all-gather bus bandwidth to the copy engines' (0.91 on H200 x4)."""
    nccl_fit = p.collectives.get("nccl", {}).get("all_gather")
    ratio = nccl_fit["bus_bytes_per_s"] / p.nvlink_bytes_per_s if nccl_fit else 1.0
    ce = nvlink_bytes_per_s or p.nvlink_bytes_per_s
    net = network_bytes_per_s or gbps(DEFAULT_NETWORK_GBPS)
    ctas = nccl_ctas or default_ctas(p, collective, size)
    src = {"profile": f"{p.device} x{p.world}, {p.source.get('date', '?')}, commit {p.source.get('commit', '?')}",
           "network": "given" if network_bytes_per_s else f"default: one {DEFAULT_NETWORK_GBPS:g} Gb/s NIC per GPU "
                                                          "(line rate)",
           "nvlink": "given" if nvlink_bytes_per_s else "the profile's copy-engine bus bandwidth",
           "nccl_nvlink": f"{ratio:.2f} x the NVLink rate (the profile's NCCL all-gather bus bandwidth over its "
                          "copy engines')",
           "nccl_ctas": "given" if nccl_ctas else "the profile's: fewest CTAs within 3% of NCCL's uncapped speed",
           "reduce": f"{REDUCE_HBM_SHARE} x the profile's HBM bandwidth, half its {p.sm_count} SMs"}
    return Links(nodes, gpus_per_node, net, ce, ce * ratio, REDUCE_HBM_SHARE * p.hbm_bytes_per_s, ctas,
                 max(1, p.sm_count // 2), source=src)


@dataclass(frozen=True)
class Step:
    """One part of a hierarchical call: seconds split as latency, transfer and sum."""
    where: str  # "network" (NCCL, N ranks) | "node" (copy engines, L ranks)
    collective: str
    ranks: int
    whole_bytes: int  # the step's whole tensor (F or F / L)
    latency_s: float
    transfer_s: float
    sum_s: float
    sm_s: float  # SM-seconds it holds per GPU

    @property
    def seconds(self) -> float:
        return self.latency_s + self.transfer_s + self.sum_s


@dataclass(frozen=True)
class Prediction:
    """Flat NCCL against the hierarchical composition for one call, per GPU. A prediction."""
    collective: str
    size: int  # output bytes per rank
    whole_bytes: int  # F
    nodes: int
    gpus_per_node: int
    flat_latency_s: float
    flat_transfer_s: float
    flat_busbw: float  # bytes/s
    flat_sm_s: float
    steps: tuple[Step, ...]

    @property
    def flat_s(self) -> float:
        return self.flat_latency_s + self.flat_transfer_s

    @property
    def hier_s(self) -> float:
        return sum(s.seconds for s in self.steps)

    @property
    def hier_sm_s(self) -> float:
        return sum(s.sm_s for s in self.steps)

    @property
    def sm_s_saved(self) -> float:
        return self.flat_sm_s - self.hier_sm_s

    @property
    def pipelined_bound_s(self) -> float:
        return max(s.seconds for s in self.steps)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["steps"] = [{**asdict(s), "seconds": s.seconds} for s in self.steps]
        d.update(world=self.nodes * self.gpus_per_node, flat_s=self.flat_s, hier_s=self.hier_s,
                 hier_sm_s=self.hier_sm_s, sm_s_saved=self.sm_s_saved, pipelined_bound_s=self.pipelined_bound_s)
        return d


def ring_steps(collective: str, ranks: int) -> int:
    """Steps of NCCL's ring: bf(n) * n (n - 1; 2 (n - 1) for all-reduce)."""
    return round(collectives.get(collective).bus_factor(ranks) * ranks)


def flat_busbw(links: Links) -> float:
    """NCCL's ring bus bandwidth over all W ranks (module docstring)."""
    n, l = links.nodes, links.gpus_per_node
    if n == 1:
        return links.nccl_nvlink_bytes_per_s
    nic = l * links.network_bytes_per_s
    return nic if l == 1 else min(nic, links.nccl_nvlink_bytes_per_s * l / (l - 1))


def nccl_ring_latency(links: Links, collective: str, ranks: int, nodes: int) -> float:
    """NCCL's tuning model for a ring of ``ranks`` over ``nodes`` nodes (Simple protocol)."""
    steps = ring_steps(collective, ranks)
    inter = ring_steps(collective, nodes) if nodes > 1 else 0
    # (NCCL takes the larger of this and 3 x its network post overhead, 3 us on Intel hosts, for
    # the intra-node steps of a multi-node ring: 3.4 us either way there.)
    return links.nccl_base_s + (steps - inter) * links.nccl_intra_step_s + inter * links.nccl_net_step_s


def whole_bytes(collective: str, size: int, world: int) -> int:
    """F = W x chunk bytes of a call of ``size`` output bytes per rank."""
    coll = collectives.get(collective)
    chunk = coll.layout(world, 0).chunk_bytes(size)
    if chunk < 1:
        raise PlanError(f"{collective} of {size} B per rank over {world} ranks is under one byte per chunk: "
                        f"give at least {world} B")
    return world * chunk


def _reduces(collective: str, ranks: int) -> bool:
    """Whether the collective sums what arrives (an output chunk with several sources)."""
    return any(len(src) > 1 for src in collectives.get(collective).layout(ranks, 0).sources)


def predict(links: Links, collective: str, size: int) -> Prediction:
    """Flat NCCL and the hierarchical composition for one call of ``collective`` with ``size``
    output bytes per rank on ``links`` (formulas: the module docstring)."""
    if collective not in HIERARCHY:
        raise PlanError(f"no hierarchical {collective} is built or modelled; predictions cover "
                        f"{', '.join(HIERARCHY)}")
    n, l, w = links.nodes, links.gpus_per_node, links.world
    f = whole_bytes(collective, size, w)
    busbw = flat_busbw(links)
    flat_lat = nccl_ring_latency(links, collective, w, n)
    flat_xfer = collectives.get(collective).bus_factor(w) * f / busbw
    steps = []
    for where, name in HIERARCHY[collective]:
        if where == "network" and n > 1:
            lat = nccl_ring_latency(links, name, n, n)
            xfer = collectives.get(name).bus_factor(n) * (f / l) / links.network_bytes_per_s
            steps.append(Step(where, name, n, f // l, lat, xfer, 0.0, links.nccl_ctas * (lat + xfer)))
        elif where == "node" and l > 1:
            xfer = collectives.get(name).bus_factor(l) * f / links.nvlink_bytes_per_s
            summed = (l + 1) * (f / l) / links.reduce_bytes_per_s if _reduces(name, l) else 0.0
            steps.append(Step(where, name, l, f, links.ce_call_s, xfer, summed, links.reduce_ctas * summed))
    return Prediction(collective, size, f, n, l, flat_lat, flat_xfer, busbw, links.nccl_ctas * (flat_lat + flat_xfer),
                      tuple(steps))


# The study's prediction mode (``conccl study --predict --nodes N``): every modelled collective
# at these output sizes per rank, where the profile's GPU holds the call's buffers.
STUDY_SIZES = (1 << 20, 16 << 20, 256 << 20, 1 << 30)


def sweep(p: HardwareProfile, nodes: int, gpus_per_node: int, network_bytes_per_s: float | None = None,
          nvlink_bytes_per_s: float | None = None, nccl_ctas: int | None = None,
          sizes=STUDY_SIZES) -> list[tuple[Links, Prediction]]:
    """(links, prediction) for every collective of :data:`HIERARCHY` at every size in ``sizes``
    whose buffers fit the profile's GPU (NCCL's CTA count, when not given, is the profile's for
    each collective and size, so the links are made per call)."""
    world, out = nodes * gpus_per_node, []
    for name in HIERARCHY:
        for size in sizes:
            if collectives.get(name).buffer_bytes(size, world) > p.memory_bytes:
                continue
            links = links_from_profile(p, nodes, gpus_per_node, network_bytes_per_s, nvlink_bytes_per_s, nccl_ctas,
                                       name, size)
            out.append((links, predict(links, name, size)))
    return out


def sweep_markdown(rows: list[tuple[Links, Prediction]]) -> str:
    """The sweep as a labelled table (what ``conccl study --nodes`` writes to multinode.md)."""
    links = rows[0][0]
    lines = [f"# PREDICTION: {links.nodes} node(s) x {links.gpus_per_node} GPUs, flat NCCL against conccl's "
             "hierarchical collectives", "",
             "A model of a job no machine here has; nothing in it was measured across nodes. Formulas and "
             "constants: docs/planner.md (Beyond one node: predictions) and `conccl.planner.multinode`.", "",
             f"- profile: {links.source.get('profile', 'given')}",
             f"- network per GPU: {links.network_bytes_per_s / 1e9:.1f} GB/s ({links.source.get('network', 'given')})",
             f"- NVLink per GPU: {links.nvlink_bytes_per_s / 1e9:.1f} GB/s copy engines "
             f"({links.source.get('nvlink', 'given')}), NCCL {links.nccl_nvlink_bytes_per_s / 1e9:.1f} GB/s", "",
             "| collective | size per rank | flat NCCL (ms) | hierarchical (ms) | hier. / flat | NCCL CTAs | "
             "SM-ms saved per GPU | of flat's SM time | pipelined bound (ms, not built) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for lk, pr in rows:
        lines.append(f"| {pr.collective} | {format_size(pr.size)} | {1e3 * pr.flat_s:.3f} | {1e3 * pr.hier_s:.3f} | "
                     f"{pr.hier_s / pr.flat_s:.2f}x | {lk.nccl_ctas} | {1e3 * pr.sm_s_saved:.2f} | "
                     f"{100 * pr.sm_s_saved / pr.flat_sm_s:.0f}% | {1e3 * pr.pipelined_bound_s:.3f} |")
    return "\n".join(lines) + "\n"
