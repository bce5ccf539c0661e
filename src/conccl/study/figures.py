"""PNG figures in the spirit of the paper's Figures 5 to 10, drawn from derived study results."""
from __future__ import annotations

import pathlib

from ..strategy import PAPER_STRATEGIES
from ..units import format_size
from .results import StudyResults


def draw_all(res: StudyResults, folder) -> tuple[list[str], str | None]:
    """Draw every figure the results have data for; (file names, note for the report)."""
    try:
        # Optional, and slow to import: loaded only when figures are drawn.
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], ("Figures not drawn: matplotlib is not installed here. Run `conccl study --report DIR` "
                    "where it is to draw them from results.json.")
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    prefix = "PREDICTION - " if res.kind == "prediction" else ""
    names = []
    for fn in (gemm_sm_loss, collective_ctas, memory_bandwidth, ideal_speedup, speedup_by_group, percent_of_ideal):
        fig = fn(res, plt, prefix)
        if fig is None:
            continue
        name = fn.__name__ + ".png"
        fig.tight_layout()
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names, None


def gemm_sm_loss(res, plt, prefix):
    rows = res.gemm_sm_loss
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for g in dict.fromkeys(r.gemm for r in rows):
        pts = sorted((r.sms_taken, r.slowdown) for r in rows if r.gemm == g and r.slowdown)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=g)
    ax.set_xlabel("SMs taken from the GEMM (green context)")
    ax.set_ylabel("GEMM time / time on all SMs")
    ax.set_title(prefix + "GEMM slowdown as SMs are taken away")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    return fig


def collective_ctas(res, plt, prefix):
    rows = [r for r in res.coll_ctas if r.impl == "nccl" and r.ctas is not None and r.slowdown]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in dict.fromkeys((r.collective, r.size) for r in rows):
        pts = sorted((r.ctas, r.slowdown) for r in rows if (r.collective, r.size) == key)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{key[0]} {format_size(key[1])}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("CTAs (SMs) NCCL may use (max_ctas)")
    ax.set_ylabel("time / time with NCCL's default")
    ax.set_title(prefix + "Collective slowdown against the SMs it may use")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def memory_bandwidth(res, plt, prefix):
    ss = [s for s in res.scenarios if s.comm_hbm_bytes_per_s is not None]
    if not ss:
        return None
    fig, ax = plt.subplots(figsize=(max(7, 0.35 * len(ss)), 4))
    x = range(len(ss))
    w = 0.28
    ax.bar([i - w for i in x], [s.gemm_hbm_bytes_per_s / 1e9 for s in ss], w, label="GEMM (compulsory bytes)")
    ax.bar(list(x), [s.comm_hbm_bytes_per_s.get("nccl", 0) / 1e9 for s in ss], w, label="NCCL")
    ax.bar([i + w for i in x], [s.comm_hbm_bytes_per_s.get("conccl", 0) / 1e9 for s in ss], w, label="conccl")
    hbm = res.peaks.hbm_bytes_per_s
    if hbm:
        ax.axhline(hbm / 1e9, color="k", ls="--", lw=1, label="HBM peak (measured)")
    ax.set_xticks(list(x), [s.id for s in ss], rotation=75, fontsize=6)
    ax.set_ylabel("GB/s of this GPU's HBM")
    ax.set_title(prefix + "Memory bandwidth each kernel uses alone")
    ax.legend(fontsize=7)
    return fig


def ideal_speedup(res, plt, prefix):
    ss = [s for s in res.scenarios if s.ideal is not None]
    if not ss:
        return None
    fig, ax = plt.subplots(figsize=(max(7, 0.35 * len(ss)), 4))
    colors = {"G-long": "tab:blue", "C-long": "tab:orange", "GC-equal": "tab:green"}
    ax.bar(range(len(ss)), [s.ideal for s in ss], color=[colors[s.taxonomy] for s in ss])
    ax.set_xticks(range(len(ss)), [s.id for s in ss], rotation=75, fontsize=6)
    ax.set_ylim(1, 2.05)
    ax.set_ylabel("ideal speedup")
    ax.set_title(prefix + "Ideal speedup per scenario (blue G-long, orange C-long, green GC-equal)")
    return fig


def speedup_by_group(res, plt, prefix):
    groups = res.summary.groups
    if not groups:
        return None
    names = [n for n in PAPER_STRATEGIES if any(n in g.speedup for g in groups.values())]
    fig, ax = plt.subplots(figsize=(9, 4))
    keys = list(groups)
    w = 0.8 / max(1, len(names))
    for j, n in enumerate(names):
        ax.bar([i + j * w for i in range(len(keys))], [groups[k].speedup.get(n, 0) for k in keys], w, label=n)
    for i, k in enumerate(keys):
        ax.hlines(groups[k].ideal, i - w / 2, i + 0.8 - w / 2, colors="k", lw=2)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(keys))], keys, fontsize=8)
    ax.set_ylim(bottom=min(0.9, min((v for g in groups.values() for v in g.speedup.values()), default=1) - 0.05))
    ax.set_ylabel("speedup over serial (black: ideal)")
    ax.set_title(prefix + "Speedup per strategy, by collective and taxonomy")
    ax.legend(fontsize=7, ncol=3)
    return fig


def percent_of_ideal(res, plt, prefix):
    per = res.summary.strategies
    if not per:
        return None
    names = list(per)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(names, [per[n].mean_pct_ideal for n in names], color="tab:purple")
    ax.axhline(72, color="gray", ls=":", label="paper's best (ConCCL_rp, 72%)")
    ax.axhline(90, color="k", ls="--", label="project goal (90%)")
    ax.set_ylabel("mean % of ideal speedup")
    ax.set_title(prefix + "Percent of ideal per strategy (suite mean)")
    ax.tick_params(axis="x", labelsize=8, rotation=30)
    ax.legend(fontsize=8)
    return fig
