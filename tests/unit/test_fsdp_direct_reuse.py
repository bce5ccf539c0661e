"""No device: the stream ordering of FSDP2 direct=True's memory reuse, with fake streams and
events standing for CUDA's. The unsharded parameters' pools (``fsdp_direct.reuse``): a gather
waits for every stream's last free of its parity and allocates in that parity's pool; a pooled
parameter's free records an event on the freeing stream. The reduce-scatter's held gradients
(``fsdp_direct.reduce_scatter``): the stream they were made on waits for every held reduction
before they are dropped, and one release is queued per backward pass."""
from __future__ import annotations

import contextlib
import types

import pytest

torch = pytest.importorskip("torch")

from conccl.fsdp.copy_free import reduce_scatter, reuse  # noqa: E402


class _Stream:
    def __init__(self, handle):
        self.cuda_stream, self.waited, self.recorded = handle, [], 0

    def wait_event(self, event):
        self.waited.append(event)

    def record_event(self):
        self.recorded += 1
        return f"event {self.cuda_stream}.{self.recorded}"


class _Pools(reuse.Pools):
    def get(self, device):
        return ("pool 0", "pool 1")


@pytest.fixture
def active_pool(monkeypatch):
    active = []

    @contextlib.contextmanager
    def use_mem_pool(pool, device=None):
        active.append(pool)
        yield
        active.pop()

    monkeypatch.setattr(torch.cuda, "use_mem_pool", use_mem_pool, raising=False)
    return active


def test_a_gather_waits_for_every_streams_last_free_of_its_parity_and_allocates_in_its_pool(active_pool):
    pools = _Pools()
    pools.freed[1].update({7: "free on 7", 9: "free on 9"})
    pools.freed[0].update({7: "other parity"})
    gather = _Stream(3)
    params = [types.SimpleNamespace(), types.SimpleNamespace()]
    with reuse.allocating(pools, 1, params, torch.device("cpu"), gather) as pooled:
        inside = list(active_pool)
    assert pooled and inside == ["pool 1"] and active_pool == []
    assert sorted(gather.waited) == ["free on 7", "free on 9"]  # not the other parity's
    assert all(p._conccl_reuse == (pools, 1) and reuse.pooled(p) for p in params)


def test_without_pools_nothing_waits_or_is_marked(active_pool):
    gather = _Stream(3)
    p = types.SimpleNamespace()
    for pools, parity in ((None, 0), (_Pools(), None)):
        with reuse.allocating(pools, parity, [p], torch.device("cpu"), gather) as pooled:
            assert not pooled and active_pool == []
    assert gather.waited == [] and not reuse.pooled(p)


def _param(mark, allocated=True):
    storage = types.SimpleNamespace(size=lambda: 8 if allocated else 0)
    out = types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0), untyped_storage=lambda: storage)
    return types.SimpleNamespace(_conccl_reuse=mark, all_gather_outputs=[out])


class _Event:
    def __init__(self):
        self.records = []

    def record(self, stream):
        self.records.append(stream.cuda_stream)


def test_a_pooled_free_records_one_event_per_freeing_stream_again_at_each_free_and_frees(monkeypatch, active_pool):
    streams = {"now": _Stream(5)}
    monkeypatch.setattr(reuse, "CurrentStreams", lambda index: lambda: streams["now"])
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    freed = []
    monkeypatch.setitem(reuse.ORIGINAL, "free_unsharded_param", freed.append)
    pools = _Pools()
    a, a2, b, plain, empty = (_param((pools, 0)), _param((pools, 0)), _param((pools, 1)), _param(None),
                              _param((pools, 0), allocated=False))
    reuse.free_unsharded_param(a)
    reuse.free_unsharded_param(a2)  # the same stream frees again: the same event, recorded again
    streams["now"] = _Stream(6)  # another stream frees b
    reuse.free_unsharded_param(b)
    reuse.free_unsharded_param(plain)
    reuse.free_unsharded_param(empty)  # already freed: nothing new to wait for
    assert freed == [a, a2, b, plain, empty]  # FSDP's own free runs every time
    assert list(pools.freed[0]) == [5] and list(pools.freed[1]) == [6]
    assert pools.freed[0][5].records == [5, 5] and pools.freed[1][6].records == [6]
    # a gather of parity 0 then waits for the event as last recorded: stream 5's last free
    gather = _Stream(3)
    with reuse.allocating(pools, 0, [a], torch.device("cpu"), gather):
        pass
    assert gather.waited == [pools.freed[0][5]]


def test_held_gradients_wait_on_the_stream_they_were_made_on_once_per_backward(monkeypatch):
    queued = []

    def queue_callback(fn):
        queued.append(fn)

    monkeypatch.setattr(reduce_scatter, "_at_backward_end", queue_callback)
    monkeypatch.setattr(reduce_scatter, "_HELD", {})
    monkeypatch.setattr(reduce_scatter, "_QUEUED", {})
    task = {"id": 4}
    monkeypatch.setattr(reduce_scatter, "_backward_pass", lambda: task["id"])
    device = types.SimpleNamespace(index=0)
    grads = [types.SimpleNamespace(device=device) for _ in range(3)]
    rs, made_on = _Stream(2), _Stream(1)
    reduce_scatter._hold(grads[:2], rs, made_on)
    reduce_scatter.release_held(device)  # the next reduction: the first one's gradients go
    assert made_on.waited == ["event 2.1"] and reduce_scatter._HELD == {}
    reduce_scatter._hold(grads[2:], rs, made_on)
    assert len(queued) == 1  # one release per backward pass, though it held twice
    assert len(reduce_scatter._HELD[0]) == 1 and reduce_scatter._HELD[0][0][0] == (grads[2],)
    queued[0]()  # the end of the backward pass
    assert made_on.waited == ["event 2.1", "event 2.2"] and reduce_scatter._HELD == {}
    task["id"] = 5
    reduce_scatter._hold(grads[:1], rs, made_on)  # the next backward queues its own
    assert len(queued) == 2
    task["id"] = 6  # that pass raised: its callback never ran; the next pass still queues one
    reduce_scatter._hold(grads[:1], rs, made_on)
    assert len(queued) == 3
    task["id"] = None  # outside a backward pass: nothing queued, the next reduction releases
    reduce_scatter._hold(grads[:1], rs, made_on)
    assert len(queued) == 3 and len(reduce_scatter._HELD[0]) == 3


def test_modules_alternate_in_the_order_of_their_first_gathers():
    pools = reuse.Pools()
    assert [pools.next_parity() for _ in range(5)] == [0, 1, 0, 1, 0]
