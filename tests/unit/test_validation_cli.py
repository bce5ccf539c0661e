"""No-device tier: argument checks, the public API without a process group, the command line
(parsing, exit codes, one module per command), the benchmark's cases against every registered
collective's reference, and the benchmark report writer on recorded numbers."""
from __future__ import annotations

import io
import json
import pathlib
import time
from dataclasses import asdict

import pytest

torch = pytest.importorskip("torch")

import conccl  # noqa: E402
from conccl import cli  # noqa: E402
from conccl.bench import latency, report  # noqa: E402
from conccl.bench.impls import REGISTRY as IMPLS, implementations  # noqa: E402
from conccl.bench.run import make_case, max_bytes, round_size  # noqa: E402
from conccl.bench.variant import Variant  # noqa: E402
from conccl.cli import build_parser, main  # noqa: E402
from conccl.cli.bench import bench_config, sweep  # noqa: E402
from conccl.collectives import REGISTRY as COLLECTIVES  # noqa: E402
from conccl.collectives import all_gather as ag  # noqa: E402
from conccl.collectives.all_gather import check_all_gather  # noqa: E402
from conccl.collectives.all_to_all import check_all_to_all  # noqa: E402
from conccl.collectives.base import Collective, Layout, LocalCall  # noqa: E402
from conccl.collectives.reduce_scatter import REDUCE_SCATTER  # noqa: E402
from conccl.schedule.base import Algorithm, StreamMode  # noqa: E402
from conccl.units import parse_size  # noqa: E402
from conccl.validate import InvalidArgument  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("output,input,match", [
    (torch.empty(8), torch.empty(8)[::2], "contiguous"),
    (torch.empty(8), torch.empty(4, dtype=torch.float16), "dtype mismatch"),
    (torch.empty(8), torch.empty(3), "expected world_size"),
    (torch.empty(8), "not a tensor", "torch.Tensor"),
    (torch.empty(8), torch.empty(4, device="meta"), "is on meta, expected a cpu tensor"),
])
def test_all_gather_bad_arguments(output, input, match):
    with pytest.raises(InvalidArgument, match=match):
        check_all_gather(output, input, 2, 0, "cpu")


def test_cpu_tensors_are_refused_for_the_gpu_api():
    with pytest.raises(InvalidArgument, match="cuda"):
        check_all_gather(torch.empty(8), torch.empty(4), 2, 0, "cuda")


def test_in_place_input_must_be_the_own_chunk():
    out = torch.empty(8)
    assert check_all_gather(out, out[4:], 2, 1, "cpu") is True
    with pytest.raises(InvalidArgument, match="chunk for rank 0"):
        check_all_gather(out, out[4:], 2, 0, "cpu")


@pytest.mark.parametrize("out_splits,in_splits,match", [
    ([1, 2], [1, -1], "negative"),
    ([1, 2], [1, 1], "sum to 2"),
    ([3], [1, 2], "one per rank"),
    ([1.5, 1.5], [1, 2], "not an integer"),
])
def test_all_to_all_bad_splits(out_splits, in_splits, match):
    with pytest.raises(InvalidArgument, match=match):
        check_all_to_all(torch.empty(3), torch.empty(3), out_splits, in_splits, 2, "cpu")


def test_all_to_all_needs_even_division_without_splits_and_no_aliasing():
    with pytest.raises(InvalidArgument, match="does not divide"):
        check_all_to_all(torch.empty(3), torch.empty(3), None, None, 2, "cpu")
    t = torch.empty(4)
    with pytest.raises(InvalidArgument, match="in place"):
        check_all_to_all(t, t, None, None, 2, "cpu")
    with pytest.raises(InvalidArgument, match="rows have shape"):
        check_all_to_all(torch.empty(2, 3), torch.empty(2, 4), None, None, 2, "cpu")


def test_public_api_without_a_process_group_is_a_clear_error():
    out = torch.empty(4)
    with pytest.raises(InvalidArgument, match="not initialised"):
        conccl.all_gather_into_tensor(out, torch.empty(2))
    with pytest.raises(InvalidArgument, match="not initialised"):
        conccl.all_to_all_single(out, torch.empty(4))
    assert set(conccl.__all__) >= {"all_gather_into_tensor", "all_to_all_single", "empty", "Work"}


