"""``conccl bench fsdp``'s records reduced over ranks (:func:`combine`: the slowest rank of each
step, then the median) and its report (:func:`markdown`): the step and iteration table against
``no_comm``, what conccl did during the timed steps, each rank's SM clock, and rank 0's profiles.
"""
from __future__ import annotations

import statistics

from . import clocks


def _slowest(recs, key: str) -> list | None:
    """Per timed step, the slowest rank's ``key`` time; None where a rank has none."""
    if not all(r.get(key) for r in recs):
        return None
    return [max(ts) for ts in zip(*(r[key] for r in recs))]


def combine(per_rank: list[list[dict]]) -> list[dict]:
    """One record per (tokens, config): the slowest rank of each step, then the median."""
    results = []
    for recs in zip(*per_rank):
        r0 = recs[0]
        slowest = _slowest(recs, "times_ms")
        # the whole iteration (forward, backward, optimizer step, zero_grad)
        whole = _slowest(recs, "iteration_ms")
        peak = max(r["peak_alloc_bytes"] + r["conccl_workspace_bytes"] for r in recs)
        results.append({
            "tokens_per_rank": r0["tokens_per_rank"], "config": r0["config"],
            "step_ms": statistics.median(slowest), "step_ms_spread": [min(slowest), max(slowest)],
            "steps_timed": len(slowest), "peak_mem_gib": peak / 2**30,
            "iteration_ms": statistics.median(whole) if whole else None,
            "iteration_ms_spread": [min(whole), max(whole)] if whole else None,
            # the host's time to queue a step's fwd+bwd, the slowest rank's, median over steps
            "host_ms": statistics.median(host) if (host := _slowest(recs, "host_ms")) else None,
            "peak_alloc_gib": max(r["peak_alloc_bytes"] for r in recs) / 2**30,
            "peak_reserved_gib": max(r.get("peak_reserved_bytes", 0) for r in recs) / 2**30,
            "conccl_workspace_gib": max(r["conccl_workspace_bytes"] for r in recs) / 2**30,
            # the driver's count after the timed steps (the caching allocator keeps its peak
            # segments: about the peak), and what this configuration added to the process's
            "device_used_gib": max(r.get("device_used_after_bytes", 0) for r in recs) / 2**30,
            "device_added_gib": max(r.get("device_used_after_bytes", 0) - r.get("device_used_before_bytes", 0)
                                    for r in recs) / 2**30,
            "loss": r0["loss"], "loss_per_rank": [r["loss"] for r in recs],
            "loss_deterministic": r0.get("loss_deterministic", False), "loss_timed_run": r0.get("loss_timed_run"),
            "conccl": r0["conccl"], "profile_rank0": r0.get("profile"),
            "clocks_per_rank": [r.get("clocks") for r in recs],
            "segments_by_stream_rank0": r0.get("segments_by_stream"), "host_profile_rank0": r0.get("host_profile"),
        })
    return results


