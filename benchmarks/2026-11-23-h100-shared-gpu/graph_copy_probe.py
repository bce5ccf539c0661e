"""Which engine runs a same-GPU copy captured into a CUDA graph: a copy engine or an SM kernel?

The shared-GPU rig (scripts/shared_gpu_smoke.py) saw the driver's ``memcpy*_post`` kernels in a replayed graph of
conccl calls whose copies were all same-GPU (ranks sharing one GPU), where the same calls
made eagerly showed only copy-engine records. This probe captures one ``cuMemcpyAsync``
(and, for comparison, ``cuMemcpyPeerAsync`` and ``Tensor.copy_``) per size, replays it under
the profiler and prints what the profiler saw: kernels (SMs) or memcpy records (copy engines).

    PYTHONPATH=src python benchmarks/2026-11-23-h100-shared-gpu/graph_copy_probe.py [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json

import torch
from torch.profiler import ProfilerActivity, profile

from conccl._driver import check, driver


def _seen(fn) -> dict:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = sorted({e.name for e in gpu if "memcpy" not in e.name.lower() or "_post" in e.name})
    copies = sorted({e.name for e in gpu if e.name not in kernels})
    return {"kernels": kernels, "copy_records": copies}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cu = driver()
    torch.empty(1, device="cuda")  # makes the primary context current on this thread
    ctx = check(cu.cuCtxGetCurrent())
    stream = torch.cuda.Stream()
    rows = []
    for nbytes in (4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20):
        src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
        dst = torch.zeros_like(src)
        ways = {
            "cuMemcpyAsync": lambda s: check(cu.cuMemcpyAsync(cu.CUdeviceptr(dst.data_ptr()), cu.CUdeviceptr(src.data_ptr()),
                                                              nbytes, cu.CUstream(s.cuda_stream))),
            "cuMemcpyPeerAsync": lambda s: check(cu.cuMemcpyPeerAsync(cu.CUdeviceptr(dst.data_ptr()), ctx,
                                                                      cu.CUdeviceptr(src.data_ptr()), ctx, nbytes,
                                                                      cu.CUstream(s.cuda_stream))),
            "Tensor.copy_": lambda s: dst.copy_(src),
        }
        for name, issue in ways.items():
            with torch.cuda.stream(stream):
                dst.zero_()
                torch.cuda.synchronize()
                eager = _seen(lambda: issue(stream))
                ok_eager = torch.equal(dst, src)
                dst.zero_()
                torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(g, stream=stream):
                    issue(torch.cuda.current_stream())
            except (RuntimeError, torch.AcceleratorError) as e:  # e.g. a call the driver cannot capture
                torch.cuda.synchronize()
                rows.append({"bytes": nbytes, "way": name, "eager": eager, "graph": f"not captured: {e}".splitlines()[0],
                             "right": ok_eager})
                print(f"{nbytes:>10} B {name:<18} eager {eager['kernels'] or eager['copy_records']}  "
                      f"graph {rows[-1]['graph']}", flush=True)
                continue
            graph = _seen(g.replay)
            rows.append({"bytes": nbytes, "way": name, "eager": eager, "graph": graph,
                         "right": ok_eager and torch.equal(dst, src)})
            print(f"{nbytes:>10} B {name:<18} eager {eager['kernels'] or eager['copy_records']}  "
                  f"graph {graph['kernels'] or graph['copy_records']}  right={rows[-1]['right']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "driver": check(cu.cuDriverGetVersion()), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