@pytest.mark.parametrize("text,value", [("1", 1), ("64K", 65536), ("1M", 1 << 20), ("4G", 4 << 30),
                                        ("1.5G", 3 << 29), ("2MiB", 2 << 20)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "1X", "-4M", "0", "0.5"])
def test_parse_size_rejects_malformed(text):
    with pytest.raises(Exception, match="size"):
        parse_size(text)


def test_sweep_and_flags_as_nccl_tests():
    assert sweep(1 << 20, 4 << 30, 2)[-1] == 4 << 30 and len(sweep(1 << 20, 4 << 30, 2)) == 13
    args = build_parser().parse_args(["bench", "-b", "8M", "-e", "64M", "-f", "4", "-n", "7", "-w", "2", "-c", "0",
                                      "--collective", "all_to_all", "--impl", "conccl,nccl", "-d", "int8"])
    cfg = bench_config(args)
    assert cfg.sizes == [8 << 20, 32 << 20] and cfg.iters == 7 and cfg.warmup == 2 and not cfg.check
    assert cfg.collectives == ["all_to_all"] and cfg.impls == ["conccl", "nccl"] and cfg.dtype == "int8"
    with pytest.raises(ValueError, match="unknown implementation"):
        bench_config(build_parser().parse_args(["bench", "--impl", "nope"]))
    with pytest.raises(ValueError, match="below"):
        bench_config(build_parser().parse_args(["bench", "-b", "4G", "-e", "1M"]))


