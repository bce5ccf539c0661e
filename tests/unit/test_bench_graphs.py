"""``conccl bench graphs`` without a GPU: its flags, its record schema, the timing arithmetic,
the JSON it writes and the table it renders (from synthetic records)."""
from __future__ import annotations

import dataclasses

import json
import math

import pytest

pytest.importorskip("torch")

import conccl  # noqa: E402
from conccl.bench import graphs  # noqa: E402
from conccl.bench.graphs import KNOWN_IMPLS, USES_CONCCL_GROUP, GraphsConfig, GraphsRecord  # noqa: E402
from conccl.bench.impls import REGISTRY, implementations  # noqa: E402
from conccl.bench.variant import Variant  # noqa: E402
from conccl.cli import build_parser, main  # noqa: E402
from conccl.collectives import REGISTRY as COLLECTIVES  # noqa: E402

OUT = ["bench", "graphs", "--out", "{d}/g"]

# (id, extra argv after OUT, what the one line must name)
BAD = [
    ("sizes 0", ["--sizes", "0"], "--sizes"),
    ("sizes text", ["--sizes", "4K,lots"], "--sizes"),
    ("sizes absurd", ["--sizes", "1T"], "--sizes"),
    ("sizes empty", ["--sizes", ","], "--sizes"),
    ("collectives unknown", ["--collectives", "all_gather,all_to_none"], "--collectives"),
    ("collectives empty", ["--collectives", ""], "--collectives"),
    ("impls unknown", ["--impls", "nccl,torch_lc"], "--impls"),
    ("impls gone", ["--impls", "nccl,conccl_symm_push"], "--impls"),
    ("impls twice", ["--impls", "nccl,nccl"], "--impls"),
    ("modes unknown", ["--modes", "graph,fast"], "--modes"),
    ("tensors unknown", ["--tensors", "pinned"], "--tensors"),
    ("algorithm unknown", ["--algorithm", "ring"], "--algorithm"),
    ("stream mode unknown", ["--stream-mode", "two"], "--stream-mode"),
    ("calls 0", ["--calls", "0"], "--calls"),
    ("calls text", ["--calls", "many"], "--calls"),
    ("replays 0", ["--replays", "0"], "--replays"),
    ("runs absurd", ["--runs", "1000000000"], "--runs"),
    ("warmup -1", ["--warmup", "-1"], "--warmup"),
    ("graph workspace 0", ["--graph-workspace", "0"], "--graph-workspace"),
    ("graph workspace text", ["--graph-workspace", "lots"], "--graph-workspace"),
    ("gpus 1", ["--gpus", "1"], "--gpus"),
    ("gpus 1000", ["--gpus", "1000"], "--gpus"),
    ("out under a file", ["--out", "{d}/a_file/g"], "--out"),
    ("out unwritable", ["--out", "/proc/conccl-test/g"], "--out"),
    ("machine without GPUs", ["--impls", "nccl,conccl"], "GPUs"),
]


def _run(argv, capsys, tmp_path):
    (tmp_path / "a_file").write_text("x")
    try:
        rc = main([a.replace("{d}", str(tmp_path)) for a in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("extra,names", [pytest.param(*c[1:], id=c[0]) for c in BAD])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, extra, names):
    monkeypatch.delenv("CONCCL_DEBUG", raising=False)
    rc, out, err = _run(OUT + extra, capsys, tmp_path)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, err)
    assert lines[0].startswith("conccl bench") and names in lines[0], err
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "g").exists()  # nothing made before the run could start


def test_every_flag_with_a_value_has_a_bad_input_case():
    sub = build_parser()._subparsers._group_actions[0].choices["bench-graphs"]
    covered = {a for c in BAD for a in c[1] if a.startswith("-")}
    missing = {a.option_strings[-1] for a in sub._actions if a.option_strings and a.nargs != 0
               and not covered & set(a.option_strings)} - {"--machine-kind", "--out"}
    assert not missing, sorted(missing)


def test_conccl_auto_sets_auto_reports_the_path_and_resets(monkeypatch):
    calls = []

    class Work:
        path = "nccl"

    monkeypatch.setattr(conccl, "set_eager_path", lambda mode="auto", **k: calls.append(mode) or
                        {"nccl_below": {"all_gather": 1 << 20}}, raising=False)
    monkeypatch.setattr(conccl, "all_gather_into_tensor", lambda out, inp: Work(), raising=False)
    ctx = {}
    run, result = REGISTRY["conccl_auto"].setup(COLLECTIVES["all_gather"], "inp", "out", ctx)
    run()
    assert ctx["path"] == "nccl" and result() == "out" and calls == ["auto"]
    REGISTRY["conccl_auto"].teardown(ctx)
    assert calls[-1] == "copy_engines" and "eager_path" not in ctx and "path" not in ctx


