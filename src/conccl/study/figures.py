"""PNG figures in the spirit of the paper's Figures 5 to 10, drawn from derived study results."""
from __future__ import annotations

import pathlib

from ..strategy import PAPER_STRATEGIES
from ..planner.timing import ILL_CONDITIONED
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
    for fn in (efficiency_per_strategy, by_group, gemm_sm_loss, collective_ctas, memory_bandwidth, ideal_speedup):
        fig = fn(res, plt, prefix)
        if fig is None:
            continue
        name = fn.__name__ + ".png"
        fig.tight_layout()
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names, None


MARKERS = "osD^v<>pXh*"  # a distinct marker per series, so lines that coincide stay visible


def _label_bars(ax, bars, fmt: str, horizontal: bool = False, fontsize: int = 7) -> None:
    """Each bar's value printed at its end: the reader reads numbers, not bar heights."""
    for b in bars:
        v = b.get_width() if horizontal else b.get_height()
        if horizontal:
            ax.annotate(fmt.format(v), (b.get_x() + v, b.get_y() + b.get_height() / 2), xytext=(2, 0),
                        textcoords="offset points", va="center", fontsize=fontsize)
        else:
            ax.annotate(fmt.format(v), (b.get_x() + b.get_width() / 2, b.get_y() + v), xytext=(0, 2),
                        textcoords="offset points", ha="center", va="bottom", fontsize=fontsize)


def gemm_sm_loss(res, plt, prefix):
    """Small multiples, one panel per GEMM: its curve in colour over the others' in grey, so
    GEMMs with the same curve (a prediction gives one per GEMM class) are never hidden."""
    rows = res.gemm_sm_loss
    if not rows:
        return None
    gemms = list(dict.fromkeys(r.gemm for r in rows))
    curves = {g: sorted((r.sms_taken, r.slowdown) for r in rows if r.gemm == g and r.slowdown) for g in gemms}
    ncol = min(3, len(gemms))
    nrow = -(-len(gemms) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol, 2.4 * nrow + 0.6), sharex=True, sharey=True,
                             squeeze=False)
    mnk = {r.gemm: r.mnk for r in rows}
    for ax, g in zip(axes.flat, gemms):
        for other in gemms:
            if other != g:
                ax.plot(*zip(*curves[other]), color="0.85", lw=1, zorder=1)
        ax.plot(*zip(*curves[g]), color="tab:blue", marker="o", lw=2, zorder=2)
        ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
        ax.set_title(f"{g} {mnk[g]}", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(gemms):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("SMs taken", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("time / on all SMs", fontsize=8)
    fig.suptitle(prefix + "GEMM slowdown as SMs are taken away (grey: the other GEMMs)", fontsize=10)
    return fig


def collective_ctas(res, plt, prefix):
    rows = [r for r in res.coll_ctas if r.impl == "nccl" and r.ctas is not None and r.slowdown]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, key in enumerate(dict.fromkeys((r.collective, r.size) for r in rows)):
        pts = sorted((r.ctas, r.slowdown) for r in rows if (r.collective, r.size) == key)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=MARKERS[i % len(MARKERS)],
                label=f"{key[0]} {format_size(key[1])}")
    ax.set_xscale("log", base=2)
    ticks = sorted({r.ctas for r in rows})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
    ax.set_xlabel("CTAs (SMs) NCCL may use (max_ctas)")
    ax.set_ylabel("time / time with NCCL's default")
    ax.set_title(prefix + "Collective slowdown against the SMs it may use")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def memory_bandwidth(res, plt, prefix):
    """Two panels of labelled horizontal bars: each GEMM alone, and each collective size alone
    (NCCL beside conccl), against the measured HBM peak. Per GEMM and per size, not per
    scenario: 38 scenarios repeat the same few kernels."""
    ss = [s for s in res.scenarios if s.comm_hbm_bytes_per_s is not None]
    if not ss:
        return None
    gemm = {s.gemm.tag: s.gemm_hbm_bytes_per_s / 1e9 for s in ss}
    comm = {}
    for s in sorted(ss, key=lambda s: (s.collective, s.size)):
        comm[f"{s.collective} {format_size(s.size)}"] = (s.comm_hbm_bytes_per_s.get("nccl", 0) / 1e9,
                                                           s.comm_hbm_bytes_per_s.get("conccl", 0) / 1e9)
    height = 0.22 * (len(gemm) + 2 * len(comm)) + 1.5
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, height), gridspec_kw={"height_ratios": [len(gemm), 2 * len(comm)]})
    _label_bars(a1, a1.barh(list(gemm), list(gemm.values()), color="tab:blue"), "{:.0f}", horizontal=True)
    a1.set_title(prefix + "HBM bandwidth each kernel uses alone, GB/s", fontsize=10)
    a1.set_ylabel("GEMM (compulsory bytes)", fontsize=8)
    y = range(len(comm))
    h = 0.4
    _label_bars(a2, a2.barh([i - h / 2 for i in y], [v[0] for v in comm.values()], h, label="NCCL", color="tab:orange"),
                "{:.0f}", horizontal=True)
    _label_bars(a2, a2.barh([i + h / 2 for i in y], [v[1] for v in comm.values()], h, label="conccl",
                            color="tab:green"), "{:.0f}", horizontal=True)
    a2.set_yticks(list(y), list(comm))
    a2.set_ylabel("collective (logical bytes / time)", fontsize=8)
    hbm = res.peaks.hbm_bytes_per_s
    a1.set_ylim(len(gemm) - 0.5, -0.5)  # first on top, no empty rows
    a2.set_ylim(len(comm) - 0.5, -0.5)
    for ax in (a1, a2):
        ax.tick_params(axis="y", labelsize=7)
        if hbm:
            ax.axvline(hbm / 1e9, color="k", ls="--", lw=1, label=f"HBM peak {hbm / 1e9:.0f}")
        ax.set_xlim(0, 1.12 * max([hbm / 1e9 if hbm else 0, *gemm.values(), *(v for p in comm.values() for v in p)]))
    a2.set_xlabel("GB/s of this GPU's HBM")
    a2.legend(fontsize=7, loc="lower right")
    return fig


