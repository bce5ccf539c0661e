"""The study's memory plan on pretend GPUs of 40, 80 and 141 GiB (no device): which default
scenarios run, which are skipped and why, and the arenas each runs in."""
from __future__ import annotations

import pytest

from conccl.study.config import HEADROOM, arena_plan, scenario_arenas, scenario_bytes, sweep_sizes
from conccl.study.run import fitting
from conccl.study.scenarios import load_suite, scenario_from_args, select
from conccl.study.config import StudyError

GiB = 1 << 30


@pytest.mark.parametrize("gib,world,skipped", [
    (141, 2, set()),  # an H200: the whole suite
    (79.2, 2, set()),  # an H100 80GB as CUDA reports it: the whole suite (the largest needs 76.4 GiB)
    (40, 2, {"mb2_26.5G/all_gather", "mb2_26.5G/all_to_all", "cb5_20G/all_gather", "cb5_20G/all_to_all",
             "cb5_13G/all_gather"}),
    (79.2, 4, set()),  # more ranks: smaller inputs
])
def test_the_default_suite_runs_what_fits_alone_and_skips_the_rest(gib, world, skipped, capsys):
    suite = select(load_suite(), quick=False)
    memory = int(gib * GiB)
    run, sk = fitting(suite, world, memory)
    assert {s.id for s in sk} == skipped
    assert len(run) + len(sk) == len(suite)
    assert all("GiB per GPU" in s.reason for s in sk)
    err = capsys.readouterr().err
    assert all(f"skipping {s}" in err for s in skipped)
    sweep, plan = arena_plan(run, world, False, memory)
    for s, (o, i) in zip(run, plan):
        need_o, need_i = scenario_arenas(s, world)
        assert o >= need_o and i >= need_i  # the scenario's buffers fit its arenas
        # and the arenas held fit beside what the scenario allocates itself
        assert o + i - sum(scenario_arenas(s, world)) + scenario_bytes(s, world) <= memory
    assert sweep == (max(sweep_sizes(False, memory)),) * 2


def test_the_old_whole_suite_allocation_would_not_fit_an_h100():
    """Arenas for the largest of every scenario at once need 87.6 GiB."""
    suite = select(load_suite(), quick=False)
    biggest_out = max(scenario_arenas(s, 2)[0] for s in suite)
    biggest_in = max(scenario_arenas(s, 2)[1] for s in suite)
    beside = max(scenario_bytes(s, 2) - sum(scenario_arenas(s, 2)) for s in suite)
    assert biggest_out + biggest_in + beside > 79.2 * GiB
    assert max(scenario_bytes(s, 2) for s in suite) <= 79.2 * GiB


def test_arenas_are_reallocated_only_where_they_must():
    suite = select(load_suite(), quick=False)
    _, plan = arena_plan(suite, 2, False, int(141 * GiB))
    # On 141 GiB the arenas only grow; on 79.2 they must shrink once the largest has run.
    assert all(b[0] >= a[0] and b[1] >= a[1] for a, b in zip(plan, plan[1:]))
    _, plan80 = arena_plan(suite, 2, False, int(79.2 * GiB))
    assert any(b[0] < a[0] or b[1] < a[1] for a, b in zip(plan80, plan80[1:]))
    assert len(set(plan80)) < len(suite)  # not once per scenario


def test_a_users_own_scenario_that_cannot_fit_is_refused():
    own = select(scenario_from_args("8192x8192x8192", "all_gather", "60G"), quick=False)
    with pytest.raises(StudyError, match="needs .* GiB per GPU.*smaller --gemm or --size"):
        fitting(own, 2, int(79.2 * GiB), own=True)


def test_nothing_that_fits_is_refused():
    suite = select(load_suite(), quick=False)
    with pytest.raises(StudyError, match="no selected scenario fits"):
        fitting(suite, 2, 2 * GiB)


def test_the_size_sweep_drops_sizes_that_cannot_fit():
    assert max(sweep_sizes(False, 141 * GiB)) == 4 * GiB
    assert max(sweep_sizes(False, 8 * GiB)) == 1 * GiB