def test_conccl_one_shot_raises_the_groups_limit_reports_the_path_and_restores(monkeypatch):
    """Only the public functions may run one-shot (the communicator's methods, which the
    ``conccl`` entry calls, never do): this entry calls them with the limit past every size."""
    class Options:
        one_shot_below = 0

    class Comm:
        options = Options()

    class Work:
        path = "one_shot"

    seen = []
    comm = Comm()
    monkeypatch.setattr(conccl, "get_communicator", lambda: comm, raising=False)
    monkeypatch.setattr(conccl, "all_gather_into_tensor",
                        lambda out, inp: seen.append(comm.options.one_shot_below) or Work(), raising=False)
    ctx = {}
    run, result = REGISTRY["conccl_one_shot"].setup(COLLECTIVES["all_gather"], "inp", "out", ctx)
    run()
    assert ctx["path"] == "one_shot" and result() == "out"
    assert seen and seen[0] >= 1 << 40  # every size below the limit the call ran with
    REGISTRY["conccl_one_shot"].teardown(ctx)
    assert comm.options.one_shot_below == 0 and "path" not in ctx and "one_shot_below" not in ctx
    assert "conccl_one_shot" in KNOWN_IMPLS and USES_CONCCL_GROUP["conccl_one_shot"]


def test_config_defaults_cover_the_goals():
    cfg = GraphsConfig()
    assert len(cfg.sizes) >= 8 and min(cfg.sizes) == 4 << 10 and max(cfg.sizes) == 256 << 20
    assert {"all_gather", "all_to_all"} <= set(cfg.collectives) and cfg.impls[0] == "nccl"
    assert set(cfg.modes) == {"graph", "eager"}


def test_parse_list():
    assert graphs.parse_list(" a, b ,,", "--x") == ("a", "b")
    assert graphs.parse_list("1,2", "--x", int) == (1, 2)
    with pytest.raises(ValueError, match="--x"):
        graphs.parse_list(" , ", "--x")
    with pytest.raises(ValueError, match="--x"):
        graphs.parse_list("1,z", "--x", int)


def test_timing_arithmetic():
    assert graphs.per_call_us(2.0, calls=20, replays=10) == pytest.approx(10.0)  # 2 ms over 200 calls
    s = graphs.summarize([12.0, 10.0, 11.0, 30.0])
    assert s == {"us_per_call": 11.5, "us_min": 10.0, "us_max": 30.0, "us_runs": (12.0, 10.0, 11.0, 30.0)}


def test_calls_per_graph_keeps_the_workspace_in_its_budget():
    assert graphs.calls_per_graph(20, 1 << 20, 4 << 30) == 20
    assert graphs.calls_per_graph(20, 512 << 20, 4 << 30) == 8
    assert graphs.calls_per_graph(20, 8 << 30, 4 << 30) == 1  # one call even where it alone exceeds it
    assert graphs.calls_per_graph(20, 0, 1) == 20


@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_graph_workspace_per_call_covers_what_a_captured_call_takes(name):
    """At least the input's bytes (what docs/api.md says a captured call may need), with each
    peer's slot rounded up."""
    coll = COLLECTIVES[name]
    for world in (2, 3, 8):
        for size in (4096, 1 << 20, 12345 * world * 2):
            need = graphs.graph_workspace_per_call(coll, size, world)
            assert need >= coll.input_bytes(size, world) + world * 256


def _rec(coll="all_gather", size=1 << 20, impl="nccl", mode="graph", us=10.0, **kw) -> GraphsRecord:
    return GraphsRecord(coll, size, impl, mode, **{**graphs.summarize([us * 0.9, us, us * 1.2]),
                                                   "calls_per_graph": 20, "replays": 10, "wrong": 0, **kw})


def _records():
    recs = []
    for coll in ("all_gather", "all_to_all"):
        for size in (64 << 10, 1 << 20):
            for mode, base in (("graph", 10.0), ("eager", 30.0)):
                recs.append(_rec(coll, size, "nccl", mode, base))
                recs.append(_rec(coll, size, "conccl", mode, base * (0.7 if mode == "graph" else 2.5)))
                recs.append(_rec(coll, size, "conccl_auto", mode, base * 1.02, path="nccl", nccl_below=4 << 20))
    return recs


