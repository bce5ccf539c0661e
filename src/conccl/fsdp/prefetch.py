"""The optimizer step with the next forward's first all-gather beside it (``FsdpComms.step_and_prefetch``).

In an FSDP2 iteration the first module's all-gather of the next forward sits alone on the
critical path: it needs that module's parameters updated, so it is queued after the whole
optimizer step, and the forward waits for it. The optimizer's update is elementwise per
parameter (SGD, Adam, AdamW, ...), so it can run in two parts with the same bits: the first
module's parameters, then the rest. Between the two, that module's gather starts on FSDP's
all-gather stream; the rest of the update runs on the SMs while copy engines move the bytes.

The first module is the one whose forward began first since the last step (a forward pre-hook
on every FSDP module records it, installed at the first step: a model never stepped this way
runs no hook): the root where it holds parameters (embeddings), else the first block. What
``optimizer.step()`` sees differs in one way: it runs twice, each time over a part of every
parameter group's parameters, so its step hooks run twice and see part of the parameters; a
step that reads every parameter at once (a global norm inside the optimizer, LBFGS's closure)
must not be split: use ``optimizer.step()`` there. Gradient clipping runs before, as usual.

A gathered module is the parameters as they were at the step. Where they change before the
next forward (another step, ``load_state_dict``, an EMA swap), the gather is dropped and the
forward gathers again: seen by the parameters' version counters and by a second step; a write
no counter sees (through ``.data``, a fused optimizer's plain ``optimizer.step()``) is not. A
change must be made alike on every rank (as any change to sharded weights is): a rank that drops
a gather gathers again, a collective call its peers must make too. The gather is issued only
where this optimizer steps every trainable parameter of the module (another optimizer stepping
some of them after would leave it stale).
"""
from __future__ import annotations

import weakref

import torch

from .copy_free import FSDPModule, shard_versions  # FSDPModule None on a PyTorch without FSDP2


def _param_group(module):
    return module._get_fsdp_state()._fsdp_param_group


def _versions(module) -> tuple:
    """What tells that ``module``'s sharded parameters changed: each one's tensors (a parameter
    replaced) and the version counters that count a write to them (:func:`shard_versions`)."""
    return tuple((id(p.sharded_param), id(p._sharded_param_data), *shard_versions(p))
                 for p in _param_group(module).fsdp_params)


class ForwardOrder:
    """Which FSDP module's forward began first since :meth:`take`, and the gather issued for
    it (:func:`step_and_prefetch`), dropped before that forward where it went stale. Pre-hooks
    on every FSDP module of ``modules`` that owns parameters, run before FSDP's own."""

    def __init__(self, modules):
        self.first = None  # a weak reference to the module
        self.pending = None  # (weak reference to the module, its parameters' versions at the gather)
        self.dropped = 0  # prefetched gathers dropped as stale
        for m in modules:  # hooks held by the modules for their lifetime (as FSDP's own)
            if isinstance(m, FSDPModule) and _param_group(m) is not None:
                hook = torch._dynamo.disable(self._seen(weakref.ref(m)))  # eager in a compiled block
                m.register_forward_pre_hook(hook, prepend=True)

    def _seen(self, ref):
        def hook(module, args):
            if self.first is None:
                self.first = ref
            if self.pending is not None and self.pending[0]() is module:
                if _versions(module) != self.pending[1]:
                    self.drop()
                self.pending = None
        return hook

    def take(self):
        """The module seen first since the last call (None: no forward since), forgotten now."""
        ref, self.first = self.first, None
        return None if ref is None else ref()

    def drop(self) -> None:
        """The pending gather's result thrown away (waited for, then resharded: FSDP's
        pre-forward gathers the module again)."""
        module = self.pending[0]() if self.pending is not None else None
        self.pending = None
        group = None if module is None else _param_group(module)
        if group is not None and group._all_gather_result is not None:  # not consumed by a forward since
            group.wait_for_unshard()
            group.reshard()
            self.dropped += 1


def _gather_stream(module, device):
    """FSDP's all-gather stream of ``module`` (its forward gathers' stream: the unsharded
    parameters made there are reused there), else the current one's device's default."""
    ctx = getattr(module._get_fsdp_state(), "_comm_ctx", None)
    stream = getattr(ctx, "all_gather_stream", None)
    return stream if stream is not None else torch.cuda.current_stream(device)


def step_and_prefetch(optimizer: torch.optim.Optimizer, order: ForwardOrder) -> bool:
    """``optimizer.step()`` over the parameters of ``order``'s first module, then that module's
    ``unshard(async_op=True)`` on FSDP's all-gather stream (ordered after that update), then
    the step over every other parameter (run even where the gather raised, then re-raised: the
    update happens once). No module seen, or not every trainable parameter of it in
    ``optimizer``: one plain step. A gather still pending from the last call (no forward since) is dropped first.
    Returns whether the gather was issued (FSDP's pre-forward of that module waits for it)."""
    if order.pending is not None:
        order.drop()
    first = order.take()
    mine = set() if first is None else {id(p.sharded_param) for p in _param_group(first).fsdp_params
                                        if p.sharded_param.requires_grad}
    groups = optimizer.param_groups
    saved = [g["params"] for g in groups]
    head = [[p for p in ps if id(p) in mine] for ps in saved]
    if not mine or sum(map(len, head)) != len(mine):  # another optimizer steps some of them: gather
        optimizer.step()                               # only once every update is in (a plain step)
        return False
    try:
        for g, ps in zip(groups, head):
            g["params"] = ps
        optimizer.step()
        try:
            device = next(p for ps in head for p in ps).device
            if device.type == "cuda":
                stream = _gather_stream(first, device)
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    first.unshard(async_op=True)
            else:
                first.unshard(async_op=True)
            order.pending = (weakref.ref(first), _versions(first))
        finally:
            for g, ps in zip(groups, saved):
                g["params"] = [p for p in ps if id(p) not in mine]
            optimizer.step()
    finally:
        for g, ps in zip(groups, saved):
            g["params"] = ps
    return True
