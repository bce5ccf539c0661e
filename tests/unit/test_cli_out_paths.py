"""The command line's one rule for output paths (every ``--out``, ``--json``, ``--markdown``):
the parent folder must exist, the last component is created by the command; a path through a
file is refused as "X is a file, not a folder". Errors that name the bad flag, and ``--debug``'s
exit codes (bad input: 2 with the traceback; a bug: raised). In process: each bad input one line
on stderr naming what is wrong, exit 2, nothing created."""
from __future__ import annotations

import pytest

from conccl import cli
from conccl.cli import main
from conccl.cli.common import UsageError, check_out_dir, check_out_file

PLAN = ["plan", "--gemm", "64x64x64", "--size", "1M"]
STUDY = ["study", "--predict", "--quick"]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.delenv("CONCCL_DEBUG", raising=False)
    (tmp_path / "afile").write_text("x")
    return tmp_path


@pytest.mark.parametrize("argv, says", [
    (STUDY + ["--out", "{d}/missing/dir/study"], "--out {d}/missing/dir/study: the folder {d}/missing/dir does not exist"),
    (STUDY + ["--out", "{d}/afile/study"], "--out {d}/afile/study: {d}/afile is a file, not a folder"),
    (STUDY + ["--out", "{d}/afile"], "--out {d}/afile: {d}/afile is a file, not a folder"),
    (PLAN + ["--json", "{d}/afile/x.json"], "--json {d}/afile/x.json: {d}/afile is a file, not a folder"),
    (PLAN + ["--json", "{d}/missing/x.json"], "--json {d}/missing/x.json: the folder {d}/missing does not exist"),
    (["bench", "fsdp", "--out", "{d}/missing/dir/f"], "--out {d}/missing/dir/f: the folder {d}/missing/dir does not exist"),
    (["plan", "tp", "--op", "gemm_rs", "--shape", "8192x3584x8192", "--world", "4", "--json", "{d}/afile/x.json"],
     "--json {d}/afile/x.json: {d}/afile is a file, not a folder"),
])
def test_an_output_path_is_refused_in_one_line_naming_the_flag(tree, capsys, argv, says):
    before = sorted(tree.rglob("*"))
    assert main([a.replace("{d}", str(tree)) for a in argv]) == cli.EXIT_USAGE
    line = _one_line(capsys)
    assert says.replace("{d}", str(tree)) in line, line
    assert line.startswith("conccl ")
    assert sorted(tree.rglob("*")) == before  # nothing created, not even the folders that were missing


def test_the_last_folder_is_created_its_parent_must_exist(tree):
    assert check_out_dir(tree / "new", "--out") == tree / "new"  # allowed: only the last component is new
    assert not (tree / "new").exists()  # made by the command when it writes, not by the check
    assert check_out_dir(tree, "--out") == tree  # an existing folder
    with pytest.raises(UsageError, match="the folder .*/new does not exist; create it first"):
        check_out_dir(tree / "new" / "deeper", "--out")
    check_out_file(str(tree / "x.json"), "--json")  # a file in an existing folder
    with pytest.raises(UsageError, match="is a folder; give a file name"):
        check_out_file(str(tree), "--json")
    with pytest.raises(UsageError, match=r"afile is a file, not a folder"):
        check_out_dir(tree / "afile" / "a" / "b", "--out")


@pytest.mark.parametrize("argv, says", [
    (["--frobnicate"], "conccl: unrecognized arguments: --frobnicate"),
    (["--frobnicate", "plan", "--gemm", "64x64x64", "--size", "1M"], "conccl: unrecognized arguments: --frobnicate"),
    (PLAN + ["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ([], "conccl: a command is required: one of bench,"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_a_bad_flag_or_command_is_named(tree, capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == cli.EXIT_USAGE
    line = _one_line(capsys)
    assert says in line, line


def test_debug_keeps_exit_2_for_bad_input_and_raises_a_bug(tree, capsys, monkeypatch):
    argv = PLAN + ["--json", str(tree / "afile" / "x.json")]
    for debug in (["--debug"], []):
        assert main(debug + argv) == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert ("Traceback" in err and "UsageError: --json" in err) if debug else err.count("\n") == 1, err
    monkeypatch.setenv("CONCCL_DEBUG", "1")
    assert main(argv) == cli.EXIT_USAGE and "Traceback" in capsys.readouterr().err
    monkeypatch.delenv("CONCCL_DEBUG")

    def bug(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli.COMMANDS["plan"], "run", bug)
    assert main(PLAN) == cli.EXIT_FAILED and "internal error: RuntimeError: a bug" in _one_line(capsys)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["--debug", *PLAN])
