"""CPU tier: the CPU reference harness (``conccl.testing.spawn`` / ``spawn_hosts``) keeps its
forked ranks off CUDA.

- Each rank hides the GPUs from itself before anything asks torch, so that a GPU machine runs
  the CPU reference paths, not CUDA ones because a GPU is visible (FSDP2 picked CUDA there).
- A parent whose CUDA runtime a forked rank would inherit (on 2 x H100, pytest had initialised
  CUDA before the CPU tiers) is refused at once with a clear error, where its ranks used to
  hang and be reported as "returned nothing" two minutes later. That state is made here by
  pretending it: torch.cuda's own flags, patched in the parent (the fork inherits the patch).
"""
from __future__ import annotations

import os
import time

import pytest

torch = pytest.importorskip("torch")

from conccl.testing import spawn, spawn_hosts  # noqa: E402


def _what_the_rank_sees(comm):
    # (tests/conftest.py already pretends no GPU in this tier's processes; what the rank itself
    # set is what a GPU machine's CUDA runtime and NVML count read)
    return (os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
            torch.cuda.is_available(), torch.cuda.device_count())


def test_reference_ranks_see_no_gpu():
    assert spawn(2, _what_the_rank_sees) == [("", "1", False, 0)] * 2


def test_simulated_host_ranks_see_no_gpu():
    assert spawn_hosts("0,1", _what_the_rank_sees) == [("", "1", False, 0)] * 2


def test_a_parent_with_cuda_initialised_is_refused_before_forking(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    for run in (lambda: spawn(2, _what_the_rank_sees), lambda: spawn_hosts("0,1", _what_the_rank_sees)):
        with pytest.raises(RuntimeError, match="this process has initialised CUDA"):
            run()


@pytest.mark.parametrize("hosts", [False, True])
def test_ranks_forked_from_a_cuda_runtime_fail_at_once(monkeypatch, hosts):
    # what a rank sees when the parent asked the CUDA runtime (cudaGetDeviceCount) without
    # initialising CUDA in Python: torch marks the fork bad
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="forked from a process that had asked the CUDA runtime") as e:
        spawn_hosts("0,1", _what_the_rank_sees) if hosts else spawn(2, _what_the_rank_sees)
    assert time.monotonic() - t0 < 30, "the ranks were not refused at once"
    assert "rank 0" in str(e.value) and "rank 1" in str(e.value)
