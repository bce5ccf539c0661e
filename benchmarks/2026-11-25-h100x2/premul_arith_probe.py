"""Probe: which arithmetic NCCL's reduce-scatter uses for AVG and PREMUL_SUM at two ranks.

2 x H100 (2026-11-25): conccl's products in fp32 (unrounded) and products rounded to the dtype
(NCCL's __hmul as its source reads) both differ from NCCL on some elements. Candidates, per
element of rank r's output (o: rank r's own operand, p: the peer's, s: the factor):
  fp32_sum       dtype(f32(o*s) + f32(p*s))          conccl's stated arithmetic
  rounded_terms  dtype(dtype(o*s) + dtype(p*s))      premultiply rounded, then add
  fma_own        dtype(o*s + dtype(p*s)) exactly     the peer's term arrived rounded, own fused
  fma_peer       dtype(p*s + dtype(o*s)) exactly
Prints the fraction of elements each candidate gets right, per dtype and op, on every rank.
Run: PYTHONPATH=src python3 benchmarks/2026-11-25-h100x2/premul_arith_probe.py (2 GPUs)."""
import torch
import torch.distributed as dist

from conccl.launch import run_per_gpu


def probe(rank, world):
    out = {}
    for dtype in (torch.float16, torch.float32, torch.bfloat16):
        for name, factor in (("AVG", None), ("PREMUL_SUM(0.37)", 0.37)):
            g = torch.Generator(device="cuda").manual_seed(5)
            x = torch.randn(world, 1 << 20, device="cuda", generator=g) * torch.logspace(-7, 2, 1 << 20, device="cuda")
            x = x.to(dtype)  # every rank holds every rank's input: x[q] is rank q's
            op = dist.ReduceOp.AVG if factor is None else dist._make_nccl_premul_sum(factor)
            s = torch.tensor(0.5 if factor is None else factor, dtype=dtype).double()
            inp = x[rank].repeat(world)  # rank q contributes x[q] to every output chunk
            ref = torch.empty(1 << 20, dtype=dtype, device="cuda")
            dist.reduce_scatter_tensor(ref, inp.clone(), op=op)
            o, p = x[rank].double(), x[1 - rank].double()
            sf = float(s)
            cands = {"fp32_sum": (o.float() * sf + p.float() * sf).to(dtype),
                     "rounded_terms": ((o * sf).to(dtype).double() + (p * sf).to(dtype).double()).to(dtype),
                     "fma_own": (o * sf + (p * sf).to(dtype).double()).to(dtype),
                     "fma_peer": (p * sf + (o * sf).to(dtype).double()).to(dtype)}
            out[f"{dtype} {name}"] = {k: round(float((v == ref).float().mean()), 6) for k, v in cands.items()}
    return out


if __name__ == "__main__":
    for rank, r in enumerate(run_per_gpu(probe, nprocs=2)):  # the formulas are two ranks
        for k, v in r.items():
            print("rank", rank, k, v)
