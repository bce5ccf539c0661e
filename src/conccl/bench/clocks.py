"""The SM clock a benchmark ran at, sampled by ``nvidia-smi`` beside it.

Why a benchmark needs it: an H100 or H200 running large GEMMs sits at its 700 W power cap, and
the clock the cap leaves depends on what else draws power. Copy-engine traffic over NVLink slowed
a GEMM chain by 0.5-3.9%, including the GEMMs no copy overlapped. The sampled clock was 0-45 MHz
lower, while copies within the GPU left the GEMMs apart from them alone (docs/results.md,
FSDP2). A benchmark that reports the clock says how much of
a few percent between configurations the clock could explain. Compare configurations each in its
own process, in alternating order: within one process the configuration that ran later had the
lower clock in either order.

:class:`ClockSampler` runs ``nvidia-smi --query-gpu=timestamp,clocks.sm,clocks_event_reasons.active
-lms PERIOD`` for one GPU in a subprocess from :meth:`~ClockSampler.start` to
:meth:`~ClockSampler.stop` (or over a ``with`` block). nvidia-smi takes a moment to start, so the
first few hundred milliseconds may go unsampled. :func:`summarize` turns the lines into the
median SM clock, overall and over the samples the software power cap held (reason bit 0x4), and
the period between samples as measured. Without ``nvidia-smi`` (or where it cannot start), or
with a driver that does not know the fields, the summary is None and the benchmark goes on.
The subprocess costs host time (one query every PERIOD ms), so benchmarks sample only where
asked (``conccl bench fsdp --clocks``).
"""
from __future__ import annotations

import datetime
import shutil
import statistics
import subprocess
import tempfile

SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap
PERIOD_MS = 20
QUERY = "timestamp,clocks.sm,clocks_event_reasons.active"


def parse_line(line: str) -> tuple[float, float, int] | None:
    """(seconds of the day, SM MHz, clock-event reason bits) of one ``nvidia-smi`` CSV line
    (noheader, nounits), or None for a line that is not a sample ([N/A], an error message, a cut
    line)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 3:
        return None
    try:
        t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
        return t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6, float(parts[1]), int(parts[2], 16)
    except ValueError:
        return None


def summarize(lines) -> dict | None:
    """Median SM clock over every sample and over the power-capped ones, and the measured period
    between samples (ms; None with one sample); None without samples."""
    samples = [s for s in map(parse_line, lines) if s is not None]
    if not samples:
        return None
    capped = [mhz for _, mhz, reasons in samples if reasons & SW_POWER_CAP]
    span = (samples[-1][0] - samples[0][0]) % 86400  # a window across midnight wraps
    return {"samples": len(samples),
            "period_ms": round(1e3 * span / (len(samples) - 1), 1) if len(samples) > 1 else None,
            "sm_mhz_median": statistics.median(mhz for _, mhz, _ in samples),
            "capped_samples": len(capped),
            "sm_mhz_median_capped": statistics.median(capped) if capped else None}


def describe(summary: dict | None) -> str:
    """A :func:`summarize` dict in words: the power-capped median and its share of the samples."""
    if not summary:
        return "n/a"
    c = summary
    n = f"{c['samples']} sample{'s' if c['samples'] != 1 else ''}" + (
        f", one every {c['period_ms']:.0f} ms" if c.get("period_ms") else "")
    if c["sm_mhz_median_capped"] is None:
        return f"never capped ({c['sm_mhz_median']:.0f} MHz; {n})"
    return f"{c['sm_mhz_median_capped']:.0f} MHz ({c['capped_samples']} of {n})"


class ClockSampler:
    """``start()`` ... ``stop()`` (or ``with ClockSampler(uuid) as s: ...``), then ``s.summary()``.
    ``uuid``: the GPU's as ``nvidia-smi -i`` takes it ("GPU-..."); :func:`device_uuid` gives it for
    a torch device. ``stop`` may be called again, or without a start."""

    def __init__(self, uuid: str, period_ms: int = PERIOD_MS):
        if period_ms < 1:
            raise ValueError(f"the sampling period must be at least 1 ms, got {period_ms}")
        self.uuid, self.period_ms = uuid, period_ms
        self._proc = None
        self._out = None
        self._lines: list[str] = []

    def start(self) -> None:
        exe = shutil.which("nvidia-smi")
        if exe is None or self._proc is not None:
            return
        self._out = tempfile.TemporaryFile(mode="w+")
        try:
            self._proc = subprocess.Popen([exe, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                           "-i", self.uuid, "-lms", str(self.period_ms)],
                                          stdout=self._out, stderr=subprocess.DEVNULL)
        except OSError:  # not executable, out of processes: no samples, the benchmark goes on
            self._out.close()
            self._out = None

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._out.seek(0)
        self._lines = self._out.read().splitlines()
        self._out.close()
        self._proc = self._out = None

    def __enter__(self) -> "ClockSampler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def summary(self) -> dict | None:
        """What :func:`summarize` makes of the samples taken, with ``gpu``: the UUID sampled (None:
        no ``nvidia-smi`` or no sample)."""
        s = summarize(self._lines)
        return None if s is None else {**s, "gpu": self.uuid}


def device_uuid(device) -> str:
    """``nvidia-smi -i``'s name of a torch CUDA device ("GPU-" and its UUID)."""
    import torch

    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
