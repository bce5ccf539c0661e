"""CPU tier: the eager mark words refreshed every ``mark_refresh_calls`` calls
(CudaCopyEngineExecutor._refresh_marks), with a CPU pad standing in for the symmetric one. A
mark is awaited with a 32-bit wrap-around comparison (CU_STREAM_WAIT_VALUE_GEQ: passes when
``(int32)(word - value) >= 0``); a word left unwritten for 2^31 calls (a settled pipeline's
graph turns its marks into edges and never writes them) would read as ahead of the call
awaiting it. tests/gpu/test_gpu_tp.py runs the refresh on GPUs with a short period."""
from __future__ import annotations

import contextlib

import torch

from conccl.executors.cuda import executor as cuda_executor
from conccl.schedule.captured import GRAPH_SLOTS
from conccl.schedule.base import MARK_WORDS, mark_index, pad_words


def _geq_passes(word: int, value: int) -> bool:
    diff = (word - value) & 0xFFFFFFFF
    return diff < (1 << 31)  # (int32)(word - value) >= 0


def _executor(world=2):
    ex = object.__new__(cuda_executor.CudaCopyEngineExecutor)
    ex.world = world
    ex._pad = torch.full((pad_words(world, GRAPH_SLOTS) + 8,), 7, dtype=torch.int32)
    ex.mark_refresh_calls, ex._marks_written = cuda_executor.MARK_REFRESH_CALLS, 0
    return ex


def test_a_mark_stale_for_2_31_calls_reads_as_ahead_and_the_refresh_holds_it():
    seq = (1 << 31) + 10
    assert _geq_passes(0, seq)  # the hazard: a word last written at call 0
    ex = _executor()
    ex._refresh_marks(None, seq)
    lo = mark_index(0, 2, GRAPH_SLOTS)
    word = int(ex._pad[lo]) & 0xFFFFFFFF
    assert word == seq - 1 and not _geq_passes(word, seq) and not _geq_passes(word, seq + 5)
    assert _geq_passes(word, seq - 1) and _geq_passes(word, seq - 100)  # finished calls' awaits hold
    assert ex._marks_written == seq


def test_only_the_eager_marks_block_is_written_and_values_wrap_as_int32():
    ex = _executor(world=4)
    before = ex._pad.clone()
    seq = (1 << 32) + 3  # a sequence number past 32 bits: its low word, minus one
    ex._refresh_marks(None, seq)
    lo = mark_index(0, 4, GRAPH_SLOTS)
    assert (ex._pad[lo:lo + MARK_WORDS] == 2).all()
    changed = (ex._pad != before).nonzero().flatten()
    assert changed.min() == lo and changed.max() == lo + MARK_WORDS - 1  # not the signals, graph marks or spins
    ex._refresh_marks(None, 1 << 31)  # 0x7FFFFFFF
    assert int(ex._pad[lo]) == (1 << 31) - 1
    ex._refresh_marks(None, (1 << 31) + 1)  # 0x80000000 as int32
    assert int(ex._pad[lo]) == -(1 << 31)



def test_a_broken_group_past_2_31_calls_still_releases_its_marks(monkeypatch):
    """release() fills the marks with the call's sequence number as an int32 (torch refuses a
    Python int past 2^31 - 1 for an int32 fill, which would leave the waits queued)."""
    ex = _executor()
    ex.rank, ex._pads, ex._spin_words = 0, [0, 0], 0
    ex._spin_index = pad_words(2, GRAPH_SLOTS)
    ex._graph_slots_used = 0
    writes = []
    ex._watch_ops = type("Ops", (), {"write_value32": lambda self, addr, v: writes.append(v)})()
    ex._watch_stream = type("S", (), {"synchronize": lambda self: None})()
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    seq = (1 << 31) + 7
    ex.release(seq)
    lo = mark_index(0, 2, GRAPH_SLOTS)
    assert int(ex._pad[lo]) & 0xFFFFFFFF == seq and writes
