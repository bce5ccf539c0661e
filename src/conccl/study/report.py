"""A study's report folder: results.json (every number), results.csv (one row per scenario and
strategy), report.md, figures/*.png and a terminal summary. Rebuilt from results.json alone
(``conccl study --report DIR``), so a run measured on a GPU machine can be drawn elsewhere."""
from __future__ import annotations

import csv
import io
import pathlib
import sys

from ..jsonfile import write_text
from ..planner.eager import TOLERANCE
from ..strategy import PAPER_STRATEGIES, STRATEGIES
from ..units import format_size
from . import analysis, figures, metrics
from .results import StudyResults, save_results


PCT_NOTE = ("Percent of ideal (the paper's) = (speedup - 1) / (ideal - 1) divides by (ideal - 1): where one kernel "
            f"is much longer than the other (ideal below {metrics.ILL_CONDITIONED}x) a few microseconds swing it by "
            "hundreds of points, so read it beside the efficiency, never alone.")
EFF_NOTE = ("Efficiency = max(t_gemm, fastest collective alone) / t_concurrent: 100% is the shorter kernel wholly "
            "hidden behind the longer one at its best isolated speed (NCCL or copy engines).")


def is_prediction(res: StudyResults) -> bool:
    return res.kind == "prediction"


def banner(res: StudyResults) -> str:
    lines = []
    if res.parts:
        measured = [p for p, how in res.parts.items() if how.startswith("measured")]
        predicted = sorted({how for how in res.parts.values() if not how.startswith("measured")})
        lines.append(f"> **ONE GPU: part measured, part PREDICTED.** Measured on this GPU: {', '.join(measured)}. "
                     f"Predicted: {', '.join(p for p, how in res.parts.items() if not how.startswith('measured'))} "
                     f"({'; '.join(predicted)}, with this GPU's measurements folded in): no collective ran or was "
                     "checked. A node of two or more GPUs measures it all.")
    elif is_prediction(res):
        src = res.meta.get("profile", "the embedded profile")
        lines.append(f"> **PREDICTION, not a measurement**: every number is modelled from the hardware profile {src}. "
                     "No GPU ran, timed or checked anything.")
        if res.meta.get("extrapolated"):
            lines.append(f"> **EXTRAPOLATED**: {res.meta['extrapolated']}.")
    if res.meta.get("resumed_from"):
        lines.append(f"> Resumed: the first part ran {res.meta['resumed_from']}.")
    if not res.complete:
        lines.append(f"> **PARTIAL**: the run stopped after {len(res.scenarios)} scenario(s)"
                     + (f" ({res.error})" if res.error else "") + "; the tables and figures cover what was done. "
                     "`conccl study --out DIR --resume` continues it.")
    return "\n\n".join(lines)


def _f(v, fmt="{:.1f}"):
    return "n/a" if v is None else fmt.format(v)


def _method(res: StudyResults) -> str:
    """How the numbers were made: a measurement's timing, or a prediction's model (no word of
    warm-ups, events or checks, which a prediction never had)."""
    m, cfg = res.meta, res.config
    if is_prediction(res):
        return (f"Predicted {m.get('date', '')} on machine `{m.get('machine_kind', 'unknown')}`, conccl commit "
                f"`{m.get('commit', '?')}`, from the profile {m.get('profile', '?')}. GEMM times: roofline with the "
                "efficiencies the profile measured; collectives alone: its measured size sweep, interpolated; "
                "together: the planner's model of each strategy (torch_lc: the mean percent of ideal the profile "
                "measured). profile.json is not written: a prediction adds no measurement to make one from.")
    return (f"Measured {m.get('date', '')}, machine `{m.get('machine_kind', 'unknown')}`, commit `{m.get('commit', '?')}`, "
            f"torch {m.get('torch')}, CUDA {m.get('cuda')}, NCCL {m.get('nccl')}, cuda-python {m.get('cuda_python')}. "
            f"{cfg.warmup} warm-ups then {cfg.iters} timed executions per number"
            + (f" (more for a short configuration: enough to cover {cfg.min_timed_ms:g} ms, at most "
               f"{cfg.max_iters})" if cfg.min_timed_ms else "")
            + ", CUDA events, ranks aligned by a barrier before each, median of the slowest rank (spread in results.csv)."
            + (" conccl runs as a persistent op (agreed with the peers once per scenario, then only started), as a "
               "loop over the same buffers would." if cfg.conccl_call == "persistent" else "")
            + (f" `auto`'s hardware profile: {m['auto_profile'].removeprefix('hardware profile: ').rstrip('.')}."
               if m.get("auto_profile") else "")
            + (" A complete run writes profile.json (the planner's hardware profile) beside this report." if res.complete else
               " profile.json is not written: the run is partial."))


