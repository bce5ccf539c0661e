"""GPU tier: every kernel source (src/conccl/kernels/cuda/) compiled by NVRTC for this GPU's
architecture with the defines its module passes, loaded by the driver (which assembles the PTX:
a register or resource limit fails here), and every kernel its module launches found in it;
compiled once per (source, defines, device). One GPU (this process)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpus(1)


def test_every_kernel_module_builds_its_kernels_on_this_gpu():
    from conccl.kernels import gather_sum, loader, moe_route, one_shot, reduce, spin

    dev = torch.cuda.current_device()
    torch.cuda.init()  # the primary context current, as where conccl runs
    scalar, vector, pair, wide = reduce._functions(dev)
    assert (len(scalar), len(vector), len(pair), len(wide)) == (3, 3, 3, 2)
    assert spin._function(dev) is not None and spin._function(dev, 0) is not None  # the sleep compiled out too
    assert one_shot._function(dev) is not None
    assert len(gather_sum._functions(dev)) == 6 and len(moe_route._functions(dev)) == 4
    assert reduce.grid_bound(dev) == torch.cuda.get_device_properties(dev).multi_processor_count // 2
    # one module per (source, defines, device): asking again compiles nothing
    first = loader.module(dev, "spin", {"POLL_SLEEP_NS": spin.POLL_SLEEP_NS})
    assert loader.module(dev, "spin", {"POLL_SLEEP_NS": spin.POLL_SLEEP_NS}) is first
    assert loader.module(dev, "spin", {"POLL_SLEEP_NS": 0}) is not first
    major, minor = torch.cuda.get_device_capability(dev)
    assert loader.arch(dev) == f"{major}{minor}"
