"""Every registered collective has a maker in the fuzz (tests/multiproc/test_fuzz.py, the long
tier): checked here, with no process, so that a new collective fails the quick tiers until the
fuzz draws it."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from conccl.collectives import REGISTRY  # noqa: E402


def test_every_registered_collective_is_fuzzed():
    makers = {"all_gather", "all_to_all", "reduce_scatter", "all_reduce"}
    assert set(REGISTRY) <= makers, ("add a maker to the fuzz (tests/multiproc/test_fuzz.py: _Fuzz._shapes) for "
                                     f"{sorted(set(REGISTRY) - makers)}")
