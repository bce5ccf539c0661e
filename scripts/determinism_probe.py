"""Is one training step of the FSDP benchmark's model bit-reproducible on this GPU?

Runs the model of `conccl bench fsdp` (unsharded, one GPU) for a few AdamW steps twice from the
same seed, with and without torch.use_deterministic_algorithms, and prints whether the two
runs' losses and weights agree bit for bit, and the step time of each mode. A loss compared
between stock FSDP2 and conccl means something only where this says the model is
reproducible.
"""
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from conccl.bench.fsdp import ModelShape, build  # noqa: E402


def run(deterministic: bool, tokens: int, layers: int, steps: int = 4):
    torch.use_deterministic_algorithms(deterministic)
    model, _ = build("no_comm", ModelShape(layers=layers), torch.device("cuda"))
    g = torch.Generator(device="cuda").manual_seed(1000)
    x = torch.randn(1, tokens, 4096, generator=g, device="cuda", dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    losses, times = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(x).float().pow(2).mean()
        loss.backward()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    w = torch.cat([p.detach().float().view(-1) for p in model.parameters()])
    return losses, w, sorted(times)[len(times) // 2]


for det in (False, True):
    for tokens in (2048,):
        a, wa, ta = run(det, tokens, 2)
        b, wb, tb = run(det, tokens, 2)
        print(f"deterministic={det} tokens={tokens}: losses equal {a == b} weights equal {torch.equal(wa, wb)} "
              f"max |dw| {float((wa - wb).abs().max()):.3g} step {ta:.2f}/{tb:.2f} ms  losses {a} {b}", flush=True)
