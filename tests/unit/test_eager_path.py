"""CPU tier: the eager path's crossover table (conccl.planner.eager), its checks and the
runtime's choice of table. The routing itself: tests/multiproc/test_eager_routing.py."""
from __future__ import annotations

import dataclasses

import pytest

from conccl.api import check_nccl_below
from conccl.errors import InvalidArgument
from conccl.planner import eager
from conccl.planner.profile import EMBEDDED, ProfileError, load_profile

shipped_path = EMBEDDED.with_name
from conccl.runtime import eager_paths

MiB = 1 << 20


def _profile(ce, sm, world=4):
    """The shipped profile with its size sweep replaced: {size: seconds} per implementation."""
    sweep = {"conccl": {"all_gather": [list(x) for x in sorted(ce.items())]},
             "nccl": {"all_gather": [list(x) for x in sorted(sm.items())]}}
    return dataclasses.replace(load_profile(), comm_sweep=sweep, world=world)


def test_threshold_is_the_smallest_size_from_which_conccl_never_loses():
    sizes = [MiB, 4 * MiB, 16 * MiB, 64 * MiB]
    # conccl wins at 4 MiB, loses at 16 MiB, wins from 64 MiB on: the win at 4 MiB does not count
    p = _profile(dict(zip(sizes, [2.0, 1.0, 3.0, 1.0])), dict(zip(sizes, [1.0, 2.0, 2.0, 2.0])))
    assert eager.nccl_below(p, "all_gather") == 64 * MiB
    # within the tolerance goes to the copy engines, beyond it to NCCL
    within, beyond = eager.TOLERANCE * 0.999, eager.TOLERANCE * 1.001
    p = _profile(dict(zip(sizes, [2.0, 2.0, within, 2.0])), dict(zip(sizes, [1.0, 1.0, 1.0, 3.0])))
    assert eager.nccl_below(p, "all_gather") == 16 * MiB
    p = _profile(dict(zip(sizes, [2.0, 2.0, beyond, 2.0])), dict(zip(sizes, [1.0, 1.0, 1.0, 3.0])))
    assert eager.nccl_below(p, "all_gather") == 64 * MiB
    # conccl never slower: below the smallest measured size NCCL is still assumed faster
    p = _profile(dict(zip(sizes, [1.0] * 4)), dict(zip(sizes, [2.0] * 4)))
    assert eager.nccl_below(p, "all_gather") == MiB
    # conccl slower even at the largest size: every call to NCCL
    p = _profile(dict(zip(sizes, [3.0] * 4)), dict(zip(sizes, [2.0] * 4)))
    assert eager.nccl_below(p, "all_gather") == eager.ALWAYS
    # nothing measured for a collective (or one implementation): no entry, copy engines
    assert eager.nccl_below(p, "reduce_scatter") is None
    only_ce = dataclasses.replace(p, comm_sweep={"conccl": p.comm_sweep["conccl"]})
    assert eager.nccl_below(only_ce, "all_gather") is None


def test_the_eager_sweep_decides_where_the_profile_has_one():
    sizes = [MiB, 16 * MiB, 256 * MiB, 1024 * MiB]
    # persistent ops: conccl wins from 1 MiB; eagerly its host time loses it everything to 256 MiB
    p = _profile(dict(zip(sizes, [1.0] * 4)), dict(zip(sizes, [2.0] * 4)))
    assert eager.nccl_below(p, "all_gather") == MiB
    ce = [[MiB, 3.0], [16 * MiB, 3.0], [256 * MiB, 1.0]]
    sm = [[MiB, 1.0], [16 * MiB, 1.0], [256 * MiB, 2.0]]
    timed = dataclasses.replace(p, eager_sweep={"conccl": {"all_gather": ce}, "nccl": {"all_gather": sm}})
    assert eager.nccl_below(timed, "all_gather") == 256 * MiB
    # above its largest size the eager sweep's verdict there holds: a conccl loss at 256 MiB is
    # not undone by the size sweep's win at 1 GiB (which leaves the staging copy out)
    lost_top = dataclasses.replace(timed, eager_sweep={"conccl": {"all_gather": ce[:2] + [[256 * MiB, 3.0]]},
                                                       "nccl": {"all_gather": sm}})
    assert eager.nccl_below(lost_top, "all_gather") == eager.ALWAYS
    # the eager sweep of one implementation only: the size sweep decides, as without one
    half = dataclasses.replace(p, eager_sweep={"conccl": {"all_gather": ce}})
    assert not eager.has_eager_sweep(half, "all_gather") and eager.nccl_below(half, "all_gather") == MiB
    assert eager.eager_table(timed, ("all_gather",), p.world) == {"nccl_below": {"all_gather": 256 * MiB},
                                                                  "note": None}
    # a borrowed crossover of "every size" is said in words
    note = eager.eager_table(lost_top, ("all_gather", "all_reduce"), p.world)["note"]
    assert "all_reduce in neither of the profile's sweeps: the largest measured crossover (NCCL at every size)" in note


