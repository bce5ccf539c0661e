"""The tensor-parallel characterization as a person reads it: a markdown table and one figure."""
from __future__ import annotations

import pathlib

from .tp_measure import TPCharacterization


def _shapes(char: TPCharacterization):
    seen = []
    for t in char.timings:
        if (t.M, t.K, t.N) not in seen:
            seen.append((t.M, t.K, t.N))
    return seen


def _chunks(char: TPCharacterization):
    return sorted({t.chunks for t in char.timings})


def markdown(char: TPCharacterization) -> str:
    """One table per variant: the loss (chunks' time over the whole GEMM's) per shape and grain,
    the best grain above 1 marked."""
    chunks = _chunks(char)
    meta = char.meta
    lines = [f"# Tensor-parallel GEMM losses ({char.dtype}, {meta.get('device', '?')})", "",
             f"Machine kind {meta.get('machine_kind', '?')}, {meta.get('date', '?')}, commit "
             f"{str(meta.get('commit', '?'))[:12]}, torch {meta.get('torch', '?')}.", "",
             "Each cell: the GEMM cut into that many equal row chunks, their total time over the whole "
             "GEMM's (1.00x: no loss). Median of the timed runs; the whole GEMM's time in ms.", ""]
    titles = {"rows": "Decomposition loss (chunks back to back, one stream)",
              "two_streams": "Chunks alternating over two streams",
              "ce": f"Decomposition + contention (a copy engine moving a world-{char.world} pipeline's bytes "
                    "beside, as same-GPU copies: over-states the contention)"}
    for variant, title in titles.items():
        if not any(t.variant == variant for t in char.timings):
            continue
        lines += [f"## {title}", "", "| M x K x N | whole (ms) | " + " | ".join(str(c) for c in chunks if c > 1) + " |",
                  "| --- | --- | " + " | ".join("---" for c in chunks if c > 1) + " |"]
        for (M, K, N) in _shapes(char):
            whole = char._get(M, K, N, 1, "rows")
            if whole is None:
                continue
            losses = {c: char.loss(M, K, N, c, variant) for c in chunks if c > 1}
            best = min((v for v in losses.values() if v is not None), default=None)
            cells = []
            for c in chunks:
                if c == 1:
                    continue
                v = losses[c]
                cells.append("" if v is None else (f"**{v:.2f}x**" if v == best else f"{v:.2f}x"))
            lines.append(f"| {M} x {K} x {N} | {whole.total_ms:.3f} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def figure(char: TPCharacterization, path: pathlib.Path) -> pathlib.Path:
    """Loss against the number of chunks, one line per shape (one panel per variant)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = [v for v in ("rows", "two_streams", "ce") if any(t.variant == v for t in char.timings)]
    fig, axes = plt.subplots(1, len(variants), figsize=(5.5 * len(variants), 4.2), sharey=True, squeeze=False)
    chunks = [c for c in _chunks(char) if c > 1]
    for ax, variant in zip(axes[0], variants):
        for (M, K, N) in _shapes(char):
            ys = [char.loss(M, K, N, c, variant) for c in chunks]
            xs = [c for c, y in zip(chunks, ys) if y is not None]
            ax.plot(xs, [y for y in ys if y is not None], marker="o", ms=3, label=f"{M}x{K}x{N}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(chunks, [str(c) for c in chunks])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xlabel("row chunks")
        ax.set_title({"rows": "decomposition loss", "two_streams": "chunks on two streams",
                      "ce": "with copies beside (over-stated)"}[variant])
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("chunks' time / whole GEMM")
    axes[0][-1].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
