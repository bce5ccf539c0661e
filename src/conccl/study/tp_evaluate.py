"""How well the tensor-parallel planner (:mod:`conccl.planner.tp`) predicts, against one GPU's
measurements (``conccl plan tp --evaluate``).

Two questions, per shape of a ``conccl bench tp`` run on one GPU (each schedule's GEMM steps
timed alone: the decomposition) and the characterization the model reads:

- **error**: the model's decomposition time for each schedule against the measured one, once
  with the shape's own measurements in the model and once *without* them (the shape unseen:
  the nearest measured M of the same weight, or the tile-wave model);
- **auto's loss**: the schedule ``auto`` picks for a ``world``-rank pipeline when the shape is
  unseen, timed with the measured decomposition and the model's transfers, against the best
  schedule so timed (the issue's goal: at most 2% more).
"""
from __future__ import annotations

import dataclasses
import statistics

from ..schedule.pipeline import TPSchedule
from ..planner import tp as tpp


def evaluate(bench: dict, model: tpp.TPModel, world: int = 2) -> dict:
    """``bench``: a one-GPU ``tp.json``; returns {"rows": [...], "summary": {...}}."""
    measured: dict = {}
    for r in bench["results"]:
        if r["impl"] == "conccl" and r["ms"] and r["world"] == 1:
            measured.setdefault((r["op"], r["M"], r["K"], r["N"]), {})[r["schedule"]] = r["ms"] / 1e3
    rows = []
    for (op, M, K, N), by_sched in sorted(measured.items()):
        unseen = tpp.without(model, M, K, N)
        errs, errs_unseen = [], []
        for name, meas in by_sched.items():
            tp = TPSchedule.parse(name)
            errs.append(tpp.decomposition_s(model, op, tp, M, K, N, world) / meas - 1)
            errs_unseen.append(tpp.decomposition_s(unseen, op, tp, M, K, N, world) / meas - 1)
        # Every schedule measured, timed as a pipeline: measured GEMM steps scaled into the model.
        def timed(name, m=model):
            tp = TPSchedule.parse(name)
            scale = by_sched[name] / tpp.decomposition_s(m, op, tp, M, K, N, world)
            return tpp.predict(dataclasses.replace(m, gemm_scale=scale), op, tp, M, K, N, world)
        best = min(by_sched, key=timed)
        pick = min(by_sched, key=lambda n: tpp.predict(unseen, op, TPSchedule.parse(n), M, K, N, world))
        rows.append({"op": op, "M": M, "K": K, "N": N, "schedules": len(by_sched),
                     "error_mean": statistics.mean(map(abs, errs)), "error_max": max(map(abs, errs)),
                     "error_unseen_mean": statistics.mean(map(abs, errs_unseen)),
                     "error_unseen_max": max(map(abs, errs_unseen)),
                     "best": best, "auto_unseen": pick, "auto_loss": timed(pick) / timed(best) - 1})
    summary = {}
    if rows:
        summary = {"shapes": len(rows), "error_mean": statistics.mean(r["error_mean"] for r in rows),
                   "error_unseen_mean": statistics.mean(r["error_unseen_mean"] for r in rows),
                   "auto_loss_max": max(r["auto_loss"] for r in rows),
                   "within_2pct": sum(r["auto_loss"] <= 0.02 for r in rows)}
    return {"world": world, "rows": rows, "summary": summary}