@pytest.mark.parametrize("bad", [
    {"mode": "replay"}, {"bytes": 0}, {"bytes": True}, {"impl": ""}, {"wrong": -1}, {"wrong": None},
    {"us_per_call": float("nan")}, {"us_per_call": 0.0}, {"us_min": 50.0}, {"calls_per_graph": 0},
    {"path": 3}, {"us_runs": (1.0, -1.0)},
])
def test_record_schema_refuses_bad_values(bad):
    d = _rec().to_dict()
    d.update(bad)
    with pytest.raises(ValueError):
        GraphsRecord.from_dict(d)


def test_record_schema_round_trip_and_errors():
    r = _rec(path="copy_engines", nccl_below=65536)
    assert GraphsRecord.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    err = GraphsRecord("all_to_all", 4096, "conccl", "graph", error="InvalidArgument: no slots")
    assert GraphsRecord.from_dict(err.to_dict()) == err
    for bad in ({**r.to_dict(), "colour": 1}, {k: v for k, v in r.to_dict().items() if k != "mode"}, [1]):
        with pytest.raises(ValueError):
            GraphsRecord.from_dict(bad)
    assert set(r.to_dict()) >= {"collective", "bytes", "impl", "mode", "us_per_call", "us_min", "us_max", "path"}


META = {"machine_kind": "nvidia-h200-x2", "date": "2026-11-24T00:00:00+00:00", "commit": "abc123", "host": "h",
        "world": 2, "device": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0", "nccl": "2.28.9",
        "cuda_python": "13.3.1", "conccl": "checkout", "python": "3.12"}


def test_document_and_files(tmp_path):
    doc = graphs.document(META, GraphsConfig(sizes=(65536, 1 << 20)), _records(),
                          {"nccl_below": {"all_gather": 4 << 20}})
    for key in ("machine_kind", "commit", "torch", "nccl", "cuda_python", "world", "results", "bytes"):
        assert key in doc, key
    assert doc["machine_kind"] == "nvidia-h200-x2" and doc["format"] == graphs.FORMAT
    graphs.write(tmp_path, doc)
    back = json.loads((tmp_path / "graphs.json").read_text())
    assert back["config"]["sizes"] == [65536, 1 << 20]
    assert graphs.records_of(back) == _records()
    assert (tmp_path / "graphs.md").read_text() == graphs.markdown(back)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graphs.json", "graphs.md"]  # no temporary left


def test_a_collective_routed_at_every_size_is_said_so():
    from conccl.planner.eager import ALWAYS
    recs = [dataclasses.replace(r, nccl_below=ALWAYS) if r.collective == "all_to_all" and r.nccl_below else r
            for r in _records()]
    text = graphs.markdown(graphs.document(META, GraphsConfig(sizes=(65536, 1 << 20)), recs))
    assert "sends an eager call to NCCL below: all_gather 4M, all_to_all every size." in text
    assert "8388608T" not in text
    p = {"file": "h100x2_profile.json", "chosen": "shipped", "device": "NVIDIA H100 80GB HBM3", "world": 2,
         "machine_kind": "nvidia-h100-x2", "date": "d0", "eager_sweep": {"machine_kind": "nvidia-h100-x2", "date": "d1"}}
    assert graphs._profile_text(p).endswith("measured on nvidia-h100-x2 d0; its eager sweep on nvidia-h100-x2 d1)")


def test_records_of_names_the_bad_result():
    doc = graphs.document(META, GraphsConfig(), _records())
    doc["results"][3]["mode"] = "replay"
    with pytest.raises(ValueError, match=r"results\[3\]"):
        graphs.records_of(doc)
    with pytest.raises(ValueError, match="format"):
        graphs.records_of({**doc, "format": "conccl-bench/1"})


