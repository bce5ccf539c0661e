"""``conccl plan --evaluate``: the planner's choices against the best a study measured.

For every scenario of a measured study, the planner picks a plan from the profile alone (it
never sees the scenario's measured times); the study's measured time of that strategy and SM
split is compared with the fastest measured run of any strategy the runtime can apply. A pick
within 2% of the best counts as the best. Scenarios the profile was fitted on (its reference
GEMMs') are reported apart; the goal is judged on the others.
"""
from __future__ import annotations

import statistics

from ..planner import plan_auto, workload
from ..planner.profile import HardwareProfile
from ..strategy import STRATEGIES
from . import analysis, metrics
from .results import ScenarioResult, StudyResults

WITHIN = 0.02  # a pick within 2% of the best measured time counts as the best
GOAL_BEST, GOAL_LOSS = 90.0, 3.0  # percent of scenarios; worst loss, percent
AUTO_GOAL_IDEAL, AUTO_GOAL_BEST = 90.0, 95.0  # plan="auto" measured: % of ideal; % of the best speedup


def _runs(s: ScenarioResult):
    """(strategy, sms, seconds) of every measured run the runtime could apply."""
    for name, runs in s.runs.items():
        st = STRATEGIES.get(name)
        if st is None or not st.runtime_applies:
            continue
        for r in runs:
            yield name, r.sms, r.time_ms.median / 1e3


def evaluate(res: StudyResults, p: HardwareProfile) -> dict:
    """The planner's pick for every scenario of a measured, derived study, judged against its runs."""
    if res.kind != "measured":
        raise ValueError("evaluate a measured study (its results.json), not a prediction")
    analysis.derive(res)  # a version-1 or -2 file lacks the efficiency fields
    fitted = set(p.source.get("fit_scenarios") or [])
    world = res.world
    rows = []
    for s in res.scenarios:
        runs = list(_runs(s))
        if not runs:
            continue
        g = s.gemm
        pl = plan_auto(p, workload((g.m, g.n, g.k), s.collective, s.size, world))
        best = min(runs, key=lambda r: r[2])
        picked = [r for r in runs if r[0] == pl.strategy and r[1] == pl.sms]
        row = {"id": s.id, "fitted": s.id in fitted, "taxonomy": s.taxonomy,
               "plan": pl.strategy, "plan_sms": pl.sms, "best": best[0], "best_sms": best[1],
               "best_s": best[2], "predicted_s": pl.predicted["concurrent_s"]}
        if picked:
            t = picked[0][2]
            row.update(plan_s=t, loss_pct=100 * (t / best[2] - 1), is_best=t <= best[2] * (1 + WITHIN))
        else:
            row.update(plan_s=None, loss_pct=None, is_best=None)
        if s.ideal is not None:
            tn, tg = s.t_comm["nccl"].median / 1e3, s.t_gemm.median / 1e3
            for key, t in (("plan", row["plan_s"]), ("best", best[2])):
                row[f"{key}_pct_ideal"] = None if t is None else 100 * ((tg + tn) / t - 1) / (s.ideal - 1)
                row[f"{key}_efficiency"] = None if t is None else _efficiency(s, t)
        auto = s.runs.get("auto")
        if auto:  # the study also ran plan="auto" through the runtime
            row["auto_measured_s"] = t_auto = auto[0].time_ms.median / 1e3
            row["auto_plan"] = auto[0].plan
            row["auto_pct_of_best"] = 100 * best[2] / t_auto
            if s.ideal is not None:
                row["auto_pct_ideal"] = 100 * ((tg + tn) / t_auto - 1) / (s.ideal - 1)
                row["auto_efficiency"] = _efficiency(s, t_auto)
        turns = s.auto_in_turns
        if turns:  # auto and the fastest strategy timed again, in turns (study/measure.py)
            t_auto, t_best = turns.auto_ms.median / 1e3, turns.best_ms.median / 1e3
            row.update(turns_best=turns.strategy, turns_best_sms=turns.sms, turns_best_s=t_best,
                       turns_auto_s=t_auto, turns_pct_of_best=100 * t_best / t_auto)
            if s.ideal is not None:
                row["turns_pct_ideal"] = 100 * ((tg + tn) / t_auto - 1) / (s.ideal - 1)
                row["turns_efficiency"] = _efficiency(s, t_auto)
            if auto and (auto[0].plan, auto[0].sms) == (pl.strategy, pl.sms):
                # The study's auto ran this very pick: its head-to-head with the fastest strategy
                # judges the pick free of what ran before each block (back to back: up to 8%).
                row["turns_loss_pct"] = max(0.0, 100 * (t_auto / t_best - 1))
        rows.append(row)
    return {"rows": rows, "held_out": _summary([r for r in rows if not r["fitted"]]),
            "fitted": _summary([r for r in rows if r["fitted"]]), "all": _summary(rows),
            "profile": {"device": p.device, "world": p.world, **p.source},
            "study": {k: res.meta.get(k) for k in ("date", "commit", "machine_kind")}}


