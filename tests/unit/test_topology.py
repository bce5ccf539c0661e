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


class _World:
    group_name = "0"


class _FakeDist:
    """What make_hierarchical asks of torch.distributed, for rank ``me`` of a world of ``world``."""

    def __init__(self, me, world, backend):
        self.me, self.world, self.backend, self.made = me, world, backend, []

    def get_rank(self, group=None):
        return self.me

    def get_world_size(self, group=None):
        return self.world

    def get_process_group_ranks(self, group):
        return list(range(self.world))

    def get_backend(self, group=None):
        return self.backend

    def new_group(self, ranks, timeout=None, backend=None, use_local_synchronization=False):
        self.made.append((tuple(ranks), backend, use_local_synchronization))
        return ("pg", tuple(ranks), backend)


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_make_hierarchical_makes_every_process_group_in_one_order_on_every_rank(monkeypatch, backend):
    from conccl.group import make

    class _Node:
        world = 4
        options = None

        def __init__(self, pg):
            self.pg = pg

    orders = []
    for me in range(8):
        fake = _FakeDist(me, 8, backend)
        monkeypatch.setattr(make, "dist", fake)
        monkeypatch.setattr(make, "make_node_group", lambda pg, options: _Node(pg))
        monkeypatch.setattr(make, "HierarchicalGroup", lambda node, cross, layout, rank, **kw: (node, cross, layout))
        node, cross, layout = make.make_hierarchical(_World(), simulated_host_keys("2x4"))
        assert node.pg[1] == tuple(range(4 * (me // 4), 4 * (me // 4) + 4))
        assert cross.data[1] == (me % 4, 4 + me % 4) and cross.data[2] == backend
        assert cross.control[1] == cross.data[1] and cross.control[2] == "gloo"
        assert cross.host_staged == (backend == "gloo")
        orders.append(fake.made)
    # the whole world makes the groups: every rank the same ones, in the same order (torch's rule)
    assert all(o == orders[0] for o in orders) and not any(local for _, _, local in orders[0])
    assert len(orders[0]) == 2 + 4 + (4 if backend != "gloo" else 0)


def test_make_hierarchical_refuses_unequal_hosts_as_an_unsupported_group(monkeypatch):
    from conccl.errors import UnsupportedGroup
    from conccl.group import make

    monkeypatch.setattr(make, "dist", _FakeDist(0, 4, "nccl"))
    with pytest.raises(UnsupportedGroup, match="unequal numbers of ranks.*torch.distributed"):
        make.make_hierarchical(_World(), simulated_host_keys("0,0,0,1"))


class _SubgroupDist(_FakeDist):
    """A process group of the global ranks ``members``, seen from its rank ``me``, every rank
    with ``CONCCL_SIMULATED_HOSTS=spec``."""

    def __init__(self, me, members, world, spec):
        super().__init__(me, world, "gloo")
        self.members, self.spec = members, spec

    def get_world_size(self, group=None):
        return self.world if group is None else len(self.members)

    def get_process_group_ranks(self, group):
        return list(self.members)

    def all_gather_object(self, out, obj, group=None):
        out[:] = [dict(obj, simulated=self.spec) for _ in out]


@pytest.mark.parametrize("members,hierarchical", [((0, 1, 2, 3), ["sim0", "sim0", "sim1", "sim1"]),
                                                  ((2, 3), None), ((0, 1), None), ((1, 3), ["sim0", "sim1"])])
def test_simulated_hosts_name_the_default_groups_ranks_so_a_subgroup_takes_its_members_hosts(
        monkeypatch, members, hierarchical):
    """HSDP's shard group (2, 3) of a 2x2 world runs on one simulated host: a node group, not
    the spec refused for naming 4 ranks of a group of 2; its replicate group (1, 3) spans both."""
    from conccl.group import make

    made = []
    monkeypatch.setattr(make, "dist", _SubgroupDist(0, members, 4, "2x2"))
    monkeypatch.setattr(make.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(make, "make_node_group", lambda pg, options: made.append(("node", None)))
    monkeypatch.setattr(make, "make_hierarchical", lambda pg, keys, options: made.append(("hier", keys)))
    make.make_group(_World())
    assert made == [("hier", hierarchical) if hierarchical else ("node", None)]