def test_bench_without_gpus_exits_nonzero_with_a_message(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # whatever this machine has
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert main(["bench", "-b", "1M", "-e", "1M"]) == cli.EXIT_USAGE
    assert "needs at least 2 CUDA GPUs" in capsys.readouterr().err


def test_bench_flag_errors_are_usage_errors(capsys):
    assert main(["bench", "-b", "4G", "-e", "1M"]) == cli.EXIT_USAGE
    assert "conccl bench: -e (max size" in capsys.readouterr().err
    assert main(["bench", "--impl", "nope"]) == cli.EXIT_USAGE
    assert "unknown implementation(s) nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # argparse's own errors exit 2 too
        main(["bench", "-b", "1X"])
    assert e.value.code == cli.EXIT_USAGE and "malformed size" in capsys.readouterr().err


def test_bench_fsdp_flags_are_checked_before_any_gpu_is_asked_for(capsys, tmp_path):
    out = str(tmp_path / "f")
    for argv, says in ((["--tokens", "0"], "whole numbers >= 1"), (["--tokens", "2k"], "comma-separated whole numbers"),
                       (["--configs", "nope"], "unknown nope"), (["--dim", "100", "--heads", "3"], "multiple of --heads"),
                       (["--train-steps", "3"], "must exceed --warmup"),
                       (["--cast-every-gather"], "needs --mixed-precision"), (["--lr", "-1"], "--lr must be"),
                       (["--lr", "nan"], "--lr must be")):
        assert main(["bench", "fsdp", "--out", out, *argv]) == cli.EXIT_USAGE, argv
        assert "conccl bench fsdp: " in (err := capsys.readouterr().err) and says in err, (argv, err)
    assert main(["bench", "fsdp", "--out", out, "--tokens", "16", "--layers", "1"]) == cli.EXIT_USAGE
    assert "needs at least 2 CUDA GPUs" in capsys.readouterr().err


def test_bench_moe_flags_are_checked_before_any_gpu_is_asked_for(capsys, tmp_path, monkeypatch):
    out = str(tmp_path / "m")
    for argv, says in ((["--topk", "9"], "more than --experts"), (["--impls", "nope"], "known: conccl"),
                       (["--routings", "flat"], "--routings: flat")):
        assert main(["bench", "moe", "--out", out, *argv]) == cli.EXIT_USAGE, argv
        assert "conccl bench moe: " in (err := capsys.readouterr().err) and says in err, (argv, err)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert main(["bench", "moe", "--out", out]) == cli.EXIT_USAGE
    assert "needs at least 2 CUDA GPUs" in capsys.readouterr().err


def test_every_command_is_a_module_with_add_parser_and_run():
    assert list(cli.COMMANDS) == ["bench", "bench-fsdp", "bench-graphs", "bench-moe", "bench-tp", "study", "study-tp", "plan", "plan-tp"]
    for name, module in cli.COMMANDS.items():
        assert module.__name__ == f"conccl.cli.{name.replace('-', '_')}"
        assert callable(module.add_parser) and callable(module.run)
    sub = build_parser()._subparsers._group_actions[0]
    assert list(sub.choices) == list(cli.COMMANDS)


def test_bench_collectives_are_the_registry():
    choices = next(a for a in build_parser()._subparsers._group_actions[0].choices["bench"]._actions
                   if a.dest == "collective").choices
    assert tuple(choices) == ("all", *COLLECTIVES)
    assert bench_config(build_parser().parse_args(["bench"])).collectives == list(COLLECTIVES)


def test_bench_config_keeps_the_json_fields_of_recorded_runs():
    recorded = json.loads((FIXTURES / "cli_bench.json").read_text())
    cfg = bench_config(build_parser().parse_args(["bench"]))
    assert set(asdict(cfg)) == set(recorded["config"]) | {"variant"}  # recorded before --tensors and the rest
    assert cfg.sizes == [1 << (20 + i) for i in range(13)] and cfg.iters == 20 and cfg.warmup == 5


def test_plan_without_a_workload_is_a_usage_error(capsys):
    assert main(["plan"]) == cli.EXIT_USAGE
    assert "conccl plan: give --gemm" in capsys.readouterr().err


# ---------------------------------------------------------------------------- the benchmark's cases
class _Reverse(Collective):
    """A collective no module of the benchmark knows: output chunk c of every rank holds rank
    (world - 1 - c)'s input chunk c. Stands for the next registered collective."""

    name = "reverse_test"
    api_name = "reverse_test_single"

    def layout(self, world, rank):
        return Layout(world, world, tuple(((world - 1 - c, c),) for c in range(world)))

    def local(self, output, input, args, world, rank, device_type) -> LocalCall:
        raise NotImplementedError

    def plan(self, *a, **k):
        raise NotImplementedError

    def reference(self, inputs, rank, args=None):
        world = len(inputs)
        return torch.cat([inputs[world - 1 - c].reshape(world, -1)[c] for c in range(world)])


CASE_COLLECTIVES = [*COLLECTIVES.values(), _Reverse()]


def _cases(coll, size, world, dtype):
    return [make_case(coll, size, world, r, dtype, "cpu") for r in range(world)]


@pytest.mark.parametrize("coll", CASE_COLLECTIVES, ids=lambda c: c.name)
@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int8])
def test_bench_case_agrees_with_the_collectives_reference(coll, world, dtype):
    """What the benchmark checks a run against (#wrong) is what the collective's reference
    computes from the inputs the benchmark gave every rank: for every registered collective."""
    esize = torch.empty((), dtype=dtype).element_size()
    size = round_size(3 * 1024 + 5, world, esize)
    cases = _cases(coll, size, world, dtype)
    inputs = [inp for inp, _, _ in cases]
    for rank, (inp, out, expected) in enumerate(cases):
        assert inp.dtype == dtype and inp.numel() * esize == coll.input_bytes(size, world)
        assert out.dtype == dtype and out.numel() * esize == size
        assert expected.dtype == torch.uint8 and expected.numel() == size
        ref = coll.reference(inputs, rank).contiguous().view(-1).view(torch.uint8)
        assert torch.equal(ref, expected)
    # every rank's input differs from every other's, and its chunks from each other: a byte
    # delivered to the wrong place or from the wrong peer counts as wrong
    lay = coll.layout(world, 0)
    if any(len(srcs) > 1 for srcs in lay.sources):
        return  # a reducing collective's inputs are small whole numbers (next test)
    chunks = {bytes(inp.view(torch.uint8)[j * size // lay.output_chunks:(j + 1) * size // lay.output_chunks].tolist())
              for inp in inputs for j in range(lay.input_chunks)}
    assert len(chunks) == world * lay.input_chunks


@pytest.mark.parametrize("world", [2, 4])
def test_bench_case_of_a_reducing_collective_is_exact(world):
    """A collective whose output chunk has several sources (reduce-scatter)
    gets small whole numbers, whose sum every dtype holds exactly."""
    size = round_size(4096, world, 2)
    cases = _cases(REDUCE_SCATTER, size, world, torch.bfloat16)
    for rank, (_, _, expected) in enumerate(cases):
        exact = sum(inp.double().reshape(world, -1)[rank] for inp, _, _ in cases)
        assert torch.equal(expected.view(torch.bfloat16).double(), exact) and exact.abs().max() > 0


def test_bench_buffers_hold_the_largest_input_and_output():
    ag_, a2a = COLLECTIVES["all_gather"], COLLECTIVES["all_to_all"]
    assert max_bytes([ag_, a2a], [1 << 20, 3 << 20], 4, 2) == 3 << 20  # as before: outputs the largest
    assert max_bytes([REDUCE_SCATTER], [1 << 20], 4, 2) == 4 << 20  # its input is world outputs


def _served(variant=Variant()) -> dict:
    """Implementation name -> the registered collectives it runs at world 4, calling as ``variant``."""
    return {n: [c for c in COLLECTIVES if i.serves(COLLECTIVES[c], 4)] for n, i in implementations(variant).items()}


def test_which_implementations_run_a_collective():
    served = _served()
    assert served["torch_lc"] == ["all_gather"]  # another library's path for the all-gather only
    every = [n for n, cs in served.items() if {"all_gather", "all_to_all"} <= set(cs)]
    assert set(every) == set(IMPLS) - {"torch_lc"}
    # reduce-scatter: conccl's default (push) calls and NCCL; not the all-gather-only path
    assert {n for n, cs in served.items() if "reduce_scatter" in cs} == set(every)
    # in place (the input the own chunk of a conccl.empty output): the all-gather only
    in_place = _served(Variant("in_place"))
    assert in_place["conccl"] == in_place["conccl_persistent"] == ["all_gather"]
    # the staged push: the collectives that have it, from ordinary or conccl.empty tensors
    for tensors in ("plain", "symmetric"):
        staged = _served(Variant(tensors, "staged_push"))
        assert sorted(staged["conccl"]) == sorted(staged["conccl_persistent"]) == ["all_gather", "all_reduce"]
        assert staged["nccl"] == served["nccl"]  # the variant shapes conccl's calls only
    # an unknown collective runs under conccl's and torch.distributed's own paths, not under
    # another library's path for named collectives only
    new = _Reverse()
    assert {n for n, i in IMPLS.items() if i.serves(new, 4)} == set(IMPLS) - {"torch_lc"}
    # a collective that refuses pull is not run by the pull variants (any tensors, any stream
    # mode), and is by the default and by push from conccl.empty tensors
    for variant in (Variant("symmetric", "pull"), *(Variant("plain", "pull", m) for m in ("per_peer", "single", "batch"))):
        refused = {n for n, i in implementations(variant).items() if not i.serves(REDUCE_SCATTER, 4)}
        assert {"conccl", "conccl_persistent"} <= refused and "nccl" not in refused, variant
    for variant in (Variant(), Variant("symmetric", "push")):
        assert all(i.serves(REDUCE_SCATTER, 4) for n, i in implementations(variant).items() if n != "torch_lc")


def test_bench_variant_flags_and_their_defaults():
    """--tensors, --algorithm and --stream-mode make the conccl implementations' Variant; the
    defaults are conccl's default call on ordinary tensors; an unknown value is refused."""
    assert bench_config(build_parser().parse_args(["bench"])).variant == Variant("plain", "auto", "auto")
    args = build_parser().parse_args(["bench", "--tensors", "symmetric", "--algorithm", "push", "--stream-mode", "single"])
    assert bench_config(args).variant == Variant("symmetric", "push", "single")
    assert set(IMPLS) == {"nccl", "conccl", "conccl_auto", "torch_lc", "conccl_persistent", "conccl_one_shot"}
    for flag, value in (("tensors", "pinned"), ("algorithm", "ring"), ("stream_mode", "two")):
        with pytest.raises(ValueError, match=flag.replace("_", "-")):
            Variant(**{flag: value})
    assert "conccl.empty tensors, algorithm push, stream mode single" in implementations(bench_config(args).variant)[
        "conccl"].description


# ---------------------------------------------------------------------------- reports
def test_report_writer_on_recorded_numbers(tmp_path):
    data = json.loads((FIXTURES / "cli_bench.json").read_text())
    md = report.markdown(data["meta"], data["records"])
    for coll in ("all_gather", "all_to_all"):
        assert f"## {coll}: bus bandwidth (GB/s)" in md and f"## {coll}: #wrong" in md
    assert "| 4G |" in md and "| size | conccl | nccl | torch_lc |" in md
    rec = next(r for r in data["records"] if "busbw" in r)
    cells = report.row_cells(rec)
    assert cells[0] == rec["size"] and float(cells[6]) == pytest.approx(rec["busbw"], abs=0.01)
    assert rec["busbw"] == pytest.approx(rec["algbw"] * COLLECTIVES[rec["collective"]].bus_factor(rec["world"]))
    assert report.row_cells({**rec, "error": "RuntimeError: boom"})[3] == "error: RuntimeError: boom"
    rows = [r for r in data["records"] if r["impl"] == "conccl" and r["collective"] == "all_gather"]
    out = io.StringIO()
    report.print_footer(rows, out=out)
    footer = out.getvalue()
    assert "# Out of bounds values : 0 OK" in footer
    assert f"# Avg bus bandwidth    : {sum(r['busbw'] for r in rows) / len(rows):.3f}" in footer
    path = tmp_path / "bench.json"
    report.write_json(str(path), data["meta"], data["config"], data["records"])
    assert json.loads(path.read_text()) == {k: data[k] for k in ("meta", "config", "records")}


def test_latency_bench_refuses_unknown_impls_and_runs_only_with_gpus(capsys, monkeypatch):
    with pytest.raises(SystemExit) as e:
        latency.main(["--out", "x", "--impls", "conccl,nccl_ce"])  # not an implementation the bench has
    assert e.value.code == 2 and "nccl_ce" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # whatever this machine has
    assert latency.main(["--out", "x"]) == 2
    assert "at least 2 GPUs" in capsys.readouterr().err


def test_latency_table_marks_an_expired_gate():
    rec = {"collective": "all_gather", "impl": "conccl", "size": 1 << 20, "time_us": 80.84, "loop_us": 70.0,
           "host_us": 69.2, "gpu_us": 27.3, "gate_expired": True, "wrong": 0, "signal_batching": "all"}
    text = latency.markdown({"meta": {"machine_kind": "k", "date": "d", "commit": "c"}, "world": 4, "iters": 100,
                             "reps": 3, "records": [rec, dict(rec, impl="nccl", gate_expired=False)]})
    assert "| all_gather | conccl | 1048576 | 80.8 | 70.0 | 69.2 | 27.3 (gate expired) | 0 |" in text
    assert "| all_gather | nccl | 1048576 | 80.8 | 70.0 | 69.2 | 27.3 | 0 |" in text
    assert "signal batching: ['all']" in text


def test_latency_phases_cover_every_registered_collective():
    for coll in COLLECTIVES.values():
        cls = type(coll)
        assert ("validate", cls.__module__, f"{cls.__name__}.local") in latency.PHASES
        assert ("plan", cls.__module__, f"{cls.__name__}.plan") in latency.PHASES


def test_latency_phase_timer_times_the_wrapped_phases_and_restores_them(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    cls = type(COLLECTIVES["all_gather"])
    plan, local = cls.plan, cls.local
    coll = COLLECTIVES["all_gather"]
    call = LocalCall((4096,) * 4, (4096,) * 4, False, ag.AllGatherPlanArgs(4096, False))

    def run():
        time.sleep(0.002)  # in no phase
        coll.plan(4, 0, call, None, algorithm=Algorithm.PULL, stream_mode=StreamMode.BATCH, input_symmetric=False,
                  output_symmetric=False, peers_in_place=False)
        time.sleep(0.001)

    ag.plan_all_gather.cache_clear()
    phases = latency._time_phases(run, 3)
    assert cls.plan is plan and cls.local is local  # unwrapped again
    assert set(phases) == set(latency.PHASE_LABELS)
    assert 0 < phases["plan"] < 1000  # us per call: the plan only, not the sleeps
    assert phases["validate"] == 0 and phases["call"] == 0
    rec = {"collective": "all_gather", "impl": "conccl", "size": 1 << 20, "time_us": 80.0, "loop_us": 70.0,
           "host_us": 69.0, "gpu_us": 27.0, "gate_expired": False, "wrong": 0, "host_phases_us": phases}
    text = latency.markdown({"meta": {}, "world": 4, "iters": 3, "reps": 1, "records": [rec]})
    assert ("| collective | implementation | size (B) | call | call key | local step | validate | board exchange | "
            "board post | settle | plan |") in text
    assert f"| all_gather | conccl | 1048576 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 | {phases['plan']:.1f} |" in text


def test_debug_before_a_two_word_command(capsys):
    assert main(["--debug", "plan", "tp", "--op", "gemm_rs", "--shape", "8192x3584x8192", "--world", "4"]) == cli.EXIT_OK
    assert "schedule" in capsys.readouterr().out


def test_a_reader_that_goes_away_is_not_bad_input(monkeypatch, capsys):
    def gone(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli.COMMANDS["plan"], "run", gone)
    monkeypatch.setattr(cli.os, "dup2", lambda *a: None)  # keep pytest's stdout
    assert main(["plan", "--gemm", "64x64x64", "--size", "1M"]) == cli.EXIT_OK
    assert capsys.readouterr().err == ""


def test_a_finished_study_without_its_report_says_how_to_draw_it(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["study", "--quick", "--out", str(out)]) == cli.EXIT_OK
    (out / "report.md").unlink()  # as a Ctrl-C while the report was drawn leaves it
    capsys.readouterr()
    assert main(["study", "--quick", "--out", str(out)]) == cli.EXIT_USAGE
    assert f"conccl study --report {out}" in capsys.readouterr().err


def test_the_conccl_implementations_call_as_the_variant_asks(monkeypatch):
    """Without a GPU: the communicator's method (or persistent op) gets the variant's algorithm
    and stream mode, and conccl.empty arenas (symmetric) or the own chunk of one (in place)."""
    import conccl.bench.impls as impls_mod
    from conccl.schedule.base import Algorithm, StreamMode

    calls = []

    class Op:
        def start(self):
            calls.append("start")

    class Comm:
        def all_gather_into_tensor(self, out, inp, **kw):
            calls.append((out, inp, kw))

        def persistent_all_gather_into_tensor(self, out, inp, **kw):
            calls.append(("persistent", out, inp, kw))
            return Op()

    monkeypatch.setattr(conccl, "get_communicator", lambda: Comm(), raising=False)
    monkeypatch.setattr(conccl, "empty", lambda n, dtype: torch.zeros(n, dtype=dtype), raising=False)
    monkeypatch.setattr(impls_mod.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(impls_mod.dist, "get_rank", lambda: 1)
    ag_ = COLLECTIVES["all_gather"]
    inp, out = torch.arange(4, dtype=torch.float32), torch.zeros(8, dtype=torch.float32)

    run, result = implementations()["conccl"].setup(ag_, inp, out, {"max_bytes": 64})
    run()
    assert calls.pop() == (out, inp, {"algorithm": None, "stream_mode": None}) and result() is out

    ctx = {"max_bytes": 64}
    run, result = implementations(Variant("symmetric", "push", "single"))["conccl"].setup(ag_, inp, out, ctx)
    run()
    o, i, kw = calls.pop()
    assert kw == {"algorithm": Algorithm.PUSH, "stream_mode": StreamMode.SINGLE} and result() is o
    assert torch.equal(i, inp) and o.data_ptr() == ctx["arena_out"].data_ptr() and i.data_ptr() == ctx["arena_in"].data_ptr()

    ctx = {"max_bytes": 64}
    run, result = implementations(Variant("in_place"))["conccl_persistent"].setup(ag_, inp, out, ctx)
    _, o, i, kw = calls.pop()  # agreed once, at setup
    run()
    assert calls.pop() == "start" and kw == {"algorithm": None, "stream_mode": None} and result() is o
    chunk = ag_.layout(2, 1).in_place_chunk  # the input is the own chunk of the output, already in place
    assert i.data_ptr() == o.data_ptr() + chunk * inp.numel() * 4 and torch.equal(o[4 * chunk:4 * chunk + 4], inp)