def _efficiency(s: ScenarioResult, t_s: float) -> float:
    return metrics.efficiency(s.t_gemm.median, s.t_comm_best, 1e3 * t_s)


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(vals) if vals else None


def _summary(rows: list[dict]) -> dict:
    judged = [r for r in rows if r["is_best"] is not None]
    if not judged:
        return {"n": len(rows), "judged": 0}
    losses = [r["loss_pct"] for r in judged]
    pct = [r["plan_pct_ideal"] for r in judged if r.get("plan_pct_ideal") is not None]
    best = [r["best_pct_ideal"] for r in judged if r.get("best_pct_ideal") is not None]
    n_best = sum(r["is_best"] for r in judged)
    out = {"n": len(rows), "judged": len(judged), "n_best": n_best, "pct_best": 100 * n_best / len(judged),
           "max_loss_pct": max(losses), "mean_loss_pct": statistics.fmean(losses),
           "mean_plan_pct_ideal": statistics.fmean(pct) if pct else None,
           "mean_best_pct_ideal": statistics.fmean(best) if best else None,
           "mean_plan_efficiency": _mean(judged, "plan_efficiency"), "mean_best_efficiency": _mean(judged, "best_efficiency"),
           "not_measured": [r["id"] for r in rows if r["is_best"] is None]}
    out["goal_met"] = out["pct_best"] >= GOAL_BEST and out["max_loss_pct"] <= GOAL_LOSS
    picks = [r["turns_loss_pct"] for r in rows if "turns_loss_pct" in r]
    if picks:
        n_in = sum(x <= 100 * WITHIN for x in picks)
        out["picks_in_turns"] = {"n": len(picks), "n_best": n_in, "pct_best": 100 * n_in / len(picks),
                                 "max_loss_pct": max(picks)}
        out["picks_in_turns"]["goal_met"] = 100 * n_in / len(picks) >= GOAL_BEST and max(picks) <= GOAL_LOSS
    auto = [r for r in rows if "auto_pct_of_best" in r]
    if auto:
        out["auto"] = {"n": len(auto), "mean_pct_of_best": statistics.fmean(r["auto_pct_of_best"] for r in auto),
                       "min_pct_of_best": min(r["auto_pct_of_best"] for r in auto),
                       "mean_pct_ideal": statistics.fmean(r["auto_pct_ideal"] for r in auto if "auto_pct_ideal" in r),
                       "mean_efficiency": _mean(auto, "auto_efficiency")}
    turns = [r for r in rows if "turns_pct_of_best" in r]
    if turns:
        out["auto_in_turns"] = {
            "n": len(turns), "mean_pct_of_best": statistics.fmean(r["turns_pct_of_best"] for r in turns),
            "min_pct_of_best": min(r["turns_pct_of_best"] for r in turns),
            "mean_pct_ideal": statistics.fmean(r["turns_pct_ideal"] for r in turns if "turns_pct_ideal" in r),
            "mean_efficiency": _mean(turns, "turns_efficiency")}
        a = out["auto_in_turns"]
        a["goal_met"] = a["mean_pct_ideal"] >= AUTO_GOAL_IDEAL and a["min_pct_of_best"] >= AUTO_GOAL_BEST
    return out