def markdown(res: StudyResults, figure_names: list[str], figure_note: str | None) -> str:
    peaks, sm = res.peaks, res.summary
    pred = is_prediction(res)
    P = "Predicted: " if pred else ""  # every section a table sits under says what it holds (see _h)
    p = "predicted " if pred else ""
    machine = res.machine
    title = f"# conccl study: C3 on {machine.world if machine else '?'} x {machine.device if machine else '?'}"
    kind = (" (ONE GPU: its own part measured, the collectives' PREDICTED)" if res.parts else
            " (PREDICTION from a hardware profile, no GPU ran)" if pred else "")
    out = [title + kind, ""]
    if banner(res):
        out += [banner(res), ""]
    out += [_method(res), "", "Sizes are bytes of the collective's output per rank (K/M/G = 2^10/2^20/2^30). "
            + EFF_NOTE + " Speedup = (t_gemm + t_nccl) / t_concurrent against the serial run with NCCL. " + PCT_NOTE, ""]
    if res.skipped:
        out += [f"**Not run** ({len(res.skipped)} scenario(s) of the suite, kept out of every mean and table): "
                + "; ".join(f"`{sk.id}` {sk.reason}" for sk in res.skipped) + ".", ""]
    out += [_h(P, "efficiency per strategy, over the suite"), "",
            f"| strategy | {p}mean efficiency | min efficiency | mean % of ideal | min % of ideal | "
            "scenarios >= 80% of ideal | mean speedup | what it is |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for n, r in sm.strategies.items():
        out.append(f"| {n} | **{_f(r.mean_efficiency)}%** | {_f(r.min_efficiency)}% | {_f(r.mean_pct_ideal)} | "
                   f"{_f(r.min_pct_ideal)} | {r.n_at_least_80}/{r.n} | {r.mean_speedup:.3f}x | {_describe(n, res)} |")
    out += ["", "Each (scenario, strategy) has one number, its fastest sweep point, in every table, figure and "
            "results.csv row marked best. Percent of ideal counts against the serial run with NCCL, so a collective "
            "faster than NCCL alone can pass 100%."]
    best = sm.strategies.get("best")
    if best:
        out += ["", f"Goal for the best strategy (in the paper's measure): >= {analysis.GOAL_MEAN:.0f}% of ideal on "
                f"average and >= {analysis.GOAL_EACH:.0f}% in every scenario (the paper: 72%). This "
                f"{'prediction' if pred else 'run'}: efficiency {_f(best.mean_efficiency)}% on average (minimum "
                f"{_f(best.min_efficiency)}%); {best.mean_pct_ideal:.1f}% of ideal on average, minimum "
                f"{best.min_pct_ideal:.1f}%, {best.n_at_least_80} of {best.n} scenarios at >= 80%."]
    turns = [s.auto_in_turns for s in res.scenarios if s.auto_in_turns]
    if turns:
        ratio = [100 * t.best_ms.median / t.auto_ms.median for t in turns]
        out += ["", f"A second measurement, apart from the tables: `auto` and the fastest strategy of each scenario "
                f"timed again in turns (back to back, a configuration's time depends on what ran just before it): "
                f"best time / auto time {sum(ratio) / len(ratio):.1f}% on average, {min(ratio):.1f}% at worst, over "
                f"{len(turns)} scenarios (results.json, `auto_in_turns`; judged by `conccl plan --evaluate`)."]
    if sm.wrong:
        out += ["", f"**Wrong results** (output differed from NCCL's pattern): {', '.join(sm.wrong)}"]
    elif not pred:
        out += ["", "Every strategy's output equalled the pattern NCCL produces, in every scenario."]
    out += ["", _h(P, f"the paper's claims beside this {'prediction' if pred else 'machine'}"), "",
            f"| claim | paper (MI300X) | {'predicted here' if pred else 'here'} | holds? |", "| --- | --- | --- | --- |"]
    for c in res.claims:
        holds = {True: "yes", False: "no", None: "-"}[c.holds]
        eff = "" if c.efficiency is None else f" (efficiency {c.efficiency:.1f}%)"
        out.append(f"| {c.claim} | {c.paper} | {_f(c.value)} {c.unit}{eff} | {holds} |")
    src = "the profile" if pred else "measured"
    out += ["", f"## {'Machine peaks, from the profile' if pred else 'Machine peaks'}", "",
            f"- bf16 matrix rate: {_f(peaks.bf16_flops and peaks.bf16_flops / 1e12)} TFLOP/s "
            f"({'the profile' if pred else 'best GEMM of the study'})",
            f"- HBM bandwidth: {_f(peaks.hbm_bytes_per_s and peaks.hbm_bytes_per_s / 1e9, '{:.0f}')} GB/s "
            f"(same-GPU copy, read + write; {src})",
            f"- NVLink (copy engines, bus bandwidth per GPU): "
            f"{_f(peaks.nvlink_bytes_per_s and peaks.nvlink_bytes_per_s / 1e9, '{:.0f}')} GB/s ({src})",
            f"- machine op-to-byte: {_f(peaks.op_to_byte)} flop/B", ""]
    out += _copy_beside_gemm(res)
    out += _eager_calls(res)
    out += _scenario_table(res, P, p)
    out += _gemm_notes(res)
    out += ["", _h(P, "by collective and taxonomy"), "",
            f"Cells: {p}mean efficiency / mean % of ideal over the group's scenarios.", "",
            f"| group | n | {p}ideal | " + " | ".join(PAPER_STRATEGIES) + " |",
            "| --- | --- | --- | " + " | ".join("---" for _ in PAPER_STRATEGIES) + " |"]
    for key, gr in sm.groups.items():
        out.append(f"| {key} | {gr.n} | {gr.ideal:.2f}x | " + " | ".join(
            "-" if n not in gr.efficiency else f"{gr.efficiency[n]:.0f}% / {gr.pct_ideal[n]:.0f}%"
            for n in PAPER_STRATEGIES) + " |")
    out += ["", f"## {'Figures (predicted)' if pred else 'Figures'}", ""]
    if figure_note:
        out.append(figure_note)
    out += [f"![{f}](figures/{f})" for f in figure_names]
    if not pred:
        out += ["", "Not measured: collectives' DRAM/L2 bytes (their HBM figures are logical bytes over time); "
                "NCCL's copy-engine mode (NCCL 2.28.9 here ran its SM kernel with only the output registered and "
                "failed with the input registered too; `scripts/nccl_ce_probe.py`)."]
    return "\n".join(out) + "\n"


def _copy_beside_gemm(res: StudyResults) -> list[str]:
    """Measured on one GPU: each GEMM beside a copy-engine copy (no SM taken)."""
    if not res.copy_beside_gemm:
        return []
    out = ["## Measured: GEMMs beside copy-engine copies (one GPU)", "",
           "A same-GPU copy (d2d) reads and writes HBM at ~4x the rate an NVLink transfer writes it, so it "
           "over-states what a copy-engine collective costs a GEMM; a pinned host-to-GPU copy (h2d) over PCIe "
           "loads HBM lightly. Efficiency = max(alone) / together (100%: the shorter wholly hidden).", "",
           "| GEMM | copy | GEMM alone (ms) | copy alone (ms) | together (ms) | efficiency |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in res.copy_beside_gemm:
        out.append(f"| {r.gemm} ({r.mnk}) | {r.kind} {r.copy_bytes >> 20} MiB | {r.gemm_ms.median:.3f} | "
                   f"{r.copy_ms.median:.3f} | {r.together_ms.median:.3f} | {_f(r.efficiency)}% |")
    return out + [""]


def _eager_calls(res: StudyResults) -> list[str]:
    """The eager sweep: the public functions on ordinary tensors, conccl's against NCCL's."""
    rows = {(r.collective, r.size, r.impl): r for r in res.eager_sizes}
    keys = sorted({(c, size) for c, size, _ in rows})
    if not keys:
        return []
    out = ["## Measured: eager calls on ordinary tensors", "",
           "The public functions called back to back on ordinary tensors (host time included; conccl stages the "
           "input), us per call, the two in turns. `set_eager_path(\"auto\")` plans from these: NCCL below the "
           f"size from which conccl stays within {round((TOLERANCE - 1) * 100)}% (the profile's `eager_sweep`).", "",
           "| collective | size | NCCL (us) | conccl (us) | x NCCL | right |", "| --- | --- | --- | --- | --- | --- |"]
    for c, size in keys:
        n, ce = rows.get((c, size, "nccl")), rows.get((c, size, "conccl"))
        if n is None or ce is None:
            continue
        ok = {True: "yes", False: "**no**", None: "-"}[ce.correct]
        out.append(f"| {c} | {size >> 20}M | {n.time_ms.median * 1e3:.1f} | {ce.time_ms.median * 1e3:.1f} | "
                   f"{ce.time_ms.median / n.time_ms.median:.2f} | {ok} |")
    return out + [""]


def _describe(name: str, res: StudyResults) -> str:
    """What a strategy row is, as it ran in this study: a measured run from before persistent ops
    (no ``conccl_call`` recorded) called conccl once per execution."""
    if name == "conccl" and not is_prediction(res) and res.config.conccl_call != "persistent":
        return "conccl copy-engine collective (no SM; one call per execution, before persistent ops), GEMM launched first"
    if name in STRATEGIES:
        return STRATEGIES[name].description
    return "best c3 strategy per scenario" if name == "c3_best" else "best strategy per scenario"


def _h(prefix: str, text: str) -> str:
    return f"## {prefix}{text}" if prefix else f"## {text[0].upper()}{text[1:]}"


def _scenario_table(res: StudyResults, P: str, p: str) -> list[str]:
    out = [_h(P, "scenarios"), "",
           f"Cells: {p}efficiency / % of ideal, the strategy's fastest sweep point (the whole sweep is in "
           f"results.json); `*`: ideal below {metrics.ILL_CONDITIONED}x, where percent of ideal is ill-conditioned.",
           "", f"| scenario | GEMM (class) | collective (class) | {p}t_gemm ms | {p}t_nccl ms | {p}t_conccl ms | "
           f"taxonomy (paper) | {p}ideal | " + " | ".join(PAPER_STRATEGIES) + " |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in PAPER_STRATEGIES) + " |"]
    for s in res.scenarios:
        if s.strategies is None:
            continue
        cells = []
        for n in PAPER_STRATEGIES:
            r = s.strategies.get(n)
            cells.append("-" if r is None else f"{r.efficiency:.0f}% / {r.pct_ideal:.0f}%"
                         + (" WRONG" if r.correct is False else ""))
        g = s.gemm
        conccl = s.t_comm.get("conccl")
        ill = "*" if s.ideal < metrics.ILL_CONDITIONED else ""
        out.append(f"| {s.id} | {g.tag} {g.m}x{g.n}x{g.k} ({s.gemm_class or '?'}) | "
                   f"{format_size(s.size)} ({s.comm_class or '?'}) | {s.t_gemm.median:.2f} | "
                   f"{s.t_comm['nccl'].median:.2f} | {_f(conccl and conccl.median, '{:.2f}')} | "
                   f"{s.taxonomy} ({s.paper_taxonomy or 'added'}) | {s.ideal:.2f}x{ill} | " + " | ".join(cells) + " |")
    return out


def _gemm_notes(res: StudyResults) -> list[str]:
    mb = [s.id for s in res.scenarios if s.gemm_class == "memory-bound"]
    paper_mb = sorted({s.gemm.tag for s in res.scenarios if s.gemm.paper_class == "memory-bound"
                       and s.gemm_class == "compute-bound"})
    by = sorted({s.gemm_class_by for s in res.scenarios if s.gemm_class_by})
    out = ["", f"GEMM classes are {'predicted' if is_prediction(res) else 'measured'}, by {' and '.join(by) or 'n/a'}."]
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
        out.append(f"The paper's memory-bound GEMMs {', '.join(paper_mb)} are compute-bound here.")
    out.append(f"Memory-bound GEMMs here: {', '.join(mb) if mb else 'none'}.")
    return out


def write_csv(path, res: StudyResults) -> None:
    """One row per run (every sweep point); ``strategy_best`` marks the one each table shows."""
    cols = ["kind", "scenario", "collective", "size", "gemm", "taxonomy", "gemm_class", "comm_class", "t_gemm_ms",
            "t_nccl_ms", "t_conccl_ms", "t_comm_best_ms", "ideal", "strategy", "sms_for_collective", "gemm_sms",
            "t_concurrent_ms", "t_min_ms", "t_max_ms", "efficiency", "speedup", "pct_ideal", "strategy_best", "correct"]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(cols)
    for s in res.scenarios:
        if s.strategies is None:
            continue
        conccl = s.t_comm.get("conccl")
        for name, runs in s.runs.items():
            best = min(runs, key=lambda r: r.time_ms.median) if runs else None
            for r in runs:
                w.writerow([res.kind, s.id, s.collective, s.size, s.gemm.tag, s.taxonomy, s.gemm_class, s.comm_class,
                            s.t_gemm.median, s.t_comm["nccl"].median, conccl.median if conccl else None,
                            s.t_comm_best, round(s.ideal, 4), name, r.sms, r.gemm_sms, r.time_ms.median,
                            r.time_ms.min, r.time_ms.max, round(r.efficiency, 2), round(r.speedup, 4),
                            round(r.pct_ideal, 2), r is best, r.correct])
    write_text(path, buf.getvalue())


def terminal_summary(res: StudyResults, out=None) -> None:
    out = out or sys.stdout
    pred = is_prediction(res)
    label = ("ONE GPU: its own part measured, the collectives' PREDICTED" if res.parts else
             "PREDICTION from a hardware profile, no GPU ran" if pred else "measured")
    print(f"\nconccl study ({label}, {res.summary.n_scenarios} scenarios"
          + ("" if res.complete else ", PARTIAL: continue with --resume") + ")", file=out)
    if pred:
        print(f"profile: {res.meta.get('profile', '?')}", file=out)
        if res.meta.get("extrapolated"):
            print(f"EXTRAPOLATED: {res.meta['extrapolated']}", file=out)
    head = "predicted " if pred else ""
    print(f"{'strategy':<12}{head + 'efficiency':>21}{'min':>8}{'% of ideal':>12}{'min':>9}{'>=80%':>8}"
          f"{'speedup':>9}", file=out)
    for n, r in res.summary.strategies.items():
        print(f"{n:<12}{_f(r.mean_efficiency):>20}%{_f(r.min_efficiency):>7}%{r.mean_pct_ideal:>12.1f}"
              f"{r.min_pct_ideal:>9.1f}{r.n_at_least_80:>5}/{r.n:<2}{r.mean_speedup:>8.3f}x", file=out)
    print("efficiency = max(t_gemm, fastest collective alone) / t_concurrent; % of ideal (the paper's) is "
          f"ill-conditioned where the ideal speedup is below {metrics.ILL_CONDITIONED}x", file=out)
    if res.skipped:
        print(f"not run ({len(res.skipped)}, too large for one GPU's memory): "
              + ", ".join(sk.id for sk in res.skipped), file=out)
    if pred:
        print("profile.json: not written (a prediction adds no measurement to make one from)", file=out)
    if res.summary.wrong:
        print(f"WRONG results: {', '.join(res.summary.wrong)}", file=out)


def render(out_dir, res: StudyResults, quiet: bool = False) -> pathlib.Path:
    """Derive, then write results.json, results.csv, figures and report.md into ``out_dir``,
    each file whole or not at all (a second Ctrl-C while drawing leaves no half file)."""
    out = pathlib.Path(out_dir)
    analysis.derive(res)
    save_results(out, res)
    write_csv(out / "results.csv", res)
    names, note = figures.draw_all(res, out / "figures")
    write_text(out / "report.md", markdown(res, names, note))
    if not quiet:
        terminal_summary(res)
        print(f"report: {out / 'report.md'}")
    return out / "report.md"
