"""No-device tier: ``conccl.fsdp.enable(direct=True)`` on a real FSDP2 module (CPU, gloo, world
1) checks every field of FSDP2's objects the direct path reads or assigns
(``fsdp_direct._state.FSDP_FIELDS``): with one missing, as a PyTorch that renamed it would be,
it falls back to the plain hooks with exactly one warning naming the field, and wraps nothing."""
from __future__ import annotations

import inspect
import types
import warnings

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from conccl import fsdp
from conccl.fsdp import copy_free as fsdp_direct  # noqa: E402
from conccl.fsdp.copy_free._state import FSDP_FIELDS, FSDPModule, _fsdp_collectives, _fsdp_param_group  # noqa: E402

pytestmark = pytest.mark.skipif(fsdp_direct.supported() is not None, reason=str(fsdp_direct.supported()))


@pytest.fixture(scope="module")
def gloo(tmp_path_factory):
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def model(gloo):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1,))
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    for block in m:
        fully_shard(block, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


@pytest.fixture
def enable(monkeypatch):
    """``fsdp.enable(direct=True)`` as on a group conccl serves (on CPU none is: a stand-in group,
    and a pool that, as without symmetric memory, allocates plainly), recording the hooks each
    FSDP module gets; FSDP2's functions and the direct path's originals restored afterwards."""
    hooks = []
    group = types.SimpleNamespace(executor=types.SimpleNamespace(device=torch.device("cpu")))
    monkeypatch.setattr(fsdp.api, "get_group", lambda pg: group)
    monkeypatch.setattr(FSDPModule, "set_custom_all_gather", lambda m, comm: hooks.append(type(comm)))
    monkeypatch.setattr(FSDPModule, "set_custom_reduce_scatter", lambda m, comm: hooks.append(type(comm)))
    for mod in (_fsdp_collectives, _fsdp_param_group):
        for name in fsdp_direct._WRAPS:
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, getattr(mod, name))
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    monkeypatch.setattr(FSDPParam, "free_unsharded_param", FSDPParam.free_unsharded_param)  # wrapped at the class
    original = dict(fsdp_direct.ORIGINAL)

    def run(model):
        hooks.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fsdp.enable(model, direct=True)
        return [str(w.message) for w in caught], list(hooks)

    yield run
    fsdp_direct.ORIGINAL.clear()
    fsdp_direct.ORIGINAL.update(original)


def _objects(model, owner):
    for m in model.modules():
        group = m._get_fsdp_state()._fsdp_param_group if isinstance(m, FSDPModule) else None
        if group is not None:
            params = group.fsdp_params
            yield from {"FSDPParamGroup": [group], "DTensor": [p.sharded_param for p in params]}.get(owner, params)


def _remove(monkeypatch, model, owner, name) -> None:
    """As a PyTorch without the field would be: gone from the objects, their class (a property,
    a method, a slot) and, for a field set only in some states, the class's annotations."""
    objs = list(_objects(model, owner))
    assert objs, owner
    for obj in objs:
        if name in vars(obj):
            monkeypatch.delattr(obj, name)
    for cls in type(objs[0]).__mro__:
        if name in vars(cls):
            monkeypatch.delattr(cls, name)
        if name in inspect.get_annotations(cls):
            monkeypatch.delitem(cls.__annotations__, name)
    assert not any(hasattr(obj, name) for obj in objs), (owner, name)


def test_a_real_fsdp2_module_has_every_field_and_takes_the_direct_path(model, enable):
    assert fsdp_direct.supported(model) is None
    msgs, hooks = enable(model)
    assert msgs == []
    assert hooks == [fsdp_direct.DirectAllGather, fsdp_direct.DirectReduceScatter] * 2


@pytest.mark.parametrize("owner,name", FSDP_FIELDS, ids=[f"{o.replace(' ', '_')}.{n}" for o, n in FSDP_FIELDS])
def test_a_missing_field_falls_back_with_one_warning(model, enable, monkeypatch, owner, name):
    _remove(monkeypatch, model, owner, name)
    why = fsdp_direct.supported(model)
    assert why is not None and repr(name) in why, why
    before = dict(fsdp_direct.ORIGINAL)
    msgs, hooks = enable(model)
    assert msgs == [f"conccl.fsdp: direct=True unavailable ({why}); FSDP keeps its copies"]
    assert hooks == [fsdp.CopyEngineAllGather, fsdp.CopyEngineReduceScatter] * 2  # the plain hooks
    assert fsdp_direct.ORIGINAL == before  # nothing newly wrapped
