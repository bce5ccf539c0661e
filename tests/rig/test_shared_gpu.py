"""The shared-GPU rig as tests: every part at every world it can run at (2, 3, 4), ranks as
processes sharing one GPU, each case right bit for bit (tests/rig/harness.py says how).

    PYTHONPATH=src CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q tests/rig

Opt-in (tests/rig/conftest.py): skipped in a run that does not name tests/rig."""
from __future__ import annotations

from rig.harness import part_problems


def test_part(rig_case, rig_results):
    part, world = rig_case
    result = rig_results(world, part)
    problems = part_problems(result, part)
    assert not problems, (f"part {part} at world {world} (run of {result['parts']}, {result['wall_s']} s, "
                          f"{result['gpu']}):\n" + "\n".join(problems[:40]))
