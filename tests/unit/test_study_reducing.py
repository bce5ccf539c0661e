"""CPU tier: reduce-scatter and all-reduce in the study and the planner. They are not in the
default suite (``studied = False``: the shipped profile has no measurements of them) but run
where a suite or ``--collective`` names them; a prediction or plan needs a profile that
measured them, and says so otherwise. The measured case's value checks run here on CPU."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from conccl.cli import main
from conccl.collectives import REGISTRY, STUDIED
from conccl.planner import PlanError, plan
from conccl.planner.profile import load_profile
from conccl.study.patterns import fill_values, matches_sum
from conccl.study.results import load_results
from conccl.study.scenarios import parse_suite, scenario_from_args

REDUCING = ("reduce_scatter", "all_reduce")


def _profile_measuring_reducing(path):
    """The shipped profile with all-gather's measurements copied to the reducing collectives
    (a stand-in for a measured study that ran them)."""
    p = load_profile()

    def add(table):
        return {**table, **{c: table["all_gather"] for c in REDUCING}}

    p = dataclasses.replace(
        p, collectives={impl: add(t) if "all_gather" in t else t for impl, t in p.collectives.items()},
        comm_sweep={impl: add(t) if "all_gather" in t else t for impl, t in p.comm_sweep.items()},
        coll_cta_loss=add(p.coll_cta_loss),
        overlap={s: add(t) if "all_gather" in t else t for s, t in p.overlap.items()})
    path.write_text(p.to_json())
    return p


def test_reducing_collectives_run_where_named_but_not_by_default():
    assert not set(REDUCING) & set(STUDIED)
    assert {s.collective for s in scenario_from_args("64x64x64", "all", "1M")} == set(STUDIED)
    assert [s.collective for s in scenario_from_args("64x64x64", "reduce_scatter", "1M")] == ["reduce_scatter"]
    suite = parse_suite({"format": "conccl-suite/1", "scenarios": [{"gemm": "64x64x64", "size": "1M", "collectives": list(REGISTRY)}]}, "t")
    assert [s.collective for s in suite] == list(REGISTRY)


def test_prediction_and_plan_need_a_profile_that_measured_them(tmp_path, capsys):
    assert main(["study", "--predict", "--gemm", "4096x4096x4096", "--collective", "reduce_scatter", "--size", "256M",
                 "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "no measurements of reduce_scatter" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(PlanError, match="no nccl all_reduce measurements"):
        plan(load_profile(), (4096, 4096, 4096), "all_reduce", 256 << 20)
    # with a profile that has them, both go through, and the report names the collective
    prof = _profile_measuring_reducing(tmp_path / "profile.json")
    for c in REDUCING:
        out = tmp_path / c
        assert main(["study", "--predict", "--profile", str(tmp_path / "profile.json"), "--gemm", "4096x4096x4096",
                     "--collective", c, "--size", "256M", "--out", str(out)]) == 0
        res = load_results(out)
        assert [s.collective for s in res.scenarios] == [c] and "conccl" in res.scenarios[0].runs
        assert c in (out / "report.md").read_text()
        assert plan(prof, (4096, 4096, 4096), c, 256 << 20).strategy in {"conccl", "conccl_rp", "c3_sp", "c3_sp_hp",
                                                                          "c3_base", "c3_sp_rp", "c3_rp"}
    assert json.loads((tmp_path / "profile.json").read_text())["comm_sweep"]["conccl"]["reduce_scatter"]


@pytest.mark.parametrize("name", REDUCING)
@pytest.mark.parametrize("world", [2, 3, 8])
def test_the_measured_check_of_a_reduction(name, world):
    """The study's check of a reducing collective's output (matches_sum over the layout's
    sources) against the registry's stated arithmetic on the same values, and a wrong output."""
    coll = REGISTRY[name]
    n = 4 * 1000 + 7  # elements per input chunk, odd on purpose
    rank = world - 1
    inputs = []
    for r in range(world):
        t = torch.empty(coll.layout(world, r).input_chunks * n, dtype=torch.bfloat16)
        chunks = t.view(torch.int16).view(-1, n)
        for k in range(chunks.shape[0]):
            fill_values(chunks[k], r, k)
        inputs.append(t)
    lay = coll.layout(world, rank)
    out = coll.reference(inputs, rank).contiguous().view(torch.int16).view(lay.output_chunks, -1)
    assert all(matches_sum(out[c], srcs) for c, srcs in enumerate(lay.sources))
    assert out.view(torch.bfloat16).float().abs().max() > 0  # not trivially zero
    wrong = out.clone()
    wrong[-1, -1] += 1
    assert not matches_sum(wrong[-1], lay.sources[-1])
