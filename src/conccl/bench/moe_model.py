"""A small MoE model trained with expert parallelism, for tests and benchmarks: the same model
on conccl.ep's dispatch and combine or on the torchtitan-style reference
(:mod:`conccl.bench.moe_reference`), whose arithmetic is conccl.ep's, so the two train to the
same losses and parameters bit for bit and a benchmark compares only their transports.

The model: token embedding, ``layers`` MoE blocks ``x + combine(experts(dispatch(norm(x))))``,
a final norm and an output head; attention-free (token mixing plays no part in expert
parallelism). The router: ``Linear(dim -> experts)``, softmax in fp32, top-k, the k weights
renormalised to sum to one. The experts: the rank's ``experts / world`` experts, a SwiGLU
(``w2(silu(x w1) * (x w3))``) or a GELU MLP, weights ``[local experts, dim, ffn]``; each local
expert's rows by one matmul (``expert_gemm="loop"``) or all of them by ``torch._grouped_mm``.

Parallelism: expert parameters live on their rank only, seeded by (seed, layer, global expert)
so they do not depend on the dispatcher or the world size; every other parameter is replicated
(the same seed on every rank) and its gradients summed over ranks by one ``dist.all_reduce`` of
one flat buffer per step. Each rank's loss is the mean over its tokens divided by the world
size: the gradients are those of the mean over all ranks' tokens.

Needs ``torch.distributed`` initialised (gloo on the CPU, NCCL on GPUs) for the replicated
gradients and the loss, whatever the dispatcher.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .. import ep
from ..ep.layout import experts_per_rank
from .moe_reference import reference_combine, reference_dispatch

__all__ = ["MoEConfig", "MoEModel", "DISPATCHERS", "build", "batch", "train_step", "train"]

DISPATCHERS = ("conccl", "reference")
MLPS = ("swiglu", "gelu")
EXPERT_GEMMS = ("auto", "loop", "grouped_mm")


@dataclass(frozen=True)
class MoEConfig:
    """``batch * seq`` tokens per rank per step; ``ffn``: one expert's hidden width."""

    layers: int = 4
    experts: int = 8
    topk: int = 2
    dim: int = 2048
    ffn: int = 1024
    vocab: int = 8192
    seq: int = 1024
    batch: int = 4
    mlp: str = "swiglu"
    expert_gemm: str = "auto"  # auto: grouped_mm for bf16 on CUDA where torch has it, else loop
    seed: int = 0

    def __post_init__(self):
        for name in ("layers", "experts", "topk", "dim", "ffn", "vocab", "seq", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"MoEConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.topk > self.experts:
            raise ValueError(f"topk {self.topk} > experts {self.experts}")
        if self.mlp not in MLPS:
            raise ValueError(f"MoEConfig.mlp {self.mlp!r}: one of {', '.join(MLPS)}")
        if self.expert_gemm not in EXPERT_GEMMS:
            raise ValueError(f"MoEConfig.expert_gemm {self.expert_gemm!r}: one of {', '.join(EXPERT_GEMMS)}")

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


def _randn(shape, std: float, device, dtype, *name) -> torch.Tensor:
    """Seeded by ``name`` (a tensor's own seed), drawn on the CPU in fp32 (the same numbers on
    every device), then moved and cast."""
    seed = int.from_bytes(hashlib.sha256(repr(name).encode()).digest()[:7], "little")
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * std).to(device=device, dtype=dtype)


class _Experts(nn.Module):
    """This rank's experts of one layer: ``w1``, ``w3`` [local, dim, ffn], ``w2`` [local, ffn, dim]."""

    def __init__(self, cfg: MoEConfig, layer: int, rank: int, local: int, grouped_mm: bool, device, dtype):
        super().__init__()
        self.swiglu, self.grouped_mm = cfg.mlp == "swiglu", grouped_mm
        names = ("w1", "w3", "w2") if self.swiglu else ("w1", "w2")

        def one(name, e):
            shape, std = ((cfg.ffn, cfg.dim), cfg.ffn ** -0.5 / (2 * cfg.layers) ** 0.5) if name == "w2" \
                else ((cfg.dim, cfg.ffn), cfg.dim ** -0.5)
            return _randn(shape, std, device, dtype, cfg.seed, "expert", layer, rank * local + e, name)

        for name in names:
            setattr(self, name, nn.Parameter(torch.stack([one(name, e) for e in range(local)])))

    def _mm(self, x, w, counts, offs):
        if offs is not None:
            return torch._grouped_mm(x, w, offs=offs)
        out, start, ws = [], 0, w.unbind(0)  # unbind: one backward for all experts' slices
        for e, n in enumerate(counts):
            out.append(x[start:start + n] @ ws[e])
            start += n
        return torch.cat(out)

    def forward(self, x, counts):
        """``x`` [N, dim] grouped by local expert, ``counts[e]`` rows each: [N, dim]."""
        offs = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32) if self.grouped_mm else None
        h = self._mm(x, self.w1, counts, offs)
        h = F.silu(h) * self._mm(x, self.w3, counts, offs) if self.swiglu else F.gelu(h)
        return self._mm(h, self.w2, counts, offs)


