"""The TP op bench's inputs, no device: the all-gather+GEMM's gathered ``A``, which the GEMM
alone and the serial schedules multiply, holds every rank's rows before anything is timed
(a GEMM's speed depends on its data: an uninitialised ``A`` made the GEMM alone ~13% faster
than on the gathered rows at 4096x8192x8192 on 2 x H100)."""
from __future__ import annotations

import torch

from conccl.bench.tp import gathered_input


def test_one_rank_multiplies_its_own_rows():
    a = torch.randn(8, 4)
    full = gathered_input(None, a, 8, 1)
    assert torch.equal(full, a) and full.data_ptr() != a.data_ptr()


class _Dist:
    """Two ranks' all-gather, this rank 0 and the peer's rows made here."""

    def __init__(self, peer):
        self.peer, self.calls = peer, 0

    def all_gather_into_tensor(self, out, inp):
        self.calls += 1
        out[:inp.shape[0]].copy_(inp)
        out[inp.shape[0]:].copy_(self.peer)


def test_two_ranks_gather_every_rank_rows_before_timing():
    a, peer = torch.randn(4, 6), torch.randn(4, 6)
    dist = _Dist(peer)
    full = gathered_input(dist, a, 8, 2)
    assert dist.calls == 1 and full.shape == (8, 6) and full.dtype == a.dtype
    assert torch.equal(full, torch.cat([a, peer]))
