"""No-device tier: the hosts x ranks layout of a group spanning hosts
(:mod:`conccl.group.topology`), and the simulated hosts' specification."""
from __future__ import annotations

import pytest

from conccl.errors import InvalidArgument
from conccl.group.topology import HostLayout, host_layout, simulated_host_keys


@pytest.mark.parametrize("hosts,per", [(2, 2), (3, 2), (2, 4), (1, 8), (8, 1)])
def test_node_and_cross_ranks_cover_every_rank_once(hosts, per):
    keys = [f"h{r // per}" for r in range(hosts * per)]
    lay = host_layout(keys)
    assert (lay.num_hosts, lay.per_host, lay.world) == (hosts, per, hosts * per)
    nodes = [r for n in range(hosts) for r in lay.node_ranks(n)]
    cross = sorted(r for l in range(per) for r in lay.cross_ranks(l))
    assert nodes == cross == list(range(hosts * per))
    for r in range(hosts * per):
        n, l = lay.host_of(r), lay.local_of(r)
        assert lay.node_ranks(n)[l] == r and lay.cross_ranks(l)[n] == r
        assert keys[r] == lay.hosts[n]


def test_hosts_are_ordered_by_their_lowest_rank_not_by_name():
    lay = host_layout(["zeta", "zeta", "alpha", "alpha"])
    assert lay.hosts == ("zeta", "alpha") and lay.node_ranks(1) == (2, 3)


def test_unequal_ranks_per_host_are_refused_in_one_line_naming_the_counts():
    with pytest.raises(InvalidArgument, match=r"unequal numbers of ranks \(a: 3, b: 1\)") as e:
        host_layout(["a", "a", "a", "b"])
    assert "\n" not in str(e.value)


def test_a_host_whose_ranks_are_not_consecutive_is_refused():
    with pytest.raises(InvalidArgument, match=r"host a runs ranks \[0, 2\], not 0..1.*torchrun"):
        host_layout(["a", "b", "a", "b"])


def test_simulated_hosts_by_shape_and_by_list():
    assert simulated_host_keys("2x2", 4) == ["sim0", "sim0", "sim1", "sim1"]
    assert simulated_host_keys(" 3 x 2 ") == ["sim0"] * 2 + ["sim1"] * 2 + ["sim2"] * 2
    assert simulated_host_keys("0,0,1,1", 4) == ["sim0", "sim0", "sim1", "sim1"]
    assert host_layout(simulated_host_keys("2x4")) == HostLayout(("sim0", "sim1"), 4)


@pytest.mark.parametrize("spec,world,words", [("2x2", 6, "is 2 x 2 = 4 ranks; the group has 6"),
                                               ("0,1", 3, "names 2 ranks' hosts; the group has 3"),
                                               ("two", 2, "expected HOSTSxRANKS"),
                                               ("0x4", 0, "is 0 x 4")])
def test_bad_simulated_host_specs_are_refused(spec, world, words):
    with pytest.raises(InvalidArgument, match=words.replace("(", r"\(")):
        simulated_host_keys(spec, world)