class MoEModel(nn.Module):
    """:func:`build`'s model. ``loss(tokens, targets)``: this rank's mean cross-entropy (fp32)."""

    def __init__(self, cfg: MoEConfig, dispatcher: str, group, pg, rank: int, world: int, device, dtype):
        super().__init__()
        if dispatcher not in DISPATCHERS:
            raise ValueError(f"dispatcher {dispatcher!r}: one of {', '.join(DISPATCHERS)}")
        self.cfg, self.dispatcher, self.group, self.pg, self.rank, self.world = cfg, dispatcher, group, pg, rank, world
        local = experts_per_rank(cfg.experts, world)
        grouped = cfg.expert_gemm == "grouped_mm" or (cfg.expert_gemm == "auto" and hasattr(torch, "_grouped_mm")
                                                      and torch.device(device).type == "cuda"
                                                      and dtype == torch.bfloat16)
        self.embed = nn.Parameter(_randn((cfg.vocab, cfg.dim), 1.0, device, dtype, cfg.seed, "embed"))
        self.routers = nn.ParameterList([_randn((cfg.dim, cfg.experts), cfg.dim ** -0.5, device, dtype, cfg.seed,
                                                "router", i) for i in range(cfg.layers)])
        self.norms = nn.ModuleList([nn.RMSNorm(cfg.dim, eps=1e-6, device=device, dtype=dtype)
                                    for _ in range(cfg.layers + 1)])
        self.experts = nn.ModuleList([_Experts(cfg, i, rank, local, grouped, device, dtype)
                                      for i in range(cfg.layers)])
        self.head = nn.Parameter(_randn((cfg.dim, cfg.vocab), cfg.dim ** -0.5, device, dtype, cfg.seed, "head"))

    def replicated(self) -> list:
        """The parameters every rank holds alike (all but the experts'), in a fixed order."""
        return [p for name, p in self.named_parameters() if not name.startswith("experts.")]

    def _moe(self, i: int, x):
        h = self.norms[i](x)
        probs = torch.softmax((h @ self.routers[i]).float(), dim=-1)
        w, idx = probs.topk(self.cfg.topk, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        if self.dispatcher == "conccl":
            rows, counts, handle = ep.dispatch(h, idx, w, self.cfg.experts, group=self.group)
            return ep.combine(self.experts[i](rows, counts), handle, w)
        rows, counts, handle = reference_dispatch(h, idx, w, self.cfg.experts, self.group)
        return reference_combine(self.experts[i](rows, counts), handle, w)

    def forward(self, tokens):
        """``tokens`` [T] int64: logits [T, vocab] in the model's dtype."""
        x = F.embedding(tokens, self.embed)
        for i in range(self.cfg.layers):
            x = x + self._moe(i, x)
        return self.norms[-1](x) @ self.head

    def loss(self, tokens, targets):
        return F.cross_entropy(self(tokens).float(), targets)


def build(cfg: MoEConfig, dispatcher: str, group=None, device="cpu", dtype=torch.float32, pg=None) -> MoEModel:
    """The model on this rank. ``dispatcher``: ``"conccl"`` (:func:`conccl.ep.dispatch` over
    ``group``, a conccl Group or a process group, default the world) or ``"reference"``
    (:mod:`conccl.bench.moe_reference` over ``group``, a process group, default the world).
    ``pg``: the process group that sums the replicated gradients and the losses (default the
    world); its ranks are the dispatcher's. Parameters in ``dtype`` on ``device``."""
    rank, world = dist.get_rank(pg), dist.get_world_size(pg)
    if dispatcher == "conccl" and hasattr(group, "rank") and (group.rank, group.world) != (rank, world):
        raise ValueError(f"the conccl group is rank {group.rank} of {group.world}, pg rank {rank} of {world}")
    return MoEModel(cfg, dispatcher, group, pg, rank, world, device, dtype)


def batch(cfg: MoEConfig, rank: int, step: int, device="cpu"):
    """``(tokens [batch * seq], targets [batch * seq])`` int64 of ``rank`` at ``step``: random
    tokens (seeded by seed, rank, step) and, as each target, a fixed random permutation of the
    vocabulary (seeded by seed) applied to its token: a map the model can learn."""
    perm = torch.randperm(cfg.vocab, generator=torch.Generator().manual_seed(cfg.seed))
    g = torch.Generator().manual_seed((cfg.seed * 65537 + rank) * 1_000_003 + step + 1)
    tokens = torch.randint(0, cfg.vocab, (cfg.tokens,), generator=g)
    return tokens.to(device), perm[tokens].to(device)


def train_step(model: MoEModel, opt, tokens, targets) -> torch.Tensor:
    """One step (collective): forward, backward, replicated gradients summed over ranks,
    ``opt.step()``. Returns the mean loss over all ranks' tokens, a 0-dim fp32 tensor (no host
    sync)."""
    opt.zero_grad(set_to_none=True)
    loss = model.loss(tokens, targets)
    (loss / model.world).backward()
    reps = model.replicated()
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in reps])
    dist.all_reduce(flat, group=model.pg)
    start = 0
    for p in reps:
        p.grad = flat[start:start + p.numel()].view_as(p)
        start += p.numel()
    opt.step()
    total = loss.detach().clone()
    dist.all_reduce(total, group=model.pg)
    return total / model.world


def train(model: MoEModel, steps: int, lr: float = 3e-3, weight_decay: float = 0.0, first_step: int = 0) -> list:
    """``steps`` steps of AdamW on :func:`batch`'s stream from ``first_step``: the losses (floats,
    the mean over all ranks' tokens per step). Collective."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    device = model.embed.device
    losses = [train_step(model, opt, *batch(model.cfg, model.rank, s, device))
              for s in range(first_step, first_step + steps)]
    return [float(x) for x in losses]