def test_markdown_table_ratios_goals_paths_and_errors():
    recs = _records() + [GraphsRecord("all_gather", 4096, "conccl", "graph", error="RuntimeError: capture failed"),
                         _rec("all_gather", 4096, "nccl", "graph", 8.0, wrong=3)]
    md = graphs.markdown(graphs.document(META, GraphsConfig(), recs))
    lines = md.splitlines()
    assert "nvidia-h200-x2" in lines[0] and "abc123" in md and "output bytes per rank" in md
    assert "## all_gather, in a graph" in md and "## all_to_all, eager" in md
    head = next(l for l in lines if l.startswith("| size | nccl (us)"))
    assert head.split(" | ")[1:6] == ["nccl (us)", "conccl (us)", "x NCCL", "conccl_auto (us)", "x NCCL"]
    # 1 MiB all-gather in a graph: nccl 10.0, conccl 7.0 (0.70x), auto 10.2 (1.02x), path nccl, 0 wrong
    assert "| 1M | 10.0 | 7.0 | 0.70 | 10.2 | 1.02 | nccl | 0 |" in lines
    # eager: conccl 2.5x
    assert "| 64K | 30.0 | 75.0 | 2.50 | 30.6 | 1.02 | nccl | 0 |" in lines
    assert "| 4K | 8.0 | err |  |  |  |  | 3, 1 failed |" in lines
    assert "sends an eager call to NCCL below: all_gather 4M, all_to_all 4M." in md
    assert "one graph of 20 captured calls" in md
    goals = [l for l in lines if l.startswith("| in a graph") or l.startswith("| eager")]
    assert "| in a graph, 1M: conccl <= 1.00x NCCL | all_gather | 0.70x | yes |" in goals
    assert "| in a graph, 64K: conccl <= 0.80x NCCL | all_to_all | 0.70x | yes |" in goals
    assert any(l.startswith("| eager, every size: conccl_auto <= 1.05x NCCL | all_gather | 1.02x") and l.endswith("yes |")
               for l in goals)
    assert "## Failed cases" in md and "capture failed" in md


def test_markdown_says_a_missed_goal_and_an_unmeasured_one():
    recs = [_rec("all_gather", 1 << 20, "nccl", "graph", 10.0), _rec("all_gather", 1 << 20, "conccl", "graph", 12.0),
            _rec("all_gather", 4096, "nccl", "eager", 20.0), _rec("all_gather", 4096, "conccl_auto", "eager", 22.0)]
    goals = [l for l in graphs.markdown(graphs.document(META, GraphsConfig(), recs)).splitlines() if "NCCL |" in l]
    assert "| in a graph, 1M: conccl <= 1.00x NCCL | all_gather | 1.20x | no |" in goals
    assert "| in a graph, 64K: conccl <= 0.80x NCCL | all_gather | not measured | |" in goals
    assert "| eager, every size: conccl_auto <= 1.05x NCCL | all_gather | 1.10x (worst, at 4K) | no |" in goals


def test_markdown_without_nccl_has_no_ratios():
    recs = [_rec(impl="conccl"), _rec(impl="conccl", mode="eager", us=40.0)]
    md = graphs.markdown(graphs.document(META, GraphsConfig(), recs))
    assert "| 1M | 10.0 |  | 0 |" in md.splitlines()
    assert all(math.isfinite(r.us_per_call) for r in graphs.records_of(graphs.document(META, GraphsConfig(), recs)))


class _FakeCase:
    coll, size, calls, inp, out = COLLECTIVES["all_to_all"], 4096, 20, "inp", "out"


def test_each_case_tears_down_and_drops_conccl_groups_even_when_it_fails(monkeypatch):
    """The control flow of one implementation at one case, without a GPU: every mode gets a
    record (figures or the error), teardown always runs, conccl groups are dropped after graphs."""
    from conccl.bench import graphs_run
    from conccl.bench.impls import Impl

    events = []
    monkeypatch.setattr(graphs_run, "_drop_conccl_groups", lambda: events.append("drop"))
    monkeypatch.setattr(graphs_run, "_settle", lambda: events.append("settle"))

    def measure(mode, impl, unit, result, case, cfg, ctx):
        if mode == "graph":
            raise RuntimeError("capture\nfailed")
        return {**graphs.summarize([5.0, 6.0]), "wrong": 0, "path": "nccl"}

    monkeypatch.setattr(graphs_run, "_measure", measure)

    def setup(coll, inp, out, ctx):
        ctx["eager_path"] = {"nccl_below": {"all_to_all": 1 << 20}}
        return (lambda: None), (lambda: out)

    auto = Impl("conccl_auto", "fake", setup, teardown=lambda ctx: events.append("teardown"))
    recs, info = graphs_run._impl_records(auto, _FakeCase(), GraphsConfig(), {})
    assert [(r.mode, r.error) for r in recs] == [("graph", "RuntimeError: capture failed"), ("eager", None)]
    assert recs[1].us_per_call == 5.5 and recs[1].nccl_below == 1 << 20 and recs[1].calls_per_graph == 20
    assert info == {"nccl_below": {"all_to_all": 1 << 20}} and events == ["settle", "teardown", "drop"]

    events.clear()
    broken = Impl("conccl", "fake", lambda *a: (_ for _ in ()).throw(ValueError("no group")))
    recs, info = graphs_run._impl_records(broken, _FakeCase(), GraphsConfig(modes=("eager",)), {})
    assert [(r.mode, r.error) for r in recs] == [("eager", "ValueError: no group")] and info is None
    assert events == ["settle"]  # eager only: no graph slots to free

    events.clear()
    nccl = Impl("nccl", "fake", setup)
    graphs_run._impl_records(nccl, _FakeCase(), GraphsConfig(), {})
    assert "drop" not in events  # NCCL's graphs hold no conccl state


