"""Tensor parallelism's two losses, measured on one GPU (``conccl study tp``).

A tensor-parallel layer overlaps its collective with its own GEMM only by cutting the GEMM
into pieces that start as their rows land (all-gather + GEMM) or leave as they are computed
(GEMM + reduce-scatter). FiCCO (arXiv 2512.10236) names what that costs:

- the **decomposition loss**: ``c`` GEMMs of ``M / c`` rows take longer than one of ``M`` rows
  (tile waves that no longer fill the GPU, another cuBLAS kernel, a weight read ``c`` times);
- the **contention loss**: the copies beside a GEMM piece slow it (HBM, and L2).

Both need no peer, so one GPU measures them for every shape and grain a pipeline could use.
What is measured (bf16 unless asked; CUDA events; warm-ups, then ``runs`` timed repetitions;
median and spread):

- ``row_ms[c]``: the GEMM cut into ``c`` equal row chunks written into slices of one output,
  back to back on one stream, per chunk (so ``c * row_ms[c] / row_ms[1]`` is the loss);
- ``two_streams_ms[c]``: the same chunks alternating over two streams (a chunk's last, partly
  filled wave shares the GPU with the next chunk's first): one way to lower the loss;
- ``ce_ms[c]``: the same chunks while a copy engine moves the bytes a world-``world`` pipeline
  would move per chunk, on a second stream (a same-GPU copy here: it reads and writes this
  GPU's HBM, where an NVLink transfer only writes it, at ~4x the NVLink rate; so it over-states
  the contention loss, and the two-GPU benchmark measures the real one).

Every timing is one record; a :class:`TPCharacterization` holds them with the machine it ran on
and is what the hardware profile's ``tp`` table is made from (:func:`profile_table`).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

from ..bench.timing import HOST_AHEAD_CYCLES

FORMAT = "conccl-tp-characterization/1"

# Shapes (M rows gathered, K, N) that tensor-parallel layers of common models run, the issue's
# first: Llama-3 70B at TP 8 (gate+up, down), 8B at TP 2, and larger and decode-sized ones.
DEFAULT_SHAPES = (
    (8192, 8192, 7168), (8192, 3584, 8192), (8192, 4096, 14336), (8192, 8192, 14336), (1024, 8192, 7168),
    (16384, 8192, 14336), (4096, 8192, 8192), (32768, 4096, 7168), (16384, 8192, 7168), (8192, 7168, 4096),
    (2048, 8192, 7168), (4096, 4096, 14336),
)
DEFAULT_CHUNKS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


@dataclass(frozen=True)
class Timing:
    """One measured configuration: ``ms`` per chunk (median over runs) and its spread."""

    M: int
    K: int
    N: int
    chunks: int
    variant: str  # "rows" | "two_streams" | "ce"
    ms: float  # per chunk
    ms_spread: float  # (max - min) / median over the timed runs
    total_ms: float  # all chunks, median

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; known: {', '.join(VARIANTS)}")
        if not (self.ms > 0 and self.total_ms > 0 and self.chunks >= 1):
            raise ValueError(f"a timing must be positive: {self}")


VARIANTS = ("rows", "two_streams", "ce")


@dataclass(frozen=True)
class TPCharacterization:
    dtype: str
    world: int  # the world size the contention copies stand for
    timings: tuple
    meta: dict = field(default_factory=dict)
    format: str = FORMAT

    def to_dict(self) -> dict:
        return {"format": self.format, "dtype": self.dtype, "world": self.world, "meta": self.meta,
                "timings": [asdict(t) for t in self.timings]}

    @classmethod
    def from_dict(cls, data: dict) -> "TPCharacterization":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        return cls(data["dtype"], int(data["world"]), tuple(Timing(**t) for t in data["timings"]),
                   dict(data.get("meta", {})))

    def loss(self, M: int, K: int, N: int, chunks: int, variant: str = "rows") -> float | None:
        """Decomposition (or, for "ce", decomposition and contention) loss: all chunks' time
        over the whole GEMM's, None where not measured."""
        whole = self._get(M, K, N, 1, "rows")
        part = self._get(M, K, N, chunks, variant)
        return None if whole is None or part is None else part.total_ms / whole.total_ms

    def _get(self, M, K, N, chunks, variant):
        for t in self.timings:
            if (t.M, t.K, t.N, t.chunks, t.variant) == (M, K, N, chunks, variant):
                return t
        return None