def markdown(doc: dict) -> str:
    """The report of a ``conccl bench fsdp`` document (its run's meta fields and ``results``, the
    records of :func:`combine`) as Markdown."""
    meta, res = doc, doc["results"]
    lr = meta.get("config", {}).get("lr", 1e-4)
    lines = [f"# conccl bench fsdp: {meta['machine_kind']}, {meta.get('device')} x {meta.get('world')}", "",
             f"commit {meta['commit']}, {meta['date']}, torch {meta['torch']}, NCCL {meta['nccl']}. Model: "
             f"{meta['model']['layers']} blocks, d {meta['model']['dim']}, ffn {meta['model']['ffn']}, "
             f"{meta['model']['heads']} heads, "
             + ("fp32 parameters under MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) (no_comm: the bf16 "
                "model)" if meta.get("config", {}).get("mixed_precision") else "bf16")
             + f", {meta['model']['parameters'] / 1e9:.2f} B parameters; AdamW at lr {lr:g}"
             + (" (the weights never change: every config multiplies the same data)" if lr == 0 else "") + "; one "
             "sequence per rank. Step = forward + backward; iteration = forward, backward, optimizer step "
             "and zero_grad; CUDA events, median over steps of the slowest rank. "
             + ("Loss: one forward after the same training run again under torch.use_deterministic_algorithms "
                "(the timed run's attention backward is not reproducible bit for bit)."
                if res and res[0].get("loss_deterministic") else "Loss: one forward after the timed run."),
             "", "| tokens per rank | config | step (ms) | spread (ms) | x no_comm | iteration (ms) | spread (ms) "
             "| x no_comm | peak memory (GiB) | peak reserved (GiB) "
             "| device used, driver (GiB) | added by the config (GiB) | loss after training |",
             "| ---: | --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    base = {r["tokens_per_rank"]: r["step_ms"] for r in res if r["config"] == "no_comm"}
    base_it = {r["tokens_per_rank"]: r.get("iteration_ms") for r in res if r["config"] == "no_comm"}
    for r in res:
        ratio = f"{r['step_ms'] / base[r['tokens_per_rank']]:.3f}" if r["tokens_per_rank"] in base else "-"
        lo, hi = r["step_ms_spread"]
        it, it_base = r.get("iteration_ms"), base_it.get(r["tokens_per_rank"])
        whole = "- | - | -" if it is None else (
            f"{it:.2f} | {r['iteration_ms_spread'][0]:.2f}-{r['iteration_ms_spread'][1]:.2f} | "
            + (f"{it / it_base:.3f}" if it_base else "-"))
        lines.append(f"| {r['tokens_per_rank']} | {r['config']} | {r['step_ms']:.2f} | {lo:.2f}-{hi:.2f} | {ratio} | "
                     f"{whole} | "
                     f"{r['peak_mem_gib']:.2f} | {r.get('peak_reserved_gib', 0):.2f} | {r.get('device_used_gib', 0):.2f} | "
                     f"{r.get('device_added_gib', 0):.2f} | {r['loss']!r} |")
    for r in res:
        c = r.get("conccl") or {}
        said = []
        if "programs_compiled_timed" in c:  # buffers that move between steps compile on every call
            spent = c.get("program_compile_s_timed")
            said.append(f"{c['programs_compiled_timed']} copy-engine programs compiled"
                        + (f" and {c['programs_readdressed_timed']} re-addressed" if "programs_readdressed_timed" in c
                           else "") + " during the timed steps"
                        + (f" ({1e3 * spent:.1f} ms of host time)" if spent is not None else ""))
        if c.get("board_exchanges_timed"):
            said.append(f"{c['board_posts_timed']} of its {c['board_exchanges_timed']} calls on the host board during the "
                        "timed steps posted their row without waiting for the peers'")
        segs = r.get("segments_by_stream_rank0")
        if segs:
            said.append("the caching allocator's segments after the timed steps, per stream made on: " + ", ".join(
                f"{g['stream']} {g['reserved_gib']:.2f} GiB reserved / {g['allocated_gib']:.2f} allocated "
                f"({g['segments']} segments)" for g in segs[:4]))
        if r.get("host_ms") is not None:
            said.append(f"the host queued a step's forward and backward in {r['host_ms']:.2f} ms (median, slowest rank)")
        d = c.get("direct")
        if r["config"].startswith("conccl_direct") and d:
            cast = ""
            if d.get("cast_gathers"):
                reused = f", {d['reused_casts']} backward all-gathers read their forward's cast" \
                    if d.get("reused_casts") else ""
                cast = f" ({d['cast_gathers']} made one cast into a cast home instead{reused})"
            said.append(f"{d['skipped_copy_outs']} all-gather copy-outs, {d.get('skipped_gather_copy_ins', 'n/a')} "
                        f"all-gather copy-ins{cast} and {d['skipped_copy_ins']} reduce-scatter copy-ins skipped; "
                        f"{d['declined_gathers']} all-gathers and {d['declined_reduces']} reduce-scatters left to "
                        "FSDP's copies")
        if said:
            lines += ["", f"{r['config']}, {r['tokens_per_rank']} tokens (rank 0, timed run): " + "; ".join(said) + "."]
        clk = r.get("clocks_per_rank") or []
        if any(clk):
            lines += ["", f"{r['config']}, {r['tokens_per_rank']} tokens: the SM clock over the timed steps "
                          "(nvidia-smi), median while the power cap held it: " + ", ".join(
                              f"rank {i} " + clocks.describe(c) for i, c in enumerate(clk)) + "."]
    for r in res:
        prof = r.get("profile_rank0")
        if not prof:
            continue
        streams = {k: v for k, v in prof.items() if k != "overlap"}
        kinds = sorted({k for s in streams.values() for k in s})
        lines += ["", f"## {r['config']}, {r['tokens_per_rank']} tokens: GPU time per stream in one iteration (ms, "
                      "rank 0)", "", "| stream | " + " | ".join(kinds) + " |", "| --- |" + " ---: |" * len(kinds)]
        for stream, by in streams.items():
            lines.append(f"| {stream} | " + " | ".join(f"{by.get(k, 0):.2f}" for k in kinds) + " |")
        o = prof.get("overlap")
        if o:
            lines += ["", f"From first to last activity {o['span_ms']:.2f} ms: kernels ran {o['kernel_ms']:.2f} ms, "
                          f"copy engines {o['copy_ms']:.2f} ms ({o['copy_beside_kernels_ms']:.2f} beside a kernel, "
                          f"{o['copy_alone_ms']:.2f} with none running), nothing {o['idle_ms']:.2f} ms."
                      + (" Longest exposed copies (ms into the iteration: ms long): " + ", ".join(
                          f"{at:.2f}: {ms:.2f}" for at, ms in o["copy_alone_longest"]) + "."
                         if o.get("copy_alone_longest") else "")]
    for r in res:
        hp = r.get("host_profile_rank0")
        if not hp:
            continue
        lines += ["", f"## {r['config']}, {r['tokens_per_rank']} tokens: host time by function (cProfile, rank 0, "
                      f"{hp['steps']} steps, {hp['host_ms_per_step_profiled']:.1f} ms per step profiled)", "",
                  "Python's garbage collector per step: " + (", ".join(f"{k} {v:.2f} ms" for k, v in
                                                                      hp.get("gc_ms_per_step", {}).items()) or "n/a")
                  + f" ({hp.get('gc_collections_per_step', 0):.1f} collections)", "",
                  "| function (by own time) | calls per step | own ms per step | cumulative ms per step |",
                  "| --- | ---: | ---: | ---: |"]
        for row in hp["by_own_time"]:
            lines.append(f"| `{row['function']}` | {row['calls_per_step']:.0f} | {row['own_ms']:.2f} | "
                         f"{row['cumulative_ms']:.2f} |")
    return "\n".join(lines) + "\n"
