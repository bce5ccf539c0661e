"""Argument checks shared by every collective. They run before anything is queued, so a bad
call raises and leaves the output untouched."""
from __future__ import annotations

from typing import Sequence


class InvalidArgument(ValueError):
    """A collective was called with arguments it cannot run with. Nothing was moved."""


def check_tensor(name: str, t, device_type: str) -> None:
    import torch  # here: `import conccl` (errors -> validate) works without torch

    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != device_type:
        hint = " (conccl collectives move GPU memory; move the tensor with .cuda())" if t.device.type == "cpu" else ""
        raise InvalidArgument(f"{name} is on {t.device}, expected a {device_type} tensor{hint}")
    if not t.is_contiguous():
        raise InvalidArgument(f"{name} must be contiguous (got shape {tuple(t.shape)}, stride {t.stride()}); call .contiguous() first")


def check_pair(output, input, device_type: str) -> None:
    check_tensor("output", output, device_type)
    check_tensor("input", input, device_type)
    if output.dtype != input.dtype:
        raise InvalidArgument(f"dtype mismatch: output is {output.dtype}, input is {input.dtype}")
    if output.device != input.device:
        raise InvalidArgument(f"device mismatch: output is on {output.device}, input on {input.device}")


def byte_range(t) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def overlaps(a, b) -> bool:
    a0, a1 = byte_range(a)
    b0, b1 = byte_range(b)
    return a0 < a1 and b0 < b1 and a0 < b1 and b0 < a1  # empty ranges never overlap


def check_splits(name: str, splits: Sequence[int] | None, world: int, dim0: int) -> list[int]:
    """Return the per-rank split sizes along dim 0; ``None`` means equal splits."""
    if splits is None:
        if dim0 % world:
            raise InvalidArgument(
                f"{name}: dim 0 of size {dim0} does not divide evenly among {world} ranks; pass split sizes"
            )
        return [dim0 // world] * world
    splits = list(splits)
    if len(splits) != world:
        raise InvalidArgument(f"{name} has {len(splits)} entries, expected one per rank ({world})")
    for i, s in enumerate(splits):
        if isinstance(s, bool) or not isinstance(s, int) and not hasattr(s, "__index__"):
            raise InvalidArgument(f"{name}[{i}] = {s!r} is not an integer")
        if int(s) < 0:
            raise InvalidArgument(f"{name}[{i}] = {s} is negative")
    splits = [int(s) for s in splits]
    if sum(splits) != dim0:
        raise InvalidArgument(f"{name} sum to {sum(splits)}, but the tensor has {dim0} rows along dim 0")
    return splits
