"""Benchmark output: nccl-tests-style tables on the terminal, JSON and Markdown files."""
from __future__ import annotations

import json
import statistics
import sys

from ..jsonfile import write_text

COLUMNS = ("size", "count", "type", "time", "min..max", "algbw", "busbw", "#wrong", "k/call", "gemm+")
UNITS = ("(B)", "(elements)", "", "(us)", "(us)", "(GB/s)", "(GB/s)", "", "", "(%)")
WIDTHS = (12, 12, 9, 10, 19, 8, 8, 7, 7, 7)


def _line(cells) -> str:
    return " ".join(str(c).rjust(w) for c, w in zip(cells, WIDTHS))


def print_header(impl, coll: str, world: int, out=sys.stdout) -> None:
    print(f"#\n# {impl.name}: {coll}, {world} ranks -- {impl.description}", file=out)
    print("#" + _line(COLUMNS)[1:], file=out)
    print("#" + _line(UNITS)[1:], file=out, flush=True)


def row_cells(rec: dict):
    if "error" in rec:
        return [rec["size"], rec["count"], rec["type"], "error: " + rec["error"][:80]]
    slow = rec.get("gemm_slowdown")
    return [
        rec["size"], rec["count"], rec["type"], f"{rec['time_us']:.1f}",
        f"{rec['time_min_us']:.1f}..{rec['time_max_us']:.1f}", f"{rec['algbw']:.2f}", f"{rec['busbw']:.2f}",
        rec.get("wrong", "N/A"), f"{rec['kernels_per_call']:g}" if "kernels_per_call" in rec else "N/A",
        "N/A" if slow is None else f"{100 * slow:.1f}" + ("*" if rec.get("gate_expired") else ""),
    ]


def print_row(rec: dict, out=sys.stdout) -> None:
    print(_line(row_cells(rec)), file=out, flush=True)


def print_footer(records: list[dict], out=sys.stdout) -> None:
    ok = [r for r in records if "busbw" in r]
    if ok:
        print(f"# Out of bounds values : {sum(r.get('wrong', 0) > 0 for r in ok)} {'OK' if all(r.get('wrong', 0) == 0 for r in ok) else 'FAILED'}", file=out)
        print(f"# Avg bus bandwidth    : {statistics.mean(r['busbw'] for r in ok):.3f}", file=out, flush=True)


def write_json(path: str, meta: dict, config: dict, records: list[dict]) -> None:
    write_text(path, json.dumps({"meta": meta, "config": config, "records": records}, indent=1))


def markdown(meta: dict, records: list[dict]) -> str:
    """A readable table per collective: busbw, time and GEMM slowdown of each implementation."""
    lines = [f"# conccl bench: {meta.get('machine_kind', '?')}, {meta.get('device', '?')} x {meta.get('world', '?')}",
             "", "| field | value |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in meta.items()]
    impls = list(dict.fromkeys(r["impl"] for r in records))
    for coll in dict.fromkeys(r["collective"] for r in records):
        rows = [r for r in records if r["collective"] == coll]
        names = [i for i in impls if any(r["impl"] == i for r in rows)]
        sizes = sorted({r["size"] for r in rows})
        by = {(r["impl"], r["size"]): r for r in rows}
        for title, key, fmt in (("bus bandwidth (GB/s)", "busbw", "{:.1f}"), ("time (us, median of the slowest rank)", "time_us", "{:.1f}"),
                                ("bf16 8192^3 GEMM slowdown beside it (%)", "gemm_slowdown", "{:+.1%}"),
                                ("kernels per call", "kernels_per_call", "{:g}"), ("#wrong", "wrong", "{}")):
            lines += ["", f"## {coll}: {title}", "", "| size | " + " | ".join(names) + " |",
                      "| ---: | " + " | ".join("---:" for _ in names) + " |"]
            for s in sizes:
                cells = []
                for n in names:
                    r = by.get((n, s))
                    v = None if r is None else r.get(key)
                    cells.append("err" if r is not None and "error" in r else "" if v is None else
                                 (fmt.format(v).replace("%", "") if key == "gemm_slowdown" else fmt.format(v)))
                lines.append(f"| {human(s)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def human(nbytes: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)