def test_the_shipped_h100_table_comes_from_its_eager_sweep():
    # the README's main job's eager sweep on 2 x H100, shipped
    p = load_profile(shipped_path("h100x2_profile.json"))
    t = eager.eager_table(p, ("all_gather", "all_to_all", "reduce_scatter", "all_reduce"), p.world)
    assert t["note"] is None
    assert t["nccl_below"] == {"all_gather": 256 * MiB, "all_to_all": eager.ALWAYS, "reduce_scatter": 64 * MiB,
                               "all_reduce": eager.ALWAYS}
    assert p.source["eager_sweep"]["machine_kind"] == "nvidia-h100-x2"


def test_the_shipped_profile_table_and_its_world_note():
    p = load_profile()
    t = eager.eager_table(p, ("all_gather", "all_to_all", "reduce_scatter", "all_reduce"), p.world)
    # the sweep has no reducing collective: they borrow the largest measured crossover, and say so
    assert "reduce_scatter, all_reduce in neither of the profile's sweeps" in t["note"]
    measured = {c: t["nccl_below"][c] for c in ("all_gather", "all_to_all")}
    assert t["nccl_below"]["reduce_scatter"] == t["nccl_below"]["all_reduce"] == max(measured.values())
    for name, limit in measured.items():
        ce = dict(map(tuple, p.comm_sweep["conccl"][name]))
        sm = dict(map(tuple, p.comm_sweep["nccl"][name]))
        tol = eager.TOLERANCE
        assert all(ce[s] <= tol * sm[s] for s in ce if s >= limit), name  # conccl within tolerance above
        below = [s for s in ce if s < limit]
        assert not below or ce[max(below)] > tol * sm[max(below)], name  # and lost just below
    # the H200 profile has no eager sweep: its table comes from persistent ops, and says so
    assert "from the size sweep of persistent ops" in eager.eager_table(p, ("all_gather", "all_to_all"), p.world)["note"]
    with_eager = dataclasses.replace(p, eager_sweep={impl: {c: p.comm_sweep[impl][c] for c in ("all_gather", "all_to_all")}
                                                     for impl in ("conccl", "nccl")})
    assert eager.eager_table(with_eager, ("all_gather", "all_to_all"), p.world)["note"] is None
    other = eager.eager_table(p, ("all_gather",), p.world + 1)
    assert "measured on 4 GPUs" in other["note"] and other["nccl_below"] == {"all_gather": t["nccl_below"]["all_gather"]}
    empty = dataclasses.replace(p, comm_sweep={})
    assert eager.eager_table(empty, ("all_gather", "all_reduce"), p.world)["nccl_below"] == {}


def test_runtime_table_modes_and_profile_checks():
    assert eager_paths("copy_engines", 2) == {"mode": "copy_engines", "nccl_below": {}, "note": None, "profile": None}
    auto = eager_paths("auto", 4)
    assert auto["mode"] == "auto" and auto["nccl_below"] and auto["profile"]["device"] == "NVIDIA H200"
    with pytest.raises(InvalidArgument, match="eager path must be one of"):
        eager_paths("fastest", 2)
    h100 = eager_paths("auto", 2, device_name="NVIDIA H100 80GB HBM3")  # the shipped H100 profile, no study
    assert (h100["profile"]["device"], h100["profile"]["chosen"]) == ("NVIDIA H100 80GB HBM3", "shipped")
    assert h100["profile"]["eager_sweep"]["machine_kind"] == "nvidia-h100-x2"  # where its table was measured
    assert "eager_sweep" not in auto["profile"]  # the H200's has none
    with pytest.raises(ProfileError, match="measured on 'NVIDIA H200'"):  # a path of another GPU: refused
        eager_paths("auto", 2, profile=str(EMBEDDED), device_name="NVIDIA H100 80GB HBM3")


@pytest.mark.parametrize("bad, match", [
    ([("all_gather", 1)], "must be a dict"),
    ({"allgather": 1}, "unknown collective 'allgather'"),
    ({"all_gather": -1}, "whole number of bytes >= 0"),
    ({"all_gather": 1.5}, "whole number of bytes >= 0"),
    ({"all_gather": True}, "whole number of bytes >= 0"),
])
def test_nccl_below_is_checked(bad, match):
    with pytest.raises(InvalidArgument, match=match):
        check_nccl_below(bad)
    assert check_nccl_below({"all_reduce": 0, "all_gather": 4096}) == {"all_reduce": 0, "all_gather": 4096}