def profile_table(char: TPCharacterization) -> dict:
    """The hardware profile's ``tp`` table: ``rows_ms``, ``"MxKxN"`` -> {rows: ms of one GEMM of
    that many rows, run as one of M / rows chunks} for each shape measured (every chunked GEMM
    a pipeline of that shape runs is one of these), and ``contention``, the same keys -> {rows:
    the chunks' slowdown with copies beside} (over-stated on one GPU: see the module doc).
    Keyed by the whole shape: the same row count measured in two shapes' runs differed by up
    to 16% on one H200 (clocks and power between runs), while the ratios within one run hold."""
    rows: dict = {}
    contention: dict = {}
    for t in char.timings:
        key = f"{t.M}x{t.K}x{t.N}"
        if t.variant == "rows":
            rows.setdefault(key, {})[t.M // t.chunks] = t.ms
        elif t.variant == "ce":
            base = char._get(t.M, t.K, t.N, t.chunks, "rows")
            if base is not None:
                contention.setdefault(key, {})[t.M // t.chunks] = t.total_ms / base.total_ms
    return {"dtype": char.dtype, "rows_ms": {k: dict(sorted(v.items())) for k, v in rows.items()},
            "contention": {k: dict(sorted(v.items())) for k, v in contention.items()}}


def _time(torch, fn, streams, warmup: int, runs: int) -> list[float]:
    """Milliseconds of ``fn()`` per run, from events on ``streams[0]`` that join every stream."""
    main = streams[0]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    marks = [torch.cuda.Event() for _ in streams]
    out = []
    for i in range(warmup + runs):
        with torch.cuda.stream(main):
            # The GPU sleeps while the host queues the run: the events time the GPU's work, not
            # the host's launches (32 chunks of a decode-sized GEMM take longer to queue than to run).
            torch.cuda._sleep(HOST_AHEAD_CYCLES)
            start.record(main)
        for s in streams[1:]:
            s.wait_event(start)
        fn()
        for s, m in zip(streams[1:], marks[1:]):
            m.record(s)
            main.wait_event(m)
        end.record(main)
        end.synchronize()
        if i >= warmup:
            out.append(start.elapsed_time(end))
    return out


def measure(shapes=DEFAULT_SHAPES, chunks=DEFAULT_CHUNKS, *, dtype: str = "bfloat16", world: int = 2,
            variants=VARIANTS, warmup: int = 3, runs: int = 10, progress=None) -> TPCharacterization:
    """Time every (shape, chunk count, variant) on the current CUDA device (see the module doc).
    ``progress(done, total, text)`` is called after each configuration."""
    import torch

    dt = getattr(torch, dtype)
    dev = torch.device("cuda", torch.cuda.current_device())
    s0 = torch.cuda.current_stream(dev)
    s1, s2 = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    todo = [(shape, c, v) for shape in shapes for c in chunks if shape[0] % c == 0 for v in variants
            if v == "rows" or c > 1]
    timings = []
    t_start = time.monotonic()
    for (M, K, N), group in _by_shape(todo):
        a = torch.randn(M, K, device=dev, dtype=dt)
        w = torch.randn(K, N, device=dev, dtype=dt)
        out = torch.empty(M, N, device=dev, dtype=dt)
        # The copy a world-w all-gather+GEMM pipeline makes per chunk lands (w-1)/w of the A rows
        # of every chunk; the same bytes copied on this GPU stand for it.
        src = torch.empty(M * K * (world - 1) // world, device=dev, dtype=dt)
        dst = torch.empty_like(src)
        for (_, c, variant) in group:
            rows = M // c
            pieces = [(a[i * rows:(i + 1) * rows], out[i * rows:(i + 1) * rows]) for i in range(c)]
            per_copy = src.numel() // c

            def run(pieces=pieces, variant=variant, per_copy=per_copy):
                for i, (x, y) in enumerate(pieces):
                    s = s1 if variant == "two_streams" and i % 2 else s0
                    with torch.cuda.stream(s):
                        torch.mm(x, w, out=y)
                    if variant == "ce":
                        with torch.cuda.stream(s2):
                            dst[i * per_copy:(i + 1) * per_copy].copy_(src[i * per_copy:(i + 1) * per_copy])

            streams = [s0] + ([s1] if variant == "two_streams" else []) + ([s2] if variant == "ce" else [])
            ms = _time(torch, run, streams, warmup, runs)
            med = statistics.median(ms)
            timings.append(Timing(M, K, N, c, variant, med / c, (max(ms) - min(ms)) / med, med))
            if progress is not None:
                progress(len(timings), len(todo), f"{M}x{K}x{N} c={c} {variant}: {med:.3f} ms "
                                                  f"({time.monotonic() - t_start:.0f} s)")
        del a, w, out, src, dst
    return TPCharacterization(dtype, world, tuple(timings))


def _by_shape(todo):
    shapes: dict = {}
    for item in todo:
        shapes.setdefault(item[0], []).append(item)
    return list(shapes.items())
