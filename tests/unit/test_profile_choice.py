"""Which hardware profile a GPU plans with (conccl.planner.shipped), without a device: the
shipped ones by device name, world and NVLinks; an unknown GPU's fallback and its one
warning; a profile given by path (or $CONCCL_PROFILE) of another GPU refused."""
from __future__ import annotations

import dataclasses
import warnings

import pytest

from conccl import runtime
from conccl.planner import shipped
from conccl.planner.profile import EMBEDDED, HardwareProfile, ProfileError, load_profile

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"


@pytest.fixture
def catalogue(tmp_path, monkeypatch):
    """A pretend data folder: H100 x2 (18 NVLinks), H100 x8 (18), H100 NVL x2, H200 x4."""
    base = load_profile(EMBEDDED)
    for name, device, world, links in (("h100x2", H100, 2, 18), ("h100x8", H100, 8, 18),
                                       ("h100nvl", "NVIDIA H100 NVL", 2, 12), ("h200x4", H200, 4, 0)):
        prof = dataclasses.replace(base, device=device, world=world, nvlinks=links, source={"commit": name})
        (tmp_path / f"{name}_profile.json").write_text(prof.to_json())
    monkeypatch.setattr(shipped, "DATA", tmp_path)
    monkeypatch.delenv(shipped.ENV, raising=False)
    shipped.forget()
    yield tmp_path
    shipped.forget()


@pytest.mark.parametrize("device,world,links,expect", [
    (H100, 2, 18, "h100x2_profile.json"),
    (H100, 8, None, "h100x8_profile.json"),  # NVLinks unknown here: any count matches
    (H100, 5, 18, "h100x8_profile.json"),  # nearest world; a tie goes to the larger
    (H100, 4, 18, "h100x2_profile.json"),
    ("NVIDIA H100 NVL", 2, 12, "h100nvl_profile.json"),  # another card of the same chip: its own
    (H200, 2, 18, "h200x4_profile.json"),  # the H200 profile recorded no NVLink count
])
def test_a_shipped_profile_of_this_gpu_is_chosen(catalogue, device, world, links, expect):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a match warns nothing
        c = shipped.choose(device, world, nvlinks=links)
    assert (c.how, c.path, c.profile.device) == ("shipped", expect, device)


def test_an_unknown_gpu_gets_the_documented_fallback_and_one_warning(catalogue):
    with pytest.warns(shipped.ProfileFallbackWarning) as seen:
        a = shipped.choose("NVIDIA A100-SXM4-80GB", 2)
        b = shipped.choose("NVIDIA A100-SXM4-80GB", 2)
    assert len(seen) == 1 and "conccl study --out DIR" in str(seen[0].message)
    assert a is b and a.how == "fallback"
    assert a.profile.device == "NVIDIA A100-SXM4-80GB"  # relabelled: the planner's own checks hold
    assert a.profile.source["borrowed_from"] == H100 and a.path.startswith("h100")


def test_an_h100_whose_nvlinks_differ_from_every_shipped_one_falls_back(catalogue):
    with pytest.warns(shipped.ProfileFallbackWarning, match="with 4 NVLinks"):
        c = shipped.choose(H100, 2, nvlinks=4)
    assert c.how == "fallback"


def test_a_profile_given_by_path_or_environment_is_used_and_refused_for_another_gpu(catalogue, monkeypatch):
    path = str(catalogue / "h200x4_profile.json")
    assert shipped.choose(H200, 2, path=path).how == "given"
    with pytest.raises(ProfileError, match=f"measured on '{H200}', this GPU is '{H100}'"):
        shipped.choose(H100, 2, path=path)
    monkeypatch.setenv(shipped.ENV, path)
    with pytest.raises(ProfileError, match="this GPU is"):
        shipped.choose(H100, 2)
    assert shipped.choose(H200, 4).path == path


def test_no_gpu_plans_with_the_h200_profile(catalogue):
    c = shipped.choose(None, 2)
    assert (c.how, c.path, c.profile.device) == ("default", EMBEDDED.name, H200)


def test_the_ranks_agree_on_what_identifies_a_choice(catalogue):
    a, b = shipped.choose(H100, 2), shipped.choose(H100, 8)
    assert a.identity() != b.identity() and a.identity() == shipped.choose(H100, 2).identity()


def test_the_shipped_profiles_cover_the_h100_and_the_h200(monkeypatch):
    """The real data folder: an H100 node and an H200 node each get a measured profile."""
    monkeypatch.delenv(shipped.ENV, raising=False)
    shipped.forget()
    names = {p.device: (n, p) for n, p in shipped.shipped()}
    assert {H100, H200} <= set(names)
    for device in (H100, H200):
        c = shipped.choose(device, 2)
        assert c.how == "shipped" and c.profile.device == device and c.profile.source.get("machine_kind")


def test_the_eager_path_and_the_runtime_take_the_choice(catalogue):
    runtime.clear_plan_cache()
    table = runtime.eager_paths("auto", 2, None, H100)
    assert table["profile"]["chosen"] == "shipped" and table["profile"]["file"] == "h100x2_profile.json"
    with pytest.warns(shipped.ProfileFallbackWarning):
        runtime.get_plan((4096, 4096, 4096), "all_gather", 1 << 26, 2, device_name="NVIDIA B200")
