"""Implementations the benchmark compares, one registry for the CLI, tests and benchmark.

Each implementation prepares buffers once per size (``setup``) and returns a zero-argument
callable that runs one collective on the current stream. ``family`` groups implementations
that can share a process: NCCL's copy-engine mode needs the NCCL symmetric-memory backend,
conccl the CUDA one, and a process can only hold one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Impl:
    name: str
    family: str
    collectives: tuple[str, ...]
    description: str
    # setup(collective, inp, out, ctx) -> (run, result): run() queues one collective on the
    # current stream; result() returns the tensor holding the last run's output.
    setup: Callable


def _conccl(algorithm=None, stream_mode=None, symmetric=False, checks=True, persistent=False):
    def setup(coll, inp, out, ctx):
        import conccl

        algo = conccl.Algorithm(algorithm) if algorithm else None
        mode = conccl.StreamMode(stream_mode) if stream_mode else None
        if symmetric:
            inp, out = _to_symmetric(inp, ctx, "in"), _to_symmetric(out, ctx, "out")
        comm = conccl.get_communicator()
        if persistent:  # agreed once here; each run only starts it
            make = comm.persistent_all_gather_into_tensor if coll == "all_gather" else comm.persistent_all_to_all_single
            op = make(out, inp, algorithm=algo, stream_mode=mode)
            return (lambda: op.start()), lambda: out  # looked up per call: --phases wraps start
        if coll == "all_gather":
            call = lambda: comm.all_gather_into_tensor(out, inp, algorithm=algo, stream_mode=mode)  # noqa: E731
        else:
            call = lambda: comm.all_to_all_single(out, inp, algorithm=algo, stream_mode=mode)  # noqa: E731
        if checks:
            return call, lambda: out

        def unchecked():  # the group's other calls keep their checks
            comm.options.checks = False
            try:
                call()
            finally:
                comm.options.checks = True

        return unchecked, lambda: out

    return setup


def _conccl_in_place(coll, inp, out, ctx):
    """All-gather with the input already in its place in a conccl.empty output: no own-shard copy."""
    import torch
    import torch.distributed as dist

    import conccl

    out = _to_symmetric(out, ctx, "out")
    nbytes = inp.numel() * inp.element_size()
    rank = dist.get_rank()
    own = out.view(-1).view(torch.uint8)[rank * nbytes:(rank + 1) * nbytes].view(inp.dtype)
    own.copy_(inp)
    comm = conccl.get_communicator()
    return (lambda: comm.all_gather_into_tensor(out, own)), lambda: out


def _to_symmetric(t, ctx, role):
    """Copy ``t`` into a view of a per-role symmetric arena of ``ctx['max_bytes']``, allocated once:
    the symmetric allocator may hand ranks cached blocks of different sizes if allocations
    come and go, and a rendezvous needs equal sizes."""
    import torch

    import conccl

    key = f"arena_{role}"
    if key not in ctx:
        ctx[key] = conccl.empty(ctx["max_bytes"], dtype=torch.uint8)
    nbytes = t.numel() * t.element_size()
    s = ctx[key][:nbytes].view(t.dtype).view(t.shape)
    s.copy_(t)
    return s


def _nccl(coll, inp, out, ctx):
    import torch.distributed as dist

    if coll == "all_gather":
        return (lambda: dist.all_gather_into_tensor(out, inp)), lambda: out
    return (lambda: dist.all_to_all_single(out, inp)), lambda: out


def _nccl_ce(coll, inp, out, ctx):
    """NCCL >= 2.28 copy-engine collectives: CTA policy ZERO, buffers in a registered window."""
    import torch
    import torch.distributed as dist
    from torch.distributed import _symmetric_memory as symm_mem

    if "ce_group" not in ctx:
        symm_mem.set_backend("NCCL")
        opts = dist.ProcessGroupNCCL.Options()
        opts.config.cta_policy = dist.ProcessGroupNCCL.NCCL_CTA_POLICY_ZERO
        group = dist.new_group(backend="nccl", pg_options=opts)
        with torch.cuda.use_mem_pool(symm_mem.get_mem_pool(inp.device)):
            windows = [torch.empty(ctx["max_bytes"], dtype=torch.uint8, device=inp.device) for _ in range(2)]
        for w in windows:
            symm_mem.rendezvous(w, group.group_name)
        ctx["ce_group"], ctx["ce_windows"] = group, windows
    group, (w_in, w_out) = ctx["ce_group"], ctx["ce_windows"]
    win_in = w_in[: inp.numel() * inp.element_size()].view(inp.dtype)
    win_out = w_out[: out.numel() * out.element_size()].view(out.dtype)
    win_in.copy_(inp)
    if coll == "all_gather":
        return (lambda: dist.all_gather_into_tensor(win_out, win_in, group=group)), lambda: win_out
    return (lambda: dist.all_to_all_single(win_out, win_in, group=group)), lambda: win_out


def _torch_low_contention(coll, inp, out, ctx):
    import torch
    import torch.distributed as dist
    from torch.distributed import _symmetric_memory as symm_mem

    name = dist.group.WORLD.group_name
    if "lc_arena" not in ctx:
        ctx["lc_arena"] = symm_mem.empty(ctx["max_bytes"], dtype=torch.uint8, device=inp.device)
        symm_mem.rendezvous(ctx["lc_arena"], name)
    sym = ctx["lc_arena"][: inp.numel() * inp.element_size()].view(inp.dtype)
    sym.copy_(inp)
    last = {}

    def run():
        out = torch.ops.symm_mem._low_contention_all_gather(sym, name)  # allocates its output
        # it runs on a backend stream: make the current stream wait, as a caller must
        last["out"] = torch.ops._c10d_functional.wait_tensor(out)

    return run, lambda: last["out"]


REGISTRY: dict[str, Impl] = {
    i.name: i
    for i in [
        Impl("conccl", "cuda_symm", ("all_gather", "all_to_all"),
             "conccl default on ordinary tensors: pull, input staged into the symmetric workspace, peer copies "
             "as one cudaMemcpyBatchAsync", _conccl()),
        Impl("conccl_symm_pull", "cuda_symm", ("all_gather", "all_to_all"),
             "conccl pull, input and output from conccl.empty (no staging)", _conccl("pull", None, True)),
        Impl("conccl_symm_push", "cuda_symm", ("all_gather", "all_to_all"),
             "conccl push into peers' outputs from conccl.empty", _conccl("push", None, True)),
        Impl("conccl_symm_push_in_place", "cuda_symm", ("all_gather",),
             "conccl push, in place: the input is the own chunk of a conccl.empty output", _conccl_in_place),
        Impl("conccl_persistent", "cuda_symm", ("all_gather", "all_to_all"),
             "conccl default on ordinary tensors as a persistent op (conccl.persistent_*): agreed with the "
             "peers once, each run only queues the copies", _conccl(persistent=True)),
        Impl("conccl_symm_push_persistent", "cuda_symm", ("all_gather", "all_to_all"),
             "conccl push from conccl.empty as a persistent op: agreed once, each run only queues the copies",
             _conccl("push", None, True, persistent=True)),
        Impl("conccl_symm_push_unchecked", "cuda_symm", ("all_gather", "all_to_all"),
             "conccl push from conccl.empty without the mismatch checks and the watchdog (what they cost; "
             "a dead peer then hangs the GPU)", _conccl("push", None, True, checks=False)),
        Impl("conccl_symm_push_single", "cuda_symm", ("all_gather", "all_to_all"),
             "conccl push from conccl.empty, one cudaMemcpyAsync after another", _conccl("push", "single", True)),
        Impl("conccl_symm_push_per_peer", "cuda_symm", ("all_gather", "all_to_all"),
             "conccl push from conccl.empty, one stream per peer", _conccl("push", "per_peer", True)),
        Impl("conccl_per_peer", "cuda_symm", ("all_gather", "all_to_all"),
             "conccl pull, staged, one stream per peer", _conccl("pull", "per_peer")),
        Impl("conccl_single", "cuda_symm", ("all_gather", "all_to_all"),
             "conccl pull, staged, one cudaMemcpyAsync after another", _conccl("pull", "single")),
        Impl("nccl", "cuda_symm", ("all_gather", "all_to_all"), "NCCL with SM kernels (torch.distributed)", _nccl),
        Impl("torch_lc", "cuda_symm", ("all_gather",),
             "PyTorch _low_contention_all_gather (copy engines + a barrier kernel), symmetric input",
             _torch_low_contention),
        Impl("nccl_ce", "nccl_symm", ("all_gather", "all_to_all"),
             "NCCL copy-engine mode (cta_policy ZERO, registered symmetric window)", _nccl_ce),
    ]
}

DEFAULT_IMPLS = ("conccl", "conccl_symm_pull", "conccl_symm_push", "nccl", "torch_lc", "nccl_ce")

