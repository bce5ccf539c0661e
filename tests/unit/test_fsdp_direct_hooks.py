"""No-device tier: the reduce-scatter side of ``conccl.fsdp.copy_free`` without FSDP running: the
placeholder input, and which ``foreach_reduce`` calls take the direct path."""
from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

from conccl.fsdp import copy_free as fsdp_direct  # noqa: E402
from conccl.fsdp.copy_free import reduce_scatter as rs  # noqa: E402

pytestmark = pytest.mark.skipif(fsdp_direct.supported() is not None, reason=str(fsdp_direct.supported()))


def test_the_packed_input_is_a_placeholder_only_where_fsdp_divides_nothing():
    comm = fsdp_direct.DirectReduceScatter()
    for dtype in (torch.float32, torch.bfloat16):
        comm.expect_input = True
        t = comm.allocate((1000,), dtype=dtype, device=torch.device("cpu"))
        assert t.shape == (1000,) and t.stride() == (0,) and t.untyped_storage().nbytes() == t.element_size()
        assert isinstance(getattr(t, rs._PARTS), rs._Parts) and not comm.expect_input
        out = comm.allocate((500,), dtype=dtype, device=torch.device("cpu"))  # the output: real memory
        assert out.is_contiguous() and not hasattr(out, rs._PARTS)
    before = fsdp_direct.COUNTS.declined_reduces
    comm.expect_input = True  # fp16: FSDP divides the packed input before reducing it
    t = comm.allocate((1000,), dtype=torch.float16, device=torch.device("cpu"))
    assert t.is_contiguous() and not hasattr(t, rs._PARTS)
    assert fsdp_direct.COUNTS.declined_reduces == before + 1


class _Group:
    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n


@pytest.mark.parametrize("case,direct,declined", [("plain", True, 0), ("hsdp", False, 1), ("hook", False, 1),
                                                  ("alone", False, 0), ("other comm", False, 0)])
def test_which_reductions_take_the_direct_path(monkeypatch, case, direct, declined):
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    seen = []
    real = fsdp_direct.ORIGINAL.get("foreach_reduce", _fsdp_collectives.foreach_reduce)

    def fake(*args, **kwargs):
        comm = args[4]
        seen.append(getattr(comm, "expect_input", None))

    fake.__signature__ = inspect.signature(real)
    monkeypatch.setitem(fsdp_direct.ORIGINAL, "foreach_reduce", fake)
    rs._REDUCE_PARAMETERS.cache_clear()
    try:
        comm = fsdp_direct.DirectReduceScatter() if case != "other comm" else object()
        names = list(inspect.signature(real).parameters)
        args = {n: None for n in names}
        args.update(reduce_scatter_comm=comm, reduce_scatter_group=_Group(1 if case == "alone" else 2),
                    all_reduce_group=_Group(2) if case == "hsdp" else None,
                    all_reduce_hook=(lambda t: None) if case == "hook" else None)
        positional = [args[n] for n in names if inspect.signature(real).parameters[n].default is inspect._empty]
        before = fsdp_direct.COUNTS.declined_reduces
        rs._reduce(*positional)  # positionally, as FSDP's param group calls it
        assert seen == [direct if case != "other comm" else None]
        assert fsdp_direct.COUNTS.declined_reduces - before == declined
        if case != "other comm":
            assert comm.expect_input is False  # never left set for a later allocation
    finally:
        rs._REDUCE_PARAMETERS.cache_clear()


def test_a_home_hands_fsdp_one_stand_in_output_per_world_size_never_a_new_allocation():
    from conccl.fsdp.copy_free import gather

    home = gather._Home(torch.zeros(6, dtype=torch.bfloat16), (2, 4))
    out = home.stand_in(2, torch.device("cpu"))
    assert out.numel() == 12 and out.dtype == torch.bfloat16 and getattr(out, gather._DIRECT)
    assert out.untyped_storage().nbytes() == 2  # one element, expanded: nothing as large as the output
    assert home.stand_in(2, torch.device("cpu")) is out  # made once
    wider = home.stand_in(3, torch.device("cpu"))
    assert wider is not out and wider.numel() == 18 and getattr(wider, gather._DIRECT)
