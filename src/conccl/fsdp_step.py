"""The optimizer step with the next forward's first all-gather beside it (``FsdpComms.step_and_prefetch``).

In an FSDP2 iteration the first module's all-gather of the next forward sits alone on the
critical path: it needs that module's parameters updated, so it is queued after the whole
optimizer step, and the forward waits for it. The optimizer's update is elementwise per
parameter (SGD, Adam, AdamW, ...), so it can run in two parts with the same bits: the first
module's parameters, then the rest. Between the two, that module's gather starts on its own
stream; the rest of the update runs on the SMs while copy engines move the gather's bytes.

The first module is the one whose forward began first since the last step (a forward pre-hook
on every FSDP module records it): the root where it holds parameters (embeddings), else the
first block. What ``optimizer.step()`` sees differs in one way: it runs twice, each time over
a part of every parameter group's parameters, so its step hooks run twice, and a step that
reads every parameter at once (a global norm inside the optimizer, LBFGS's closure) must not
be split: use ``optimizer.step()`` there. Gradient clipping runs before, as usual.
"""
from __future__ import annotations

import weakref

import torch

try:
    from torch.distributed.fsdp import FSDPModule
except ImportError:  # pragma: no cover - older PyTorch: conccl.fsdp.enable refuses first
    FSDPModule = None


def _param_group(module):
    state = module._get_fsdp_state()
    return state._fsdp_param_group


class ForwardOrder:
    """Which FSDP module's forward began first since :meth:`take` (forward pre-hooks on every
    FSDP module of ``modules`` that owns parameters)."""

    def __init__(self, modules):
        self.first = None  # a weak reference to the module
        self.handles = []
        for m in modules:
            if isinstance(m, FSDPModule) and _param_group(m) is not None:
                self.handles.append(m.register_forward_pre_hook(self._seen(weakref.ref(m))))

    def _seen(self, ref):
        def hook(module, args):
            if self.first is None:
                self.first = ref
        return hook

    def take(self):
        """The module seen first since the last call (None: no forward since), forgotten now."""
        ref, self.first = self.first, None
        return None if ref is None else ref()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def step_and_prefetch(optimizer: torch.optim.Optimizer, first, streams: dict) -> bool:
    """``optimizer.step()`` over ``first``'s parameters, then ``first.unshard(async_op=True)``
    on a stream of its own (``streams``: device index -> stream, made on first use; not the
    current stream, whose remaining optimizer kernels would queue behind the gather), ordered
    after that update, then the step over every other parameter. ``first`` None, or none of its parameters in ``optimizer``: one plain step.
    Returns whether the gather was issued (FSDP's pre-forward of ``first`` then waits for it)."""
    if first is None:
        optimizer.step()
        return False
    mine = {id(p.sharded_param) for p in _param_group(first).fsdp_params}
    groups = optimizer.param_groups
    saved = [g["params"] for g in groups]
    head = [[p for p in ps if id(p) in mine] for ps in saved]
    if not any(head):
        optimizer.step()
        return False
    try:
        for g, ps in zip(groups, head):
            g["params"] = ps
        optimizer.step()
        device = next(p for ps in head for p in ps).device
        if device.type == "cuda":
            stream = streams.get(device.index)
            if stream is None:
                stream = streams[device.index] = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                first.unshard(async_op=True)
        else:
            first.unshard(async_op=True)
        for g, ps in zip(groups, saved):
            g["params"] = [p for p in ps if id(p) not in mine]
        optimizer.step()
    finally:
        for g, ps in zip(groups, saved):
            g["params"] = ps
    return True
