"""Sizes as people write them: '896M', '3.25G' (powers of 1024), and back."""
from __future__ import annotations

import argparse
import re

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text, whole: bool = True) -> int:
    """'1M' -> 1048576; accepts B/K/M/G/T suffixes (powers of 1024) and decimals ('1.5G').

    ``whole=False`` rounds a fractional byte count down (the paper's '1.63G') instead of
    refusing it. Raises ``argparse.ArgumentTypeError``, which argparse shows as it is."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([BKMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"malformed size {text!r}: expected e.g. 1024, 64K, 1M, 4G")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if not whole:
        value = float(int(value))
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"size {text!r} must be a whole number of bytes >= 1")
    return int(value)


def format_size(nbytes: int) -> str:
    """1048576 -> '1M', 3489660928 -> '3.25G': the shortest exact-to-0.01 label."""
    for unit in ("T", "G", "M", "K"):
        scale = _UNITS[unit]
        if nbytes >= scale:
            v = nbytes / scale
            return f"{v:.2f}".rstrip("0").rstrip(".") + unit
    return f"{nbytes}B"