def test_a_staged_push_reserves_its_output_only_where_it_runs():
    """The case's calls per graph come from the input-sized bound, as before the staged push;
    the staged-push variants' captured calls take a slot of every rank's input."""
    ag = COLLECTIVES["all_gather"]
    plain = graphs.graph_workspace_per_call(ag, 1 << 20, 4)
    staged = graphs.graph_workspace_per_call(ag, 1 << 20, 4, staged_push=True)
    pad = 4 * 256 + graphs.CAPTURE_ALIGN  # each peer's slot rounded up, and the capture's region
    assert plain == (1 << 18) + pad and staged == (1 << 20) + pad
    rs = COLLECTIVES["reduce_scatter"]
    assert graphs.graph_workspace_per_call(rs, 1 << 20, 4, True) == graphs.graph_workspace_per_call(rs, 1 << 20, 4)
    # conccl's calls reserve by the output's bytes where the variant asks for the staged push
    staged_calls = implementations(Variant("symmetric", "staged_push"))
    assert staged_calls["conccl"].staged_push and not REGISTRY["conccl"].staged_push
    assert not any(i.staged_push for n, i in staged_calls.items() if n not in ("conccl", "conccl_persistent"))


def test_an_all_reduces_bound_covers_its_plan_in_one_pass_or_two():
    from conccl.collectives.all_reduce import one_pass, plan_all_reduce
    from conccl.schedule.base import Algorithm

    ar = COLLECTIVES["all_reduce"]
    for world in (2, 3, 8):
        for size in (4096, 1 << 20, 12 << 20, 64 << 20):
            auto = Algorithm.STAGED_PUSH if one_pass(size, world) else Algorithm.PUSH
            for algorithm, staged in ((auto, False), (Algorithm.STAGED_PUSH, True)):
                plan = plan_all_reduce(world, 0, size // 2, 2, "bfloat16", algorithm=algorithm)
                assert graphs.graph_workspace_per_call(ar, size, world, staged) >= plan.workspace_bytes, (world, size)


def test_variants_are_flags_of_the_conccl_implementation_and_accepted():
    """conccl's variants (conccl.empty tensors, in place, other stream modes) are --tensors,
    --algorithm and --stream-mode of the one conccl implementation, run by conccl's group, so
    dropped with it; every name --impls takes is the bench's registry's."""
    assert set(KNOWN_IMPLS) <= set(REGISTRY)
    assert all(USES_CONCCL_GROUP[n] == n.startswith("conccl") for n in KNOWN_IMPLS)
    args = build_parser().parse_args(["bench-graphs", "--out", "x", "--tensors", "in_place", "--algorithm", "push",
                                      "--stream-mode", "per_peer"])
    from conccl.cli.bench_graphs import config

    cfg = config(args)
    assert cfg.variant == Variant("in_place", "push", "per_peer") and cfg.impls == graphs.IMPLS
    assert config(build_parser().parse_args(["bench-graphs", "--out", "x"])).variant == Variant()
    doc = graphs.document(META, cfg, [_rec(impl="conccl")])
    assert doc["config"]["variant"] == {"tensors": "in_place", "algorithm": "push", "stream_mode": "per_peer"}
    assert "conccl calls: in place in a conccl.empty output, algorithm push, stream mode per_peer." in graphs.markdown(doc)
    with pytest.raises(ValueError, match="--impls"):
        GraphsConfig(impls=("nccl", "conccl_symm_push"))  # a variant is no name of its own


def test_a_dropped_group_takes_its_conccl_empty_arenas_along(monkeypatch):
    """conccl.empty memory is known to the group that allocated it: after the group is
    dropped, the next implementation must allocate afresh (else its tensors count as plain)."""
    from conccl.bench import graphs_run
    from conccl.bench.impls import Impl

    monkeypatch.setattr(graphs_run, "_drop_conccl_groups", lambda: None)
    monkeypatch.setattr(graphs_run, "_measure", lambda *a: {**graphs.summarize([5.0]), "wrong": 0, "path": None})
    ctx = {"arena_in": object(), "arena_out": object(), "max_bytes": 1 << 20}
    impl = Impl("conccl", "fake", lambda coll, inp, out, ctx: ((lambda: None), (lambda: out)))
    graphs_run._impl_records(impl, _FakeCase(), GraphsConfig(modes=("eager",)), ctx)
    assert "arena_in" in ctx and "arena_out" in ctx  # eager only: the group lives on
    graphs_run._impl_records(impl, _FakeCase(), GraphsConfig(), ctx)
    assert sorted(ctx) == ["max_bytes"]


def test_nccl_below_reads_what_set_eager_path_returned():
    from conccl.bench.graphs_run import _nccl_below

    ag = COLLECTIVES["all_gather"]
    assert _nccl_below({"nccl_below": {"all_gather": 65536}}, ag) == 65536
    for info in (None, {}, {"nccl_below": None}, {"nccl_below": {"all_gather": "64K"}}, {"nccl_below": {}}):
        assert _nccl_below(info, ag) is None


@pytest.mark.parametrize("wrong,rc", [(0, 0), (2, 1)])
def test_the_command_writes_both_files_and_exits_1_on_a_wrong_case(tmp_path, capsys, monkeypatch, wrong, rc):
    """Everything after the GPUs, with their results simulated: files, stdout, exit code."""
    import torch

    from conccl.cli import bench_graphs

    recs = _records() + [_rec("all_gather", 4096, "conccl", "graph", wrong=wrong)]
    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(bench_graphs, "environment", lambda kind, world: {**META, "machine_kind": kind, "world": world})
    monkeypatch.setattr(bench_graphs, "run_per_gpu", lambda fn, cfg, **kw: seen.update(cfg=cfg, **kw) or
                        [{"results": recs, "eager_path": {"nccl_below": {"all_gather": 1 << 20}}}])
    out = tmp_path / "run" / "g"
    out.parent.mkdir()  # the folder written in must exist; the command makes the last part
    assert main(["bench", "graphs", "--out", str(out), "--impls", "nccl,conccl", "--sizes", "64K,1M", "--calls", "8",
                 "--machine-kind", "nvidia-h200-x2"]) == rc
    assert seen["cfg"] == GraphsConfig(sizes=(65536, 1 << 20), impls=("nccl", "conccl"), calls=8)
    doc = json.loads((out / "graphs.json").read_text())
    assert doc["machine_kind"] == "nvidia-h200-x2" and doc["world"] == 2 and doc["eager_path"]["nccl_below"]
    assert graphs.records_of(doc) == recs and (out / "graphs.md").read_text() == graphs.markdown(doc)
    assert "## Goals" in capsys.readouterr().out


def test_the_beside_mode_is_asked_for_and_its_table_says_alone_beside_and_the_gemms():
    assert "beside" in graphs.MODES and "beside" not in GraphsConfig().modes  # a GEMM run: asked for
    assert GraphsConfig(modes=("beside",)).modes == ("beside",)
    recs = [_rec("all_gather", 65536, "nccl", "beside", 1300.0, alone_us=30.0, gemm_slowdown=1.002),
            _rec("all_gather", 65536, "conccl", "beside", 40.0, alone_us=25.0, gemm_slowdown=1.01)]
    doc = graphs.document(META, GraphsConfig(modes=("beside",)), recs)
    assert graphs.records_of(json.loads(json.dumps(doc))) == recs
    md = graphs.markdown(doc)
    assert "beside running bf16 8192^3 GEMMs" in md
    assert "| 64K | 30.0 | 1300.0 | +1270.0 | 1.002 | 25.0 | 40.0 | +15.0 | 1.010 | 0 |" in md, md
    for bad in ({"alone_us": 0.0}, {"gemm_slowdown": float("nan")}, {"alone_us": "fast"}):
        with pytest.raises(ValueError):
            GraphsRecord.from_dict({**recs[0].to_dict(), **bad})
