"""A study's report folder: results.json (every number), results.csv (one row per scenario and
strategy), report.md, figures/*.png and a terminal summary. Rebuilt from results.json alone
(``conccl study --report DIR``), so a run measured on a GPU machine can be drawn elsewhere."""
from __future__ import annotations

import csv
import pathlib
import sys

from ..strategy import PAPER_STRATEGIES, STRATEGIES
from ..units import format_size
from . import analysis, figures
from .results import StudyResults, save_results


def banner(res: StudyResults) -> str:
    lines = []
    if res.kind == "prediction":
        src = res.meta.get("profile", "the embedded profile")
        lines.append(f"> **PREDICTION, not a measurement**: modelled from the hardware profile {src}; "
                     "no GPU ran these numbers.")
    if not res.complete:
        lines.append(f"> **INCOMPLETE**: the run stopped after {len(res.scenarios)} scenario(s)"
                     + (f" ({res.error})" if res.error else "") + "; the figures cover what was measured.")
    return "\n".join(lines)


def _f(v, fmt="{:.1f}"):
    return "n/a" if v is None else fmt.format(v)


def markdown(res: StudyResults, figure_names: list[str], figure_note: str | None) -> str:
    m, peaks, sm, cfg = res.meta, res.peaks, res.summary, res.config
    what = "Predicted" if res.kind == "prediction" else "Measured"
    machine = res.machine
    out = [f"# conccl study: C3 on {machine.world if machine else '?'} x {machine.device if machine else '?'}", ""]
    if banner(res):
        out += [banner(res), ""]
    out += [f"{what} {m.get('date', '')}, machine `{m.get('machine_kind', 'unknown')}`, commit `{m.get('commit', '?')}`, "
            f"torch {m.get('torch')}, CUDA {m.get('cuda')}, NCCL {m.get('nccl')}, cuda-python {m.get('cuda_python')}. "
            f"{cfg.warmup} warm-ups then {cfg.iters} timed executions per number"
            + (f" (more for a short configuration: enough to cover {cfg.min_timed_ms:g} ms, at most "
               f"{cfg.max_iters})" if cfg.min_timed_ms else "")
            + ", CUDA events, ranks aligned by a barrier before each, median of the slowest rank (spread in results.csv)."
            + (" conccl runs as a persistent op (agreed with the peers once per scenario, then only started), as a "
               "loop over the same buffers would." if cfg.conccl_call == "persistent" else ""),
            "", "Sizes are bytes of the collective's output per rank (K/M/G = 2^10/2^20/2^30). "
            "Speedup = (t_gemm + t_nccl) / t_concurrent against the serial run with NCCL; "
            "percent of ideal = (speedup - 1) / (ideal - 1).", ""]
    out += ["## Percent of ideal speedup, averaged over the suite", "",
            "| strategy | mean % of ideal | min % | scenarios >= 80% | mean speedup | % of own ideal | what it is |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for n, r in sm.strategies.items():
        desc = STRATEGIES[n].description if n in STRATEGIES else (
            "best c3 strategy per scenario" if n == "c3_best" else "best strategy per scenario")
        out.append(f"| {n} | {_f(r.mean_pct_ideal)} | {_f(r.min_pct_ideal)} | {r.n_at_least_80}/{r.n} | "
                   f"{r.mean_speedup:.3f}x | {_f(r.mean_pct_own_ideal)} | {desc} |")
    out += ["", "Percent of ideal counts against the serial run with NCCL, so a collective that is faster than "
            "NCCL alone can pass 100%. *% of own ideal* judges the overlap alone: the same formulas with the "
            "strategy's own collective timed alone (for NCCL strategies the two are equal)."]
    best = sm.strategies.get("best")
    if best:
        out += ["", f"Goal for the best strategy: >= {analysis.GOAL_MEAN:.0f}% on average and >= {analysis.GOAL_EACH:.0f}% "
                f"in every scenario (the paper: 72%). This run: {best.mean_pct_ideal:.1f}% on average "
                f"({best.mean_pct_ideal - analysis.GOAL_MEAN:+.1f} points from the goal), minimum "
                f"{best.min_pct_ideal:.1f}%, {best.n_at_least_80} of {best.n} scenarios at >= 80%."]
    turns = [s.auto_in_turns for s in res.scenarios if s.auto_in_turns]
    if turns:
        ratio = [100 * t.best_ms.median / t.auto_ms.median for t in turns]
        out += ["", f"`auto` timed again in turns with the fastest strategy of each scenario (back to back, a "
                f"configuration's time depends on what ran just before it): best time / auto time "
                f"{sum(ratio) / len(ratio):.1f}% on average, {min(ratio):.1f}% at worst, over {len(turns)} scenarios "
                "(per scenario: results.json, `auto_in_turns`; judged by `conccl plan --evaluate`)."]
    if sm.wrong:
        out += ["", f"**Wrong results** (output differed from NCCL's pattern): {', '.join(sm.wrong)}"]
    else:
        out += ["", "Every strategy's output equalled the pattern NCCL produces, in every scenario."]
    out += ["", "## The paper's claims beside this machine", "", "| claim | paper (MI300X) | here | holds? |",
            "| --- | --- | --- | --- |"]
    for c in res.claims:
        holds = {True: "yes", False: "no", None: "-"}[c.holds]
        out.append(f"| {c.claim} | {c.paper} | {_f(c.value)} {c.unit} | {holds} |")
    out += ["", "## Machine peaks", "",
            f"- bf16 matrix rate: {_f(peaks.bf16_flops and peaks.bf16_flops / 1e12)} TFLOP/s (best GEMM of the study)",
            f"- HBM bandwidth: {_f(peaks.hbm_bytes_per_s and peaks.hbm_bytes_per_s / 1e9, '{:.0f}')} GB/s "
            "(same-GPU copy, read + write)",
            f"- NVLink (copy engines, bus bandwidth per GPU): "
            f"{_f(peaks.nvlink_bytes_per_s and peaks.nvlink_bytes_per_s / 1e9, '{:.0f}')} GB/s",
            f"- machine op-to-byte: {_f(peaks.op_to_byte)} flop/B", ""]
    out += ["## Scenarios", "", "| scenario | GEMM (class) | collective (class) | t_gemm ms | t_nccl ms | t_conccl ms | "
            "taxonomy (paper) | ideal | " + " | ".join(PAPER_STRATEGIES) + " |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in PAPER_STRATEGIES) + " |"]
    for s in res.scenarios:
        if s.strategies is None:
            continue
        cells = []
        for n in PAPER_STRATEGIES:
            r = s.strategies.get(n)
            cells.append("-" if r is None else f"{r.speedup:.2f}x / {r.pct_ideal:.0f}%"
                         + (" WRONG" if r.correct is False else ""))
        g = s.gemm
        conccl = s.t_comm.get("conccl")
        out.append(f"| {s.id} | {g.tag} {g.m}x{g.n}x{g.k} ({s.gemm_class or '?'}) | "
                   f"{format_size(s.size)} ({s.comm_class or '?'}) | {s.t_gemm.median:.2f} | "
                   f"{s.t_comm['nccl'].median:.2f} | {_f(conccl and conccl.median, '{:.2f}')} | "
                   f"{s.taxonomy} ({s.paper_taxonomy or 'added'}) | {s.ideal:.2f}x | " + " | ".join(cells) + " |")
    mb = [s.id for s in res.scenarios if s.gemm_class == "memory-bound"]
    paper_mb = sorted({s.gemm.tag for s in res.scenarios if s.gemm.paper_class == "memory-bound"
                       and s.gemm_class == "compute-bound"})
    by = sorted({s.gemm_class_by for s in res.scenarios if s.gemm_class_by})
    out += ["", "Cells: speedup / percent of ideal (best of the SM sweep for the _rp strategies; the sweep is in "
            f"results.json). GEMM classes are measured, by {' and '.join(by) or 'n/a'}."]
    ncu = res.ncu
    if ncu.get("error"):
        out.append(f"ncu counters: not read ({ncu['error']}).")
    elif ncu:
        out += ["", "| GEMM | DRAM bytes (ncu) | compulsory bytes | L2 bytes (ncu) | measured op-to-byte |",
                "| --- | --- | --- | --- | --- |"]
        seen = set()
        for s in res.scenarios:
            if s.gemm_dram_bytes is not None and s.gemm.tag not in seen:
                seen.add(s.gemm.tag)
                out.append(f"| {s.gemm.tag} | {s.gemm_dram_bytes / 1e9:.2f} GB | {s.gemm.bytes / 1e9:.2f} GB"
                           f" | {s.gemm_l2_bytes / 1e9:.2f} GB | {s.gemm_measured_op_to_byte:.0f} |")
    if paper_mb:
        out.append(f"The paper's memory-bound GEMMs {', '.join(paper_mb)} measured compute-bound here.")
    out.append(f"Memory-bound GEMMs here: {', '.join(mb) if mb else 'none'}.")
    out += ["", "## By collective and taxonomy", "", "| group | n | ideal | " + " | ".join(PAPER_STRATEGIES) + " |",
            "| --- | --- | --- | " + " | ".join("---" for _ in PAPER_STRATEGIES) + " |"]
    for key, gr in sm.groups.items():
        out.append(f"| {key} | {gr.n} | {gr.ideal:.2f}x | "
                   + " | ".join(_f(gr.speedup.get(n), "{:.2f}x") for n in PAPER_STRATEGIES) + " |")
    out += ["", "## Figures", ""]
    if figure_note:
        out.append(figure_note)
    out += [f"![{f}](figures/{f})" for f in figure_names]
    out += ["", "Not measured: collectives' DRAM/L2 bytes (their HBM figures are logical bytes over time); "
            "NCCL's copy-engine mode (NCCL 2.28.9 here ran its SM kernel with only the output registered and "
            "failed with the input registered too; `scripts/nccl_ce_probe.py`)."]
    return "\n".join(out) + "\n"


def write_csv(path, res: StudyResults) -> None:
    cols = ["scenario", "collective", "size", "gemm", "taxonomy", "gemm_class", "comm_class", "t_gemm_ms",
            "t_nccl_ms", "t_conccl_ms", "ideal", "strategy", "sms_for_collective", "gemm_sms", "t_concurrent_ms",
            "t_min_ms", "t_max_ms", "speedup", "pct_ideal", "correct"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for s in res.scenarios:
            if s.strategies is None:
                continue
            conccl = s.t_comm.get("conccl")
            for name, runs in s.runs.items():
                for r in runs:
                    w.writerow([s.id, s.collective, s.size, s.gemm.tag, s.taxonomy, s.gemm_class, s.comm_class,
                                s.t_gemm.median, s.t_comm["nccl"].median, conccl.median if conccl else None,
                                round(s.ideal, 4), name, r.sms, r.gemm_sms, r.time_ms.median,
                                r.time_ms.min, r.time_ms.max, round(r.speedup, 4), round(r.pct_ideal, 2), r.correct])


def terminal_summary(res: StudyResults, out=None) -> None:
    out = out or sys.stdout
    label = "PREDICTED" if res.kind == "prediction" else "measured"
    print(f"\nconccl study ({label}, {res.summary.n_scenarios} scenarios"
          + ("" if res.complete else ", INCOMPLETE") + ")", file=out)
    print(f"{'strategy':<12}{'mean % ideal':>14}{'min %':>9}{'>=80%':>8}{'speedup':>9}{'% own ideal':>13}", file=out)
    for n, r in res.summary.strategies.items():
        own = r.mean_pct_own_ideal
        print(f"{n:<12}{r.mean_pct_ideal:>14.1f}{r.min_pct_ideal:>9.1f}{r.n_at_least_80:>5}/{r.n:<2}"
              f"{r.mean_speedup:>8.3f}x{'' if own is None else f'{own:>13.1f}'}", file=out)
    if res.summary.wrong:
        print(f"WRONG results: {', '.join(res.summary.wrong)}", file=out)


def render(out_dir, res: StudyResults, quiet: bool = False) -> pathlib.Path:
    """Derive, then write results.json, results.csv, figures and report.md into ``out_dir``."""
    out = pathlib.Path(out_dir)
    analysis.derive(res)
    save_results(out, res)
    write_csv(out / "results.csv", res)
    names, note = figures.draw_all(res, out / "figures")
    (out / "report.md").write_text(markdown(res, names, note))
    if not quiet:
        terminal_summary(res)
        print(f"report: {out / 'report.md'}")
    return out / "report.md"
