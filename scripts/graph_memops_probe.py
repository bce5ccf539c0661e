"""Can this driver capture what a captured conccl call is made of? (one GPU)

Captures into a CUDA graph, on one stream: a write of 1 into a word, a wait for it >= 1, a
write of 0 into it (the waiter's reset), one cuMemcpyAsync and a launch of conccl's reduction
kernel (through the CompiledProgram a captured call uses: single stream memory ops, single
copies); replays the graph several times with new inputs and checks the results and that the
word ends at 0. Prints one line per check.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from conccl.device.driver import driver  # noqa: E402
from conccl.executors.cuda.program import CompiledProgram  # noqa: E402
from conccl.executors.cuda.lowering import CopyStep, ReduceStep, SignalBatch, SignalStep

cu = driver()
dev = torch.device("cuda", 0)
word = torch.zeros(4, dtype=torch.int32, device=dev)
a = torch.empty(1 << 20, dtype=torch.bfloat16, device=dev)
b = torch.empty_like(a)
c = torch.empty_like(a)
addr = word.data_ptr()
n = a.numel() * 2
# the lowered steps of: set word=1, wait word>=1, reset word (write seq-1 = 0), copy a->b, reduce (a, b)->c
lowered = ((SignalStep(False, addr, 0), SignalStep(True, addr, 0), SignalStep(False, addr, -1),
            CopyStep(b.data_ptr(), a.data_ptr(), n),
            ReduceStep(c.data_ptr(), (a.data_ptr(), b.data_ptr()), n, "bfloat16", 1.0)),)
program = CompiledProgram(lowered, cu, 0)
side = torch.cuda.Stream()
a.normal_()
with torch.cuda.stream(side):  # warm-up: the kernel is compiled and loaded outside the capture
    program.launch_slot(0, cu.CUstream(side.cuda_stream), 1)
torch.cuda.synchronize()
print("eager:", torch.equal(c, (a.float() * 2).to(torch.bfloat16)), "word", word[0].item(), flush=True)
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        program.launch_slot(0, cu.CUstream(torch.cuda.current_stream().cuda_stream), 1)
except Exception as e:  # noqa: BLE001 - the probe reports what failed
    print("capture failed:", type(e).__name__, e)
    raise SystemExit(1)
ok = []
for i in range(5):
    a.normal_()
    g.replay()
    torch.cuda.synchronize()
    ok.append(torch.equal(b, a) and torch.equal(c, (a.float() * 2).to(torch.bfloat16)) and word[0].item() == 0)
print("captured: write, wait, reset, copy, reduce; replays right:", ok, flush=True)

# The same three signal operations as one cuStreamBatchMemOp: can a batch be captured too?
batched = CompiledProgram(((SignalBatch((SignalStep(False, addr, 0), SignalStep(True, addr, 0),
                                         SignalStep(False, addr, -1))),),), cu, 0)
g2 = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g2):
        batched.launch_slot(0, cu.CUstream(torch.cuda.current_stream().cuda_stream), 1)
    for _ in range(3):
        g2.replay()
    torch.cuda.synchronize()
    print("captured cuStreamBatchMemOp: replays ran, word", word[0].item(), flush=True)
except Exception as e:  # noqa: BLE001
    print("captured cuStreamBatchMemOp failed:", type(e).__name__, e, flush=True)
