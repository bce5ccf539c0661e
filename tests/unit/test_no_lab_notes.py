"""No-device tier: the project's files state what is true now; how the work was done (sessions,
runs, issue numbers, benchmark folders named by date) lives in git. Prose in src/, tests/ and the
shipped data is checked; dates that are a record's own fields (a JSON "date") are data."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECKED = [ROOT / "src" / "conccl", ROOT / "tests"]
SUFFIXES = {".py", ".json", ".md", ".cu", ".cuh", ".c", ".h", ".txt"}
LAB = re.compile(r"session ?\d+|sessions? \d|\brun ?\d+\b(?! ?(?:%|x|us|ms|s\b))|\bissue ?#?\d{1,3}\b|benchmarks/20\d\d-",
                 re.IGNORECASE)


def lab_lines():
    for top in CHECKED:
        for path in sorted(top.rglob("*")):
            if path.suffix not in SUFFIXES or "__pycache__" in path.parts or path == pathlib.Path(__file__):
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if LAB.search(line):
                    yield f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}"


def test_the_pattern_finds_what_it_must():
    for note in ("session 13's probe", "run4 of session 11", "(issue 38)", "see " + "bench" + "marks/2026-11-26-h100x2-latency",
                 "sessions 12-15", "Issue 22's goals"):
        assert LAB.search(note), note
    for fine in ("a pytest session fixture", "run the study", "3 runs", "rerun", "run_per_gpu", "issued copies"):
        assert not LAB.search(fine), fine


def test_no_session_run_or_issue_references():
    found = list(lab_lines())
    assert not found, "lines that speak of how the work was done:\n" + "\n".join(found)
