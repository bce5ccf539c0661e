"""SM partitions and NCCL groups shaped for a plan, created once and reused.

- :meth:`Partitions.green_stream`: a stream of a CUDA green context holding at most
  ``sm_count - sms_taken`` SMs, for a GEMM that gives SMs up.
- :meth:`Partitions.nccl_group`: the world as a NCCL group capped to ``ctas`` CTAs and/or on a
  high-priority stream. Creating one is a collective call on the world (``new_group``): every
  rank must ask for the same groups in the same order, as plans computed from the same inputs do.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.cuda.green_contexts import GreenContext


def granted_sms(device_index: int, want: int) -> int | None:
    """SMs the driver grants a green context asked for ``want`` (it rounds to its granularity)."""
    try:
        from cuda.bindings import driver as cu  # optional (cuda-python): without it the request is recorded

        _, dev = cu.cuDeviceGet(device_index)
        err, res = cu.cuDeviceGetDevResource(dev, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)
        if err != cu.CUresult.CUDA_SUCCESS:
            return None
        out = cu.cuDevSmResourceSplitByCount(1, res, 0, want)
        if out[0] != cu.CUresult.CUDA_SUCCESS:
            return None
        return int(out[1][0].sm.smCount)
    except Exception:  # noqa: BLE001 - older bindings: the request is recorded instead
        return None


class Partitions:
    """Per-process cache of green-context streams (per device and SM count) and NCCL groups."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.sm_count = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.side_stream = torch.cuda.Stream(self.device)  # a GEMM that keeps every SM
        self.comm_stream = torch.cuda.Stream(self.device)  # where a planned collective is called
        self._green: dict[int, tuple] = {}
        self._groups: dict[tuple, object] = {}
        self._events = None

    def events(self):
        """Three events a launch records again on every call (ready, GEMM done, collective
        done): one process launches from one thread at a time, and re-recording an event does
        not change a wait already queued on it."""
        if self._events is None:
            self._events = tuple(torch.cuda.Event() for _ in range(3))
        return self._events

    def green_stream(self, sms_taken: int):
        """(stream, SMs the GEMM gets): a green context holding at most ``sm_count - sms_taken`` SMs.

        The driver rounds a request up to its granularity (8 SMs on H200: 116 asked -> 120
        granted), which would leave the collective fewer SMs than its CTAs and stall it behind
        the GEMM; so ask for less until the grant fits."""
        if sms_taken <= 0:
            return self.side_stream, self.sm_count
        limit = self.sm_count - sms_taken
        if limit < 1:
            raise ValueError(f"cannot take {sms_taken} of the GPU's {self.sm_count} SMs from the GEMM")
        if limit not in self._green:
            want, granted = limit, granted_sms(self.device.index, limit)
            while granted is not None and granted > limit and want > 1:
                want -= 1
                granted = granted_sms(self.device.index, want)
            gc = GreenContext.create(num_sms=want, device_id=self.device.index)
            self._green[limit] = (gc, gc.Stream(), granted if granted is not None else want)
        _, stream, granted = self._green[limit]
        return stream, granted

    def nccl_group(self, ctas: int | None = None, high_priority: bool = False):
        """The world as a NCCL group, optionally capped to ``ctas`` CTAs or on a high-priority stream
        (None: the default group)."""
        if ctas is None and not high_priority:
            return None
        key = (ctas, high_priority)
        if key not in self._groups:
            opts = dist.ProcessGroupNCCL.Options()
            opts.is_high_priority_stream = high_priority
            if ctas is not None:
                opts.config.max_ctas = ctas
            self._groups[key] = dist.new_group(backend="nccl", pg_options=opts)
        return self._groups[key]