def markdown(ev: dict) -> str:
    lines = [f"# The tensor-parallel planner against one GPU's measurements (pipelines of {ev['world']} ranks)", "",
             "error: the model's GEMM-step time of each schedule against the measured one (mean |error| over "
             "schedules; seen: the shape's own measurements in the model; unseen: without them). auto (unseen): "
             "the pick for an unseen shape, its measured decomposition with the model's transfers, against the "
             "best schedule so timed.", "",
             "| op | M x K x N | schedules | error seen | error unseen (max) | best | auto (unseen) | auto's loss |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in ev["rows"]:
        lines.append(f"| {r['op']} | {r['M']}x{r['K']}x{r['N']} | {r['schedules']} | {100 * r['error_mean']:.1f}% | "
                     f"{100 * r['error_unseen_mean']:.1f}% ({100 * r['error_unseen_max']:.1f}%) | {r['best']} | "
                     f"{r['auto_unseen']} | {100 * r['auto_loss']:.1f}% |")
    s = ev["summary"]
    if s:
        lines += ["", f"{s['shapes']} shapes: mean error {100 * s['error_mean']:.1f}% seen, "
                      f"{100 * s['error_unseen_mean']:.1f}% unseen; auto within 2% of the best in {s['within_2pct']} "
                      f"of {s['shapes']} (worst {100 * s['auto_loss_max']:.1f}%)."]
    return "\n".join(lines) + "\n"


def evaluate_pipelines(bench: dict, model: tpp.TPModel) -> dict:
    """``bench``: a ``tp.json`` of several GPUs (every schedule run as a whole pipeline); for
    each shape: the model's ratio to the GEMM alone against the measured one per schedule, the
    schedule the model ranks first among those measured against the measured best, and the
    live ``conccl_auto`` run against the best schedule, serial NCCL and PyTorch's async-TP
    (the TP study's goals). Returns {"world", "rows", "summary"}."""
    shapes: dict = {}
    for r in bench["results"]:
        if r.get("ratio_to_gemm") and not r.get("error") and r["world"] >= 2:
            shapes.setdefault((r["op"], r["M"], r["K"], r["N"], r["world"]), []).append(r)
    rows = []
    for (op, M, K, N, world), recs in sorted(shapes.items()):
        sched = {r["schedule"]: r["ratio_to_gemm"] for r in recs if r["impl"] == "conccl"}
        other = {r["impl"]: r["ratio_to_gemm"] for r in recs if r["impl"] != "conccl"}
        if not sched:
            continue
        gemm = model.gemm_s(M, K, N)
        predicted = {n: tpp.predict(model, op, TPSchedule.parse(n), M, K, N, world) / gemm for n in sched}
        best = min(sched, key=sched.get)
        pick = min(sched, key=predicted.get)
        rival = min((other[k] for k in ("serial_nccl", "torch_async_tp") if k in other), default=None)
        auto = other.get("conccl_auto")
        rows.append({"op": op, "M": M, "K": K, "N": N, "world": world, "schedules": len(sched),
                     "error_mean": statistics.mean(abs(predicted[n] / sched[n] - 1) for n in sched),
                     "best": best, "best_ratio": sched[best], "model_pick": pick,
                     "model_pick_loss": sched[pick] / sched[best] - 1,
                     "auto_ratio": auto, "auto_vs_best": None if auto is None else auto / sched[best] - 1,
                     "rival_ratio": rival, "auto_vs_rival": None if auto is None or rival is None else auto / rival - 1})
    summary = {}
    if rows:
        live = [r for r in rows if r["auto_vs_best"] is not None]
        summary = {"shapes": len(rows), "error_mean": statistics.mean(r["error_mean"] for r in rows),
                   "model_pick_within_3pct": sum(r["model_pick_loss"] <= 0.03 for r in rows),
                   "auto_within_3pct": sum(r["auto_vs_best"] <= 0.03 for r in live), "auto_shapes": len(live),
                   "auto_not_slower_than_rival": sum(r["auto_vs_rival"] is not None and r["auto_vs_rival"] <= 0
                                                     for r in live)}
    return {"world": rows[0]["world"] if rows else None, "rows": rows, "summary": summary}


def pipelines_markdown(ev: dict) -> str:
    def pct(v):
        return "" if v is None else f"{100 * v:+.1f}%"

    lines = [f"# The tensor-parallel planner against whole pipelines on {ev['world']} GPUs", "",
             "Ratios to the GEMM alone. error: the model's ratio of each measured schedule against the measured "
             "one (mean |error|). model's pick: the measured schedule the model ranks first, its loss against the "
             "measured best. auto: the live `conccl_auto` run, against the best schedule and against the faster "
             "of serial NCCL and PyTorch's async-TP (rival). At two ranks `ring` and `direct` are one pipeline "
             "(one peer): what separates their measurements is the run's noise.", "",
             "| op | M x K x N | error | best | model's pick (loss) | auto | auto vs best | rival | auto vs rival |",
             "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in ev["rows"]:
        auto = "" if r["auto_ratio"] is None else f"{r['auto_ratio']:.3f}"
        rival = "" if r["rival_ratio"] is None else f"{r['rival_ratio']:.3f}"
        lines.append(f"| {r['op']} | {r['M']}x{r['K']}x{r['N']} | {100 * r['error_mean']:.1f}% | {r['best']} "
                     f"{r['best_ratio']:.3f} | {r['model_pick']} ({pct(r['model_pick_loss'])}) | {auto} | "
                     f"{pct(r['auto_vs_best'])} | {rival} | {pct(r['auto_vs_rival'])} |")
    s = ev["summary"]
    if s:
        lines += ["", f"{s['shapes']} shapes: mean error {100 * s['error_mean']:.1f}%; the model's pick within 3% of "
                      f"the best on {s['model_pick_within_3pct']}; the live auto within 3% of the best on "
                      f"{s['auto_within_3pct']} of {s['auto_shapes']} and not slower than the rival on "
                      f"{s['auto_not_slower_than_rival']} of {s['auto_shapes']}."]
    return "\n".join(lines) + "\n"
