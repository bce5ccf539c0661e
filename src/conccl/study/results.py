"""A study's results: the one reader and the one writer of results.json, and the records they
read and write (:mod:`conccl.study.results_records`, named here too: every caller imports them
from this module).

Schemas (the ``schema`` field; JSON field names are the records' attribute names):

- ``conccl-study/1``: the untyped document the first versions of ``conccl study`` wrote. It has
  no ``schema`` field but ``"format": "conccl-study/1"``, and lacks fields added since (the run
  settings ``side_by_side``, ``min_timed_ms``, ``max_iters``, ``auto_in_turns``,
  ``conccl_call``; a scenario's ``auto_in_turns``; a run's ``plan``). :func:`from_dict` upgrades
  it: a missing field takes its default (None, or empty).
- ``conccl-study-results/2`` to ``/4`` (:data:`OLDER_SCHEMAS`): these records before fields
  added since, read with those fields at their defaults (the derived ones recomputed).
- :data:`SCHEMA` (``conccl-study-results/5``): these records, every field written.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import types
import typing

from ..jsonfile import read_json
from . import results_check
from .results_records import (SCHEMA, AutoInTurns, Claim, CollCtas, CollSize, CommFit, CopyBesideGemm, GemmInfo,
                              GemmSmLoss, GroupSummary, HbmBytes, Machine, Peaks, ResultsError, Run, RunConfig,
                              ScenarioResult, Skipped, StrategyResult, StrategySummary, StudyResults, Summary, Timing)

# Read too: /4 lacks ``eager_sizes`` (empty: `conccl study --resume` adds it to a finished
# one); /3 also ``skipped``, ``parts``, ``copy_beside_gemm`` and ``machine.nvlinks`` (they take
# their defaults), /2 also the efficiency fields.
OLDER_SCHEMAS = ("conccl-study-results/4", "conccl-study-results/3", "conccl-study-results/2")
V1_FORMAT = "conccl-study/1"
RESULTS = "results.json"

__all__ = ["SCHEMA", "RESULTS", "ResultsError", "Timing", "RunConfig", "Machine", "CommFit", "Peaks", "GemmSmLoss",
           "CopyBesideGemm", "CollSize", "CollCtas", "GemmInfo", "HbmBytes", "Run", "StrategyResult", "Skipped",
           "AutoInTurns", "ScenarioResult", "StrategySummary", "GroupSummary", "Summary", "Claim", "StudyResults",
           "from_dict", "to_dict", "load_results", "save_results"]


def from_dict(data, origin: str = "study results") -> StudyResults:
    """The one reader: a results document (this schema, or version 1 upgraded) as records."""
    if not isinstance(data, dict):
        raise ResultsError(f"{origin}: not a conccl study result (a JSON {type(data).__name__})")
    schema = data.get("schema")
    if schema is None:
        fmt = data.get("format", V1_FORMAT)
        if fmt != V1_FORMAT:
            raise ResultsError(f"{origin}: not a conccl study result: format {fmt!r} found, expected schema "
                               f"{SCHEMA!r} (or the older format {V1_FORMAT!r})")
        data = _upgrade_v1(data)
    elif schema in OLDER_SCHEMAS:  # fields added since take their defaults; derive() fills the derived ones
        data = dict(data, schema=SCHEMA)
    elif schema != SCHEMA:
        raise ResultsError(f"{origin}: study results of schema {schema!r} found, this conccl reads {SCHEMA!r} "
                           f"(and upgrades {', '.join(map(repr, OLDER_SCHEMAS))} and {V1_FORMAT!r}); re-create them with this conccl")
    res = _record(StudyResults, data, origin)
    try:
        results_check.check(res)
    except results_check.Refused as e:
        raise ResultsError(f"{origin}: {e}") from None
    return res


def _upgrade_v1(data: dict) -> dict:
    """Version 1 had the same field names, ``format`` instead of ``schema``, and no fields
    added since: they take their defaults."""
    out = {k: v for k, v in data.items() if k != "format"}
    out["schema"] = SCHEMA
    return out


def to_dict(results: StudyResults) -> dict:
    """The one writer's document: every field of every record."""
    return dataclasses.asdict(results)


def load_results(path) -> StudyResults:
    """Read ``path``: a results.json, or a report folder holding one."""
    path = pathlib.Path(path)
    if path.is_dir() or not path.suffix:
        path = path / RESULTS
    return from_dict(read_json(path, ResultsError, "study results file"), str(path))


def save_results(out_dir, results: StudyResults) -> pathlib.Path:
    """Write ``out_dir``/results.json atomically (a crash never leaves half a file)."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (RESULTS + ".tmp")
    tmp.write_text(json.dumps(to_dict(results), indent=1, default=str))
    os.replace(tmp, out / RESULTS)
    return out / RESULTS


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _record(cls, data, where: str):
    if not isinstance(data, dict):
        raise ResultsError(f"{where}: expected an object, got {type(data).__name__}")
    hints = _hints(cls)
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise ResultsError(f"{where}: unknown field(s) {', '.join(unknown)} in a {cls.__name__}")
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ResultsError(f"{where}: missing field(s) {', '.join(missing)} of a {cls.__name__}; "
                           "re-create the file with `conccl study`")
    return cls(**{k: _value(hints[k], v, f"{where}.{k}") for k, v in data.items()})


def _value(tp, v, where: str):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None:
            return None
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _value(tp, v, where)
    if v is None:
        raise ResultsError(f"{where}: expected {_JSON_TYPES.get(tp, (None, 'a value'))[1]}, got null")
    if dataclasses.is_dataclass(tp):
        return _record(tp, v, where)
    if origin is list:
        _expect(v, list, where)
        (item,) = typing.get_args(tp)
        return [_value(item, x, f"{where}[{i}]") for i, x in enumerate(v)]
    if origin is dict:
        _expect(v, dict, where)
        _, item = typing.get_args(tp)
        return {k: _value(item, x, f"{where}.{k}") for k, x in v.items()}
    _expect(v, tp, where)
    return v


_JSON_TYPES = {float: ((int, float), "a number"), int: ((int,), "a whole number"), str: ((str,), "a string"),
               bool: ((bool,), "true or false"), dict: ((dict,), "an object"), list: ((list,), "a list")}


def _expect(v, tp, where: str) -> None:
    """Refuse a value of the wrong JSON type where it is read, not where it is first used."""
    types_, name = _JSON_TYPES.get(tp, ((object,), "a value"))
    if not isinstance(v, types_) or (isinstance(v, bool) and tp is not bool):
        raise ResultsError(f"{where}: expected {name}, got {json.dumps(v)[:40]}")