def ideal_speedup(res, plt, prefix):
    ss = [s for s in res.scenarios if s.ideal is not None]
    if not ss:
        return None
    fig, ax = plt.subplots(figsize=(max(7, 0.35 * len(ss)), 4))
    colors = {"G-long": "tab:blue", "C-long": "tab:orange", "GC-equal": "tab:green"}
    ax.bar(range(len(ss)), [s.ideal for s in ss], color=[colors[s.taxonomy] for s in ss])
    for tax, c in colors.items():  # legend entries for the colours, drawn or not
        ax.bar([0], [0], color=c, label=tax)
    ax.axhline(ILL_CONDITIONED, color="k", ls=":", lw=1,
               label=f"{ILL_CONDITIONED}x: below it, percent of ideal is ill-conditioned")
    ax.set_xticks(range(len(ss)), [s.id for s in ss], rotation=75, fontsize=6)
    ax.set_ylim(1, 2.05)  # 1: nothing to gain from overlap; 2: two equal kernels
    ax.set_ylabel("ideal speedup (1 = nothing to gain)")
    ax.set_title(prefix + "Ideal speedup per scenario, by taxonomy")
    ax.legend(fontsize=7, ncol=4, loc="upper left")
    return fig


def by_group(res, plt, prefix):
    """Efficiency (the headline, from 0) and speedup (bars from 1.0, the serial run) per
    strategy and (collective, taxonomy) group, each bar labelled."""
    groups = res.summary.groups
    if not groups:
        return None
    names = [n for n in PAPER_STRATEGIES if any(n in g.efficiency for g in groups.values())]
    keys = list(groups)
    w = 0.8 / max(1, len(names))
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(max(9, 1.6 * len(keys)), 7), sharex=True)
    for j, n in enumerate(names):
        xs = [i + j * w for i in range(len(keys))]
        eff = [groups[k].efficiency.get(n, 0) for k in keys]
        _label_bars(a1, a1.bar(xs, eff, w, label=n, color=f"C{j}"), "{:.0f}", fontsize=6)
        a2.bar(xs, [groups[k].speedup.get(n, 1) - 1 for k in keys], w, bottom=1.0, label=n, color=f"C{j}")
    for i, k in enumerate(keys):
        a2.hlines(groups[k].ideal, i - w / 2, i + 0.8 - w / 2, colors="k", lw=2)
    a1.axhline(100, color="k", lw=1, ls="--")
    a1.set_ylim(0, max(125, max(v for g in groups.values() for v in g.efficiency.values()) + 25))
    a1.set_ylabel("mean efficiency, % (100: fully hidden)")
    a1.set_title(prefix + "Efficiency and speedup per strategy, by collective and taxonomy", fontsize=10)
    a1.legend(fontsize=7, ncol=len(names), loc="upper center")  # above the 100% line, clear of the bars
    lo = min([1.0, *(v for g in groups.values() for v in g.speedup.values())])
    a2.axhline(1.0, color="0.4", lw=1)
    a2.set_ylim(lo - 0.05, max(g.ideal for g in groups.values()) + 0.1)
    a2.set_ylabel("speedup over serial\n(bars from 1.0 = serial; black: ideal)")
    a2.set_xticks([i + 0.4 - w / 2 for i in range(len(keys))], keys, fontsize=8)
    return fig


def efficiency_per_strategy(res, plt, prefix):
    """Suite means per strategy: efficiency (the headline) with percent of ideal beside it,
    never alone (it explodes where one kernel is much longer than the other)."""
    per = res.summary.strategies
    if not per:
        return None
    names = list(per)
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(max(8, 0.8 * len(names)), 4.2))
    w = 0.4
    _label_bars(ax, ax.bar([i - w / 2 for i in x], [per[n].mean_efficiency or 0 for n in names], w,
                           color="tab:blue", label="mean efficiency"), "{:.0f}")
    _label_bars(ax, ax.bar([i + w / 2 for i in x], [per[n].mean_pct_ideal for n in names], w, color="tab:purple",
                           alpha=0.45, hatch="//", label="mean % of ideal (the paper's)"), "{:.0f}")
    ax.axhline(72, color="gray", ls=":", label="paper's best, % of ideal (ConCCL_rp, 72%)")
    ax.axhline(100, color="k", ls="--", lw=1)
    ax.set_xticks(list(x), names, fontsize=8, rotation=30)
    ax.set_ylim(min(0, min(per[n].mean_pct_ideal for n in names) - 5),
                max(125, max(max(per[n].mean_pct_ideal, per[n].mean_efficiency or 0) for n in names) + 25))
    ax.set_ylabel("percent")
    ax.set_title(prefix + "Efficiency per strategy (suite mean), percent of ideal beside it")
    ax.legend(fontsize=7, loc="upper center", ncol=3)  # above the 100% line, clear of the bars
    return fig
