"""CPU multi-process tier: the small MoE model (conccl.bench.moe_model) trained with expert
parallelism over gloo, once on conccl.ep (over the reference executor) and once on the
torchtitan-style reference dispatcher: the per-step losses and every final parameter equal
bit for bit, and the loss falls."""
from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from conccl.bench import moe_model  # noqa: E402
from conccl.launch import free_port
from conccl.testing import spawn  # noqa: E402

STEPS = 20
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def _bits(t):
    return t.detach().contiguous().view(BITS[t.dtype])


def _train_both(comm, port, cfg, dtype):
    torch.set_num_threads(1)  # ranks share few cores: tiny ops with several threads each crawl
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.world)
    try:
        runs = {}
        for dispatcher, group in (("conccl", comm), ("reference", None)):
            model = moe_model.build(cfg, dispatcher, group=group, dtype=dtype)
            losses = moe_model.train(model, STEPS, lr=1e-2)
            runs[dispatcher] = losses, {n: _bits(p) for n, p in model.state_dict().items()}
        (lc, pc), (lr, pr) = runs["conccl"], runs["reference"]
        differ = sorted(n for n in pc if not torch.equal(pc[n], pr[n]))
        return lc, lr, differ, sorted(pc)
    finally:
        dist.destroy_process_group()


SMALL = moe_model.MoEConfig(layers=2, experts=8, topk=2, dim=32, ffn=48, vocab=64, seq=16, batch=4)


@pytest.mark.parametrize("world,cfg,dtype", [
    (2, SMALL, torch.float32),
    (2, SMALL, torch.bfloat16),
    (4, dataclasses.replace(SMALL, seq=8), torch.float32),
    (2, dataclasses.replace(SMALL, experts=4, topk=3, ffn=32, mlp="gelu", expert_gemm="grouped_mm"), torch.float32),
], ids=["world2-fp32", "world2-bf16", "world4-fp32", "world2-fp32-gelu-grouped_mm"])
def test_training_on_conccl_ep_equals_the_reference_bit_for_bit(world, cfg, dtype):
    results = spawn(world, _train_both, free_port(), cfg, dtype)
    for rank, (lc, lr, differ, names) in enumerate(results):
        assert len(lc) == STEPS
        assert lc == lr, (rank, lc, lr)  # Python floats from fp32: equal values, equal bits
        assert differ == [], (rank, differ)
        assert any(n.startswith("experts.") for n in names)
    losses = results[0][0]
    assert all(r[0] == losses for r in results)  # the mean over all ranks' tokens
    assert losses[-1] < 0.6 * losses[0], losses  # it learns the synthetic map
