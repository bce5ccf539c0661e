"""The bytes the measured study's collectives move, and the check of what they left: the
pattern NCCL produces (the same check NCCL's own runs pass), so a strategy that moved nothing
or the wrong bytes is caught. Generated in pieces, on the GPU, to bound the temporaries."""
from __future__ import annotations

import torch


def _pattern(src: int, chunk: int, offset: int, n: int, device):
    """Input chunk ``chunk`` of rank ``src``, elements [offset, offset+n), as int16 (bf16 bits)."""
    i = torch.arange(offset, offset + n, dtype=torch.int64, device=device)
    return ((i * 7 + (src * 13 + chunk * 29 + 1)) % 251).to(torch.int16)


PIECE = 1 << 26  # elements per generated piece: bounds the temporaries (512 MiB of int64)


def _values(src: int, chunk: int, offset: int, n: int, device):
    """Input chunk of a reducing collective: whole numbers in [-7, 7] as bf16, so a sum over up
    to 8 ranks (at most 56 in size) is exact in any order, NCCL's and conccl's alike."""
    i = torch.arange(offset, offset + n, dtype=torch.int64, device=device)
    return ((i * 7 + (src * 13 + chunk * 29 + 1)) % 15 - 7).to(torch.bfloat16)


def fill_values(t16, src: int, chunk: int) -> None:
    bf = t16.view(torch.bfloat16)
    for off in range(0, bf.numel(), PIECE):
        n = min(PIECE, bf.numel() - off)
        bf[off:off + n].copy_(_values(src, chunk, off, n, bf.device))


def matches_sum(t16, sources) -> bool:
    """Whether ``t16`` holds the sum of the value chunks ``sources`` ((rank, chunk) pairs)."""
    for off in range(0, t16.numel(), PIECE):
        n = min(PIECE, t16.numel() - off)
        acc = sum(_values(r, k, off, n, t16.device).float() for r, k in sources)
        if not bool((t16[off:off + n] == acc.to(torch.bfloat16).view(torch.int16)).all()):
            return False
    return True


def fill_pattern(t16, src: int, chunk: int) -> None:
    for off in range(0, t16.numel(), PIECE):
        n = min(PIECE, t16.numel() - off)
        t16[off:off + n].copy_(_pattern(src, chunk, off, n, t16.device))


def matches_pattern(t16, src: int, chunk: int) -> bool:
    for off in range(0, t16.numel(), PIECE):
        n = min(PIECE, t16.numel() - off)
        if not bool((t16[off:off + n] == _pattern(src, chunk, off, n, t16.device)).all()):
            return False
    return True
