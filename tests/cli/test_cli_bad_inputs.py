"""Every bad input a user can give the ``conccl`` command: exit code 2, one line on stderr that
names the argument (and what is accepted), no traceback, nothing half-written left behind.

One table: (id, argv, what the line must name). Inputs are made in a temporary folder: ``{d}``
in an argument is that folder. Most rows run ``conccl.cli.main`` in this process (fast); a few
run ``python -m conccl`` in a subprocess, to see exactly what a user sees.
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from conccl.cli import main  # noqa: E402
from conccl.planner.profile import EMBEDDED  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
V1 = FIXTURES / "study-v1"


def _profile(**change) -> dict:
    d = json.loads(EMBEDDED.read_text())
    d.update(change)
    return d


def _suite(**change) -> dict:
    d = {"format": "conccl-suite/1", "gemms": {"g": {"mnk": "1024x1024x1024"}},
         "scenarios": [{"gemm": "g", "size": "64M", "collectives": ["all_gather"]}]}
    for k, v in change.items():
        if k.startswith("s_"):
            d["scenarios"][0][k[2:]] = v
        else:
            d[k] = v
    return d


def _results(drop=(), **change) -> dict:
    d = json.loads((V1 / "results.json").read_text())
    for k in drop:
        d.pop(k)
    d.update(change)
    return d


def _set(path, value, **kw) -> dict:
    d = _results(**kw)
    t = d
    for k in path[:-1]:
        t = t[k]
    t[path[-1]] = value
    return d


def _profile_at(path, value) -> dict:
    d = _profile()
    t = d
    for k in path[:-1]:
        t = t[k]
    t[path[-1]] = value
    return d


def _bad_time() -> dict:
    d = _results()
    d["scenarios"][0]["t_gemm"]["median"] = "fast"
    return d


def _zero_time() -> dict:
    d = _results()
    d["scenarios"][0]["t_gemm"]["median"] = 0
    return d


# Files the rows refer to, made fresh in each test's folder: name -> bytes or JSON.
FILES = {
    "not_utf8.json": b"\xff\xfe\x00{",
    "not_json.json": b"{\"format\": ",
    "empty.json": b"",
    "list.json": [1, 2],
    "profile_zero.json": _profile(bf16_flops=0),
    "profile_string.json": _profile(hbm_bytes_per_s="fast"),
    "profile_negative.json": _profile(nvlink_bytes_per_s=-1.0),
    "profile_world1.json": _profile(world=1),
    "profile_bool.json": _profile(sm_count=True),
    "profile_table.json": _profile(gemm_efficiency={"compute-bound": 0}),
    "profile_keys.json": _profile(gemm_sm_loss={"compute-bound": {"many": 1.2}}),
    "profile_unknown.json": _profile(colour="green"),
    "profile_missing.json": {k: v for k, v in _profile().items() if k != "bf16_flops"},
    "profile_v0.json": _profile(format="conccl-profile/0"),
    "suite_unknown_top.json": _suite(scenarioz=[]),
    "suite_unknown_field.json": _suite(s_colectives=["all_gather"]),
    "suite_unknown_gemm_field.json": _suite(gemms={"g": {"mnk": "8x8x8", "shape": 1}}),
    "suite_quick_string.json": _suite(s_quick="yes"),
    "suite_size_list.json": _suite(s_size=[1]),
    "suite_size_zero.json": _suite(s_size=0),
    "suite_size_negative.json": _suite(s_size="-1G"),
    "suite_collectives_int.json": _suite(s_collectives=5),
    "suite_collectives_empty.json": _suite(s_collectives=[]),
    "suite_gemm_zero.json": _suite(gemms={"g": {"mnk": "0x8x8"}}),
    "suite_gemm_huge.json": _suite(gemms={"g": {"mnk": "9999999x9999999x9999999"}}),
    "suite_dtype.json": _suite(dtype=["bf16"]),
    "suite_format.json": _suite(format="conccl-suite/9"),
    "suite_no_scenarios.json": _suite(scenarios=[]),
    "res/missing_keys/results.json": _results(drop=("meta",)),
    "res/bad_type/results.json": _bad_time(),
    "res/zero_time/results.json": _zero_time(),
    "res/schema/results.json": _results(schema="conccl-study-results/9"),
    "res/not_utf8/results.json": b"\xff\xfe",
    "res/not_json/results.json": b"[",
    "res/unknown/results.json": _results(extra=1),
    "res/empty/.keep": b"",
    "res/null_required/results.json": _set(("scenarios", 0, "gemm", "tag"), None),
    "res/absurd_time/results.json": _set(("scenarios", 0, "t_gemm", "median"), 1e300),
    "res/zero_fit/results.json": _set(("peaks", "collective_fits"), {"nccl": {"all_gather": {"latency_s": 0,
                                                                                           "bytes_per_s": 0}}}),
    "res/ncu_string/results.json": _set(("ncu", "mb1"), {"dram_bytes": "many"}),
    "res/world_zero/results.json": _set(("machine", "world"), 0),
    "res/nan_spread/results.json": _set(("scenarios", 0, "t_gemm", "min"), float("nan")),
    "res/negative_peak/results.json": _set(("peaks", "hbm_bytes_per_s"), -1.0),
    "profile_empty_list.json": _profile_at(("gemm_efficiency", "compute-bound"), []),
    "profile_tiny.json": _profile_at(("gemm_efficiency", "memory-bound"), 1e-300),
    "profile_sweep.json": _profile_at(("comm_sweep", "nccl", "all_gather", 0), [1]),
    "profile_fit_missing.json": _profile_at(("collectives", "nccl", "all_gather"), {"latency_s": 1e-5}),
    "profile_huge_rate.json": _profile_at(("bf16_flops",), 1e300),
    "a_file": b"x",
}

PLAN = ["plan", "--gemm", "8192x8192x8192", "--size", "1G"]
STUDY = ["study", "--predict", "--quick", "--out", "{d}/out"]

CASES = [
    # -- study: output folder
    ("study --out under a file", ["study", "--predict", "--quick", "--out", "{d}/a_file/out"], "--out"),
    ("study --out unwritable", ["study", "--predict", "--quick", "--out", "/proc/conccl-test/out"], "--out"),
    ("study --out is a file", ["study", "--predict", "--quick", "--out", "{d}/a_file"], "--out"),
    ("study --resume with --force", STUDY + ["--resume", "--force"], "--resume"),
    ("study --resume, nothing there", STUDY + ["--resume"], "--resume"),
    ("study --out holds a corrupt results.json", ["study", "--predict", "--quick", "--out", "{d}/res/not_json"],
     "--force"),
    ("study --resume a corrupt results.json", ["study", "--predict", "--quick", "--resume", "--out",
                                               "{d}/res/not_json"], "--resume"),
    # -- study: counts and selections
    ("study --gpus 1 --predict", STUDY + ["--gpus", "1"], "--gpus"),
    ("study --gpus 0", STUDY + ["--gpus", "0"], "--gpus"),
    ("study --gpus -2", STUDY + ["--gpus", "-2"], "--gpus"),
    ("study --gpus 1000", STUDY + ["--gpus", "1000"], "--gpus"),
    ("study --gpus abc", STUDY + ["--gpus", "abc"], "--gpus"),
    ("study --gpus 2.5", STUDY + ["--gpus", "2.5"], "--gpus"),
    ("study --only ''", STUDY + ["--only", ""], "--only"),
    ("study --side-by-side in a prediction", STUDY + ["--side-by-side"], "--side-by-side"),
    ("study --only ' , '", STUDY + ["--only", " , "], "--only"),
    ("study --only unknown", STUDY + ["--only", "nope"], "--only"),
    ("study --gemm without --size", ["study", "--predict", "--gemm", "8x8x8", "--out", "{d}/out"], "--size"),
    ("study --gemm 0x8x8", ["study", "--predict", "--gemm", "0x8x8", "--size", "1M", "--out", "{d}/out"], "--gemm"),
    ("study --gemm=-8x8x8", ["study", "--predict", "--gemm=-8x8x8", "--size", "1M", "--out", "{d}/out"], "--gemm"),
    ("study --gemm text", ["study", "--predict", "--gemm", "big", "--size", "1M", "--out", "{d}/out"], "--gemm"),
    ("study --gemm absurd", ["study", "--predict", "--gemm", "999999x999999x999999", "--size", "1M",
                             "--out", "{d}/out"], "GiB"),
    ("study --size 0", ["study", "--predict", "--gemm", "8x8x8", "--size", "0", "--out", "{d}/out"], "--size"),
    ("study --size -1M", ["study", "--predict", "--gemm", "8x8x8", "--size", "-1M", "--out", "{d}/out"], "--size"),
    ("study --size text", ["study", "--predict", "--gemm", "8x8x8", "--size", "lots", "--out", "{d}/out"], "--size"),
    ("study --size absurd", ["study", "--predict", "--gemm", "8x8x8", "--size", "900T", "--out", "{d}/out"], "GiB"),
    ("study --collective unknown", ["study", "--predict", "--gemm", "8x8x8", "--size", "1M", "--collective",
                                    "broadcast", "--out", "{d}/out"], "--collective"),
    ("study --collective without --gemm", STUDY + ["--collective", "all_gather"], "--collective"),
    # -- study: input files
    ("study --suite missing", STUDY + ["--suite", "{d}/nope.json"], "--suite"),
    ("study --suite a folder", STUDY + ["--suite", "{d}/res"], "--suite"),
    ("study --suite not UTF-8", STUDY + ["--suite", "{d}/not_utf8.json"], "--suite"),
    ("study --suite not JSON", STUDY + ["--suite", "{d}/not_json.json"], "--suite"),
    ("study --suite empty", STUDY + ["--suite", "{d}/empty.json"], "--suite"),
    ("study --suite a list", STUDY + ["--suite", "{d}/list.json"], "--suite"),
    ("study --suite other format", STUDY + ["--suite", "{d}/suite_format.json"], "--suite"),
    ("study --suite unknown key", STUDY + ["--suite", "{d}/suite_unknown_top.json"], "scenarioz"),
    ("study --suite unknown scenario key", STUDY + ["--suite", "{d}/suite_unknown_field.json"], "colectives"),
    ("study --suite unknown GEMM key", STUDY + ["--suite", "{d}/suite_unknown_gemm_field.json"], "shape"),
    ("study --suite quick not bool", STUDY + ["--suite", "{d}/suite_quick_string.json"], "quick"),
    ("study --suite size a list", STUDY + ["--suite", "{d}/suite_size_list.json"], "size"),
    ("study --suite size 0", STUDY + ["--suite", "{d}/suite_size_zero.json"], "size"),
    ("study --suite size negative", STUDY + ["--suite", "{d}/suite_size_negative.json"], "size"),
    ("study --suite collectives a number", STUDY + ["--suite", "{d}/suite_collectives_int.json"], "collectives"),
    ("study --suite collectives empty", STUDY + ["--suite", "{d}/suite_collectives_empty.json"], "collectives"),
    ("study --suite GEMM 0", STUDY + ["--suite", "{d}/suite_gemm_zero.json"], "GEMM"),
    ("study --suite GEMM absurd", STUDY + ["--suite", "{d}/suite_gemm_huge.json"], "GiB"),
    ("study --suite dtype a list", STUDY + ["--suite", "{d}/suite_dtype.json"], "dtype"),
    ("study --suite no scenarios", STUDY + ["--suite", "{d}/suite_no_scenarios.json"], "scenarios"),
    ("study --profile missing", STUDY + ["--profile", "{d}/nope.json"], "--profile"),
    ("study --profile not UTF-8", STUDY + ["--profile", "{d}/not_utf8.json"], "--profile"),
    ("study --profile field 0", STUDY + ["--profile", "{d}/profile_zero.json"], "bf16_flops"),
    ("study --profile field a string", STUDY + ["--profile", "{d}/profile_string.json"], "hbm_bytes_per_s"),
    ("study --report missing", ["study", "--report", "{d}/nope"], "--report"),
    ("study --report with run options", ["study", "--report", str(V1), "--quick", "--gpus", "2"], "--quick, --gpus"),
    ("study --report no results.json", ["study", "--report", "{d}/res/empty"], "--report"),
    ("study --report missing keys", ["study", "--report", "{d}/res/missing_keys"], "meta"),
    ("study --report wrong type", ["study", "--report", "{d}/res/bad_type"], "t_gemm"),
    ("study --report time 0", ["study", "--report", "{d}/res/zero_time"], "t_gemm"),
    ("study --report other schema", ["study", "--report", "{d}/res/schema"], "schema"),
    ("study --report not UTF-8", ["study", "--report", "{d}/res/not_utf8"], "UTF-8"),
    ("study --report not JSON", ["study", "--report", "{d}/res/not_json"], "JSON"),
    ("study --report unknown field", ["study", "--report", "{d}/res/unknown"], "extra"),
    ("study --report null field", ["study", "--report", "{d}/res/null_required"], "gemm.tag"),
    ("study --report absurd time", ["study", "--report", "{d}/res/absurd_time"], "t_gemm"),
    ("study --report fit of 0", ["study", "--report", "{d}/res/zero_fit"], "bytes_per_s"),
    ("study --report ncu string", ["study", "--report", "{d}/res/ncu_string"], "ncu.mb1"),
    ("plan --evaluate world 0", ["plan", "--evaluate", "{d}/res/world_zero"], "machine.world"),
    ("study --report NaN spread", ["study", "--report", "{d}/res/nan_spread"], "t_gemm.min"),
    ("plan --evaluate negative peak", ["plan", "--evaluate", "{d}/res/negative_peak"], "peaks.hbm_bytes_per_s"),
    # -- plan
    ("plan --world 1000", PLAN + ["--world", "1000"], "--world"),
    ("plan --world 1", PLAN + ["--world", "1"], "--world"),
    ("plan --world 0", PLAN + ["--world", "0"], "--world"),
    ("plan --world -4", PLAN + ["--world", "-4"], "--world"),
    ("plan --world four", PLAN + ["--world", "four"], "--world"),
    ("plan --size 0", ["plan", "--gemm", "8x8x8", "--size", "0"], "--size"),
    ("plan --size text", ["plan", "--gemm", "8x8x8", "--size", "big"], "--size"),
    ("plan --size absurd", ["plan", "--gemm", "8x8x8", "--size", "1T"], "--size"),
    ("plan --gemm 8x8", ["plan", "--gemm", "8x8", "--size", "1M"], "--gemm"),
    ("plan --gemm 0", ["plan", "--gemm", "8x0x8", "--size", "1M"], "--gemm"),
    ("plan --gemm absurd", ["plan", "--gemm", "99999999x99999999x8", "--size", "1M"], "--gemm"),
    ("plan --strategy unknown", PLAN + ["--strategy", "fast"], "--strategy"),
    ("plan --collective unknown", PLAN + ["--collective", "broadcast"], "--collective"),
    ("plan --dtype unknown", PLAN + ["--dtype", "fp8"], "--dtype"),
    ("plan --json unwritable", PLAN + ["--json", "/proc/conccl-test/plan.json"], "--json"),
    ("plan --json under a file", PLAN + ["--json", "{d}/a_file/plan.json"], "--json"),
    ("plan --json a folder", PLAN + ["--json", "{d}"], "--json"),
    ("plan --json missing folder", PLAN + ["--json", "{d}/no/such/plan.json"], "--json"),
    ("plan --markdown without --evaluate", PLAN + ["--markdown", "{d}/e.md"], "--markdown"),
    ("plan --profile field 0", PLAN + ["--profile", "{d}/profile_zero.json"], "bf16_flops"),
    ("plan --profile field a string", PLAN + ["--profile", "{d}/profile_string.json"], "hbm_bytes_per_s"),
    ("plan --profile negative", PLAN + ["--profile", "{d}/profile_negative.json"], "nvlink_bytes_per_s"),
    ("plan --profile world 1", PLAN + ["--profile", "{d}/profile_world1.json"], "world"),
    ("plan --profile bool count", PLAN + ["--profile", "{d}/profile_bool.json"], "sm_count"),
    ("plan --profile table 0", PLAN + ["--profile", "{d}/profile_table.json"], "gemm_efficiency"),
    ("plan --profile table keys", PLAN + ["--profile", "{d}/profile_keys.json"], "gemm_sm_loss"),
    ("plan --profile empty list", PLAN + ["--profile", "{d}/profile_empty_list.json"], "gemm_efficiency"),
    ("plan --profile 1e-300", PLAN + ["--profile", "{d}/profile_tiny.json"], "gemm_efficiency"),
    ("plan --profile sweep point", PLAN + ["--profile", "{d}/profile_sweep.json"], "comm_sweep"),
    ("plan --profile fit missing", PLAN + ["--profile", "{d}/profile_fit_missing.json"], "bus_bytes_per_s"),
    ("plan --profile absurd rate", PLAN + ["--profile", "{d}/profile_huge_rate.json"], "bf16_flops"),
    ("plan --profile unknown field", PLAN + ["--profile", "{d}/profile_unknown.json"], "colour"),
    ("plan --profile missing field", PLAN + ["--profile", "{d}/profile_missing.json"], "bf16_flops"),
    ("plan --profile old format", PLAN + ["--profile", "{d}/profile_v0.json"], "conccl-profile/1"),
    ("plan --profile not UTF-8", PLAN + ["--profile", "{d}/not_utf8.json"], "--profile"),
    ("plan --profile not JSON", PLAN + ["--profile", "{d}/not_json.json"], "--profile"),
    ("plan --profile a list", PLAN + ["--profile", "{d}/list.json"], "--profile"),
    ("plan --profile missing file", PLAN + ["--profile", "{d}/nope.json"], "--profile"),
    # -- plan --nodes (the multi-node prediction)
    ("plan --nodes 0", ["plan", "--nodes", "0", "--size", "1G"], "--nodes"),
    ("plan --nodes text", ["plan", "--nodes", "many", "--size", "1G"], "--nodes"),
    ("plan --nodes absurd", ["plan", "--nodes", "10000000", "--size", "1G"], "--nodes"),
    ("plan --nodes one rank", ["plan", "--nodes", "1", "--gpus-per-node", "1", "--size", "1G"], "--nodes"),
    ("plan --nodes without --size", ["plan", "--nodes", "2"], "--size"),
    ("plan --nodes --size too small", ["plan", "--nodes", "2", "--size", "8"], "--size"),
    ("plan --nodes --size absurd", ["plan", "--nodes", "64", "--collective", "reduce_scatter", "--size", "1G"],
     "--size"),
    ("plan --nodes all_to_all", ["plan", "--nodes", "2", "--size", "1G", "--collective", "all_to_all"],
     "--collective"),
    ("plan --nodes with --gemm", ["plan", "--nodes", "2", "--size", "1G", "--gemm", "8x8x8"], "--gemm"),
    ("plan --nodes with --world", ["plan", "--nodes", "2", "--size", "1G", "--world", "4"], "--world"),
    ("plan --nodes with --strategy", ["plan", "--nodes", "2", "--size", "1G", "--strategy", "c3_sp"], "--strategy"),
    ("plan --nodes --json unwritable", ["plan", "--nodes", "2", "--size", "1G", "--json", "/proc/conccl-test/m.json"],
     "--json"),
    ("plan --gpus-per-node 9", ["plan", "--nodes", "2", "--gpus-per-node", "9", "--size", "1G"], "--gpus-per-node"),
    ("plan --gpus-per-node 0", ["plan", "--nodes", "2", "--gpus-per-node", "0", "--size", "1G"], "--gpus-per-node"),
    ("plan --gpus-per-node without --nodes", ["plan", "--gpus-per-node", "4", "--size", "1G"], "--nodes"),
    ("plan --network-gbps 0", ["plan", "--nodes", "2", "--network-gbps", "0", "--size", "1G"], "--network-gbps"),
    ("plan --network-gbps nan", ["plan", "--nodes", "2", "--network-gbps", "nan", "--size", "1G"], "--network-gbps"),
    ("plan --network-gbps inf", ["plan", "--nodes", "2", "--network-gbps", "inf", "--size", "1G"], "--network-gbps"),
    ("plan --network-gbps text", ["plan", "--nodes", "2", "--network-gbps", "fast", "--size", "1G"], "--network-gbps"),
    ("plan --network-gbps without --nodes", ["plan", "--network-gbps", "400", "--size", "1G"], "--nodes"),
    ("plan --nvlink-gbps -1", ["plan", "--nodes", "2", "--nvlink-gbps", "-1", "--size", "1G"], "--nvlink-gbps"),
    ("plan --nvlink-gbps text", ["plan", "--nodes", "2", "--nvlink-gbps", "x", "--size", "1G"], "--nvlink-gbps"),
    ("plan --nccl-ctas 0", ["plan", "--nodes", "2", "--nccl-ctas", "0", "--size", "1G"], "--nccl-ctas"),
    ("plan --nccl-ctas 2.5", ["plan", "--nodes", "2", "--nccl-ctas", "2.5", "--size", "1G"], "--nccl-ctas"),
    ("plan --evaluate missing", ["plan", "--evaluate", "{d}/nope"], "--evaluate"),
    ("plan --evaluate with --gemm", ["plan", "--evaluate", str(V1), "--gemm", "8x8x8"], "--gemm"),
    ("plan --evaluate missing keys", ["plan", "--evaluate", "{d}/res/missing_keys"], "meta"),
    ("plan --evaluate wrong type", ["plan", "--evaluate", "{d}/res/bad_type"], "t_gemm"),
    ("plan --evaluate not JSON", ["plan", "--evaluate", "{d}/res/not_json"], "--evaluate"),
    ("plan --evaluate --json unwritable", ["plan", "--evaluate", str(V1), "--json", "/proc/conccl-test/e.json"],
     "--json"),
    # -- bench (flags are checked before it looks for GPUs)
    ("bench -b 0", ["bench", "-b", "0"], "-b"),
    ("bench -b text", ["bench", "-b", "lots"], "-b"),
    ("bench -e below -b", ["bench", "-b", "4G", "-e", "1M"], "-e"),
    ("bench -f 1", ["bench", "-f", "1"], "-f"),
    ("bench -f nan", ["bench", "-f", "nan"], "-f"),
    ("bench -f text", ["bench", "-f", "x"], "-f"),
    ("bench -n 0", ["bench", "-n", "0"], "-n"),
    ("bench -n absurd", ["bench", "-n", "1000000000"], "-n"),
    ("bench -w -1", ["bench", "-w", "-1"], "-w"),
    ("bench -c 2", ["bench", "-c", "2"], "-c"),
    ("bench -d fp8", ["bench", "-d", "fp8"], "-d"),
    ("bench --collective unknown", ["bench", "--collective", "all_to_none"], "--collective"),
    ("bench --gpus 1000", ["bench", "--gpus", "1000"], "--gpus"),
    ("bench --gpus 1", ["bench", "--gpus", "1"], "--gpus"),
    ("bench --impl ''", ["bench", "--impl", ","], "--impl"),
    ("bench --impl unknown", ["bench", "--impl", "nope"], "--impl"),
    ("bench --impl gone", ["bench", "--impl", "conccl_symm_push"], "--impl"),
    ("bench --tensors unknown", ["bench", "--tensors", "pinned"], "--tensors"),
    ("bench --algorithm unknown", ["bench", "--algorithm", "ring"], "--algorithm"),
    ("bench --stream-mode unknown", ["bench", "--stream-mode", "two"], "--stream-mode"),
    ("bench --json unwritable", ["bench", "--json", "/proc/conccl-test/b.json"], "--json"),
    ("bench --markdown under a file", ["bench", "--markdown", "{d}/a_file/b.md"], "--markdown"),
    ("bench fsdp --layers 0", ["bench", "fsdp", "--out", "{d}/f", "--layers", "0"], "--layers"),
    ("bench fsdp --tokens text", ["bench", "fsdp", "--out", "{d}/f", "--tokens", "many"], "--tokens"),
    # -- the command itself
    ("no command", [], "command"),
    ("unknown command", ["sweep"], "sweep"),
    ("unknown flag", ["study", "--fast"], "--fast"),
]


def _make_files(d: pathlib.Path) -> None:
    for name, content in FILES.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())


def _run(argv, capsys) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own checks exit from parse_args
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


# Known gaps, in files this change does not own.
XFAIL: dict[str, str] = {}  # case id -> why it is expected to fail (none now)


@pytest.mark.parametrize("argv,names", [
    pytest.param(*c[1:], id=c[0], marks=[pytest.mark.xfail(strict=True, reason=XFAIL[c[0]])] if c[0] in XFAIL else [])
    for c in CASES])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, argv, names):
    monkeypatch.delenv("CONCCL_DEBUG", raising=False)
    _make_files(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    rc, out, err = _run([a.replace("{d}", str(tmp_path)) for a in argv], capsys)
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("conccl"), err
    assert names in lines[0], err
    assert "Traceback" not in err and out == ""
    # Nothing written: not a report folder, not a half file.
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_every_study_and_plan_flag_with_a_value_has_a_bad_input_case():
    """A new flag that takes a value must come with a row above."""
    from conccl.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    covered = {a.split("=")[0] for c in CASES for a in c[1] if a.startswith("-")}
    for name in ("study", "plan", "bench"):
        missing = {a.option_strings[-1] for a in sub[name]._actions if a.option_strings and a.nargs != 0
                   and not covered & set(a.option_strings)} - {"--machine-kind"}  # a free-form label
        assert not missing, (name, sorted(missing))


def test_a_folder_holding_a_report_is_refused_and_left_as_it_was(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["study", "--predict", "--quick", "--out", str(out)]) == 0
    capsys.readouterr()
    stamp = (out / "results.json").read_bytes()
    rc, _, err = _run(["study", "--predict", "--quick", "--out", str(out)], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--force" in err
    assert (out / "results.json").read_bytes() == stamp


@pytest.mark.parametrize("argv,names", [
    (["plan", "--gemm", "8x8x8", "--size", "1M", "--world", "1000"], "--world"),
    (["study", "--predict", "--gpus", "1", "--out", "{d}/out"], "--gpus"),
    (["study", "--predict", "--suite", "{d}/not_utf8.json", "--out", "{d}/out"], "--suite"),
    (["plan", "--gemm", "8x8x8", "--size", "1M", "--profile", "{d}/profile_string.json"], "hbm_bytes_per_s"),
    (["plan", "--gemm", "8x8x8", "--size", "1M", "--json", "/proc/conccl-test/x.json"], "--json"),
])
def test_what_a_user_sees_from_python_m_conccl(tmp_path, argv, names):
    _make_files(tmp_path)
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-m", "conccl", *[a.replace("{d}", str(tmp_path)) for a in argv]],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and names in p.stderr and p.stdout == "", p.stderr


def test_debug_asks_for_the_traceback(tmp_path):
    _make_files(tmp_path)
    argv = ["plan", "--gemm", "8x8x8", "--size", "1M", "--profile", str(tmp_path / "profile_zero.json")]
    for extra, env in (([], {"CONCCL_DEBUG": "1"}), (["--debug"], {})):
        p = subprocess.run([sys.executable, "-m", "conccl", *argv, *extra], capture_output=True, text=True,
                           env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", **env}, timeout=120)
        assert p.returncode != 0 and "Traceback" in p.stderr and "ProfileError: " in p.stderr, p.stderr


def _leaf_paths(d, path=()):
    """One path per kind of leaf (list items: the first two)."""
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _leaf_paths(v, path + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d[:2]):
            yield from _leaf_paths(v, path + (i,))
    else:
        yield path


# A number a user reads as a time (seconds, milliseconds, a Timing's median/min/max), an
# efficiency, a speedup or an ideal speedup: by its own name, or in a table of them per strategy.
_TIMED = re.compile(r"(_s|_ms)$|^t_|^(median|min|max|ideal|ideal_mean|slowdown)$|speedup|efficiency")
# 0 is a valid one of these: a fixed cost added to a time; no minimum (study.measure.timed_iterations)
_MAY_BE_0 = ("latency_s", "delay_s", "min_timed_ms")


def _numbers(x, path=()):
    """(path, number) of every number in a plan, results records or an evaluation: dataclasses,
    dicts and lists walked."""
    if dataclasses.is_dataclass(x):
        x = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _numbers(v, path + (k,))
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _numbers(v, path + (i,))
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield path, x


def _assert_sane(what, x) -> None:
    """Every time, efficiency and speedup in ``x`` finite and above 0 (those of _MAY_BE_0: not below)."""
    from conccl.strategy import STRATEGIES

    checked = 0
    for path, v in _numbers(x):
        key, table = path[-1], path[-2] if len(path) > 1 else None
        per_strategy = key in STRATEGIES or key in ("c3_best", "best")
        if not isinstance(key, str) or not (_TIMED.search(key) or per_strategy and _TIMED.search(str(table))):
            continue
        checked += 1
        assert math.isfinite(v) and (v >= 0 if key in _MAY_BE_0 else v > 0), (what, path, v)
    assert checked, what  # the walk found the numbers it is there to check


def _assert_names(err: Exception, path, value) -> None:
    """A refusal names the field and the value it refused."""
    msg = str(err)
    assert [k for k in path if isinstance(k, str)][-1] in msg, (path, msg)
    assert any(s in msg for s in (repr(value), json.dumps(value), str(value))), (path, value, msg)


@pytest.mark.parametrize("value", [0, -1, -1e300, "x", None, [], 1e300, 1e-300, math.nan, math.inf])
def test_every_profile_field_broken_is_refused_or_used(value):
    """Each number of the embedded profile set to a bad value: refused with ProfileError where
    read (naming the field and the value), or, where the value is still valid there, planned and
    predicted with every time, efficiency and speedup finite and positive."""
    from conccl.planner import plan
    from conccl.planner.profile import HardwareProfile, ProfileError
    from conccl.study import analysis, model, report
    from conccl.study.scenarios import load_suite, select

    scenarios = select(load_suite(), only="dec1_2M/all_gather,cb1_896M/all_to_all")
    used = 0
    for path in _leaf_paths(_profile()):
        try:  # through JSON, as from a file (NaN and Infinity included)
            prof = HardwareProfile.from_dict(json.loads(json.dumps(_profile_at(path, value))))
        except ProfileError as e:
            _assert_names(e, path, value)
            continue
        used += 1
        _assert_sane(path, plan(prof, (8192, 8192, 8192), "all_gather", 1 << 30))
        res = analysis.derive(model.predict(prof, scenarios, prof.world, True, {}))
        _assert_sane(path, res)
        report.markdown(res, [], None)
    assert used < len(list(_leaf_paths(_profile())))  # the value is refused somewhere


@pytest.mark.parametrize("value", [0, -1, -1e300, "x", None, [], 1e300, 1e-300, math.nan, math.inf])
def test_every_results_field_broken_is_refused_or_reported(value):
    """Each field of a measured results.json set to a bad value: refused with ResultsError where
    read (naming the field and the value), or reported and evaluated with every time,
    efficiency and speedup finite and positive."""
    from conccl.planner.profile import load_profile
    from conccl.study import analysis, evaluate, report
    from conccl.study.results import ResultsError, from_dict

    prof = load_profile()
    used = 0
    for path in _leaf_paths(_results()):
        try:  # through JSON, as from a file (NaN and Infinity included)
            res = from_dict(json.loads(json.dumps(_set(path, value))))
        except ResultsError as e:
            _assert_names(e, path, value)
            continue
        used += 1
        analysis.derive(res)
        _assert_sane(path, res)
        report.markdown(res, [], None)
        ev = evaluate.evaluate(res, prof)
        _assert_sane(path, ev)
        evaluate.markdown(ev)
    assert used < len(list(_leaf_paths(_results())))


@pytest.mark.parametrize("argv", [["study", "--gpus", "4", "--quick", "--out", "{d}/out"], ["bench", "--gpus", "4"]])
def test_more_gpus_than_visible_is_refused_before_any_gpu_is_used(tmp_path, capsys, monkeypatch, argv):
    """Two GPUs visible (simulated: nothing reaches them before the check), four asked for."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    rc, out, err = _run([a.replace("{d}", str(tmp_path)) for a in argv], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "--gpus 4" in err and "2 GPU(s) visible" in err
    assert not (tmp_path / "out").exists()