def markdown(ev: dict) -> str:
    def f(v, fmt="{:.3f}"):
        return "-" if v is None else fmt.format(v)

    lines = ["# Planner accuracy", "",
             f"Profile: {ev['profile'].get('device')} x{ev['profile'].get('world')}, measured "
             f"{ev['profile'].get('date')} (commit {ev['profile'].get('commit')}); fitted on "
             f"{', '.join(ev['profile'].get('reference_gemms') or []) or 'nothing'}.",
             f"Study evaluated: {ev['study'].get('machine_kind')}, {ev['study'].get('date')}, commit "
             f"{ev['study'].get('commit')}.", "",
             f"A pick counts as the best within {100 * WITHIN:.0f}% of the best measured run. Goal: the best in "
             f">= {GOAL_BEST:.0f}% of held-out scenarios, never more than {GOAL_LOSS:.0f}% lost.", "",
             f"Efficiency = max(t_gemm, fastest collective alone) / t_concurrent; percent of ideal (the paper's) "
             f"beside it is ill-conditioned where the ideal speedup is below {metrics.ILL_CONDITIONED}x.", "",
             "| set | scenarios | best picked | worst loss | mean loss | plan efficiency | best efficiency | "
             "plan % of ideal | best % of ideal | goal |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    picks = [(label, ev[key]["picks_in_turns"]) for key, label in
             (("held_out", "held out (judged)"), ("fitted", "fitted on"), ("all", "all")) if ev[key].get("picks_in_turns")]
    for key, label in (("held_out", "held out (judged)"), ("fitted", "fitted on"), ("all", "all")):
        s = ev[key]
        if not s.get("judged"):
            lines.append(f"| {label} | {s['n']} | - | - | - | - | - | - | - | - |")
            continue
        # Where the picks were also timed in turns, the goal is judged there (the next table):
        # back to back, a pick's time depends on what ran before it.
        goal = "judged in turns, below" if picks else ("met" if s["goal_met"] else "NOT met")
        lines.append(f"| {label} | {s['judged']} | {s['n_best']} ({s['pct_best']:.0f}%) | {s['max_loss_pct']:.1f}% | "
                     f"{s['mean_loss_pct']:.2f}% | {f(s['mean_plan_efficiency'], '{:.1f}%')} | "
                     f"{f(s['mean_best_efficiency'], '{:.1f}%')} | {f(s['mean_plan_pct_ideal'], '{:.1f}')} | "
                     f"{f(s['mean_best_pct_ideal'], '{:.1f}')} | {goal} |")
    if picks:
        lines += ["", "Judged in turns instead, where the study's `auto` ran this profile's pick: its head-to-head with "
                  "the fastest strategy (below), free of what ran just before each block.", "",
                  "| set | scenarios | best picked | worst loss | goal |", "|---|---:|---:|---:|---|"]
        for label, a in picks:
            lines.append(f"| {label} | {a['n']} | {a['n_best']} ({a['pct_best']:.0f}%) | {a['max_loss_pct']:.1f}% | "
                         f"{'met' if a['goal_met'] else 'NOT met'} |")
    autos = [(label, ev[key]["auto"]) for key, label in (("held_out", "held out"), ("fitted", "fitted on"), ("all", "all"))
             if ev[key].get("auto")]
    if autos:
        lines += ["", "## plan='auto' run through the runtime (conccl.overlap), measured in the same study", "",
                  f"Goal (all scenarios): >= {AUTO_GOAL_IDEAL:.0f}% of the ideal speedup on average and >= "
                  f"{AUTO_GOAL_BEST:.0f}% of the best strategy's speedup.", "",
                  "| set | scenarios | mean efficiency | mean % of ideal | best time / auto time: mean | min |",
                  "|---|---:|---:|---:|---:|---:|"]
        for label, a in autos:
            lines.append(f"| {label} | {a['n']} | {f(a['mean_efficiency'], '{:.1f}%')} | {a['mean_pct_ideal']:.1f} | "
                         f"{a['mean_pct_of_best']:.1f}% | {a['min_pct_of_best']:.1f}% |")
    turns = [(label, ev[key]["auto_in_turns"]) for key, label in
             (("held_out", "held out"), ("fitted", "fitted on"), ("all", "all")) if ev[key].get("auto_in_turns")]
    if turns:
        lines += ["", "### The same, `auto` and the fastest strategy timed again in turns", "",
                  "Back to back, a configuration's time depends on what ran just before it; in turns, both see "
                  "the same conditions. The goal is judged on this comparison (the row *all*).", "",
                  "| set | scenarios | mean efficiency | mean % of ideal | best time / auto time: mean | min | goal |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        for label, a in turns:
            lines.append(f"| {label} | {a['n']} | {f(a['mean_efficiency'], '{:.1f}%')} | {a['mean_pct_ideal']:.1f} | "
                         f"{a['mean_pct_of_best']:.1f}% | {a['min_pct_of_best']:.1f}% | "
                         f"{'met' if a['goal_met'] else 'NOT met'} |")
    has_auto = any("auto_measured_s" in r for r in ev["rows"])
    has_turns = any("turns_auto_s" in r for r in ev["rows"])
    lines += ["", "| scenario | set | planned | measured (ms) | best | best (ms) | loss | predicted (ms) |"
              + (" auto run (ms) |" if has_auto else "") + (" in turns: best / auto (ms) |" if has_turns else ""),
              "|---|---|---|---:|---|---:|---:|---:|" + ("---:|" if has_auto else "") + ("---:|" if has_turns else "")]
    for r in ev["rows"]:
        plan = r["plan"] + (f" ({r['plan_sms']} SMs)" if r["plan_sms"] else "")
        best = r["best"] + (f" ({r['best_sms']} SMs)" if r["best_sms"] else "")
        loss = "not measured" if r["loss_pct"] is None else f"{r['loss_pct']:.1f}%" + ("" if r["is_best"] else " **")
        line = (f"| {r['id']} | {'fitted' if r['fitted'] else 'held out'} | {plan} | {f(r['plan_s'] and 1e3 * r['plan_s'])} "
                f"| {best} | {1e3 * r['best_s']:.3f} | {loss} | {1e3 * r['predicted_s']:.3f} |")
        if has_auto:
            line += f" {f(r.get('auto_measured_s') and 1e3 * r['auto_measured_s'])} |"
        if has_turns:
            line += (f" {1e3 * r['turns_best_s']:.3f} / {1e3 * r['turns_auto_s']:.3f} |" if "turns_auto_s" in r
                     else " - |")
        lines.append(line)
    lines += ["", "`**`: not within 2% of the best."]
    return "\n".join(lines) + "\n"
