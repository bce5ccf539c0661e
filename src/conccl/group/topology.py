"""Where each rank of a group runs: hosts x ranks per host, from every rank's host key.

A group that spans hosts is served hierarchically (:mod:`conccl.group.hierarchical`): the
ranks of one host form a node-local group (copy engines), the ranks of equal local index on
every host a cross-node group (``torch.distributed`` with the group's backend). That needs a
layout every rank derives alike from the same host keys, and one the collectives can use
without permuting data:

- every host runs the same number of ranks (L); with unequal counts the cross-node groups
  would not pair up, so the layout is refused;
- each host's ranks are consecutive, hosts ordered by their lowest rank: rank ``n * L + l``
  is local rank ``l`` of host ``n`` (torchrun's order). Then host n's chunk of a flat
  all-gather's output is one contiguous block, and the hierarchical collectives write it in
  place (see :mod:`conccl.group.hierarchical`).

Simulated hosts (tests only): :data:`SIMULATED_HOSTS_ENV` assigns the ranks of one machine to
pretend hosts, read (:func:`simulated_hosts`) once where a group is made. ``"2x4"`` is 2 hosts of 4 ranks, node-major
(rank r on host r // 4); ``"0,0,1,1"`` names each rank's host explicitly (a layout the group
then accepts or refuses as it would real hosts). The ranks named are the default group's
(``make_group`` gives a smaller group its members' hosts). Pure: no device, no process group.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .. import env
from ..validate import InvalidArgument

SIMULATED_HOSTS_ENV = "CONCCL_SIMULATED_HOSTS"


def simulated_hosts() -> str:
    """This process's :data:`SIMULATED_HOSTS_ENV`, read through :mod:`conccl.env` (empty: none), as
    :func:`simulated_host_keys` takes it."""
    return env.get(SIMULATED_HOSTS_ENV)


@dataclass(frozen=True)
class HostLayout:
    """``num_hosts`` hosts of ``per_host`` ranks each; ``hosts[n]`` is host n's key.

    ``node_ranks(n)``: the group ranks on host n (``n * per_host ...``); ``cross_ranks(l)``: the
    ranks of local index l on every host, host by host."""

    hosts: tuple[str, ...]
    per_host: int

    def __post_init__(self):
        if not self.hosts or self.per_host < 1:
            raise InvalidArgument(f"a host layout needs at least one host of one rank, got {self!r}")

    @property
    def num_hosts(self) -> int:
        return len(self.hosts)

    @property
    def world(self) -> int:
        return self.num_hosts * self.per_host

    def host_of(self, rank: int) -> int:
        return rank // self.per_host

    def local_of(self, rank: int) -> int:
        return rank % self.per_host

    def node_ranks(self, host: int) -> tuple[int, ...]:
        return tuple(range(host * self.per_host, (host + 1) * self.per_host))

    def cross_ranks(self, local: int) -> tuple[int, ...]:
        return tuple(n * self.per_host + local for n in range(self.num_hosts))

    def __str__(self) -> str:
        return f"{self.num_hosts} hosts x {self.per_host} ranks"


def host_layout(keys) -> HostLayout:
    """The layout of a group whose rank r runs on host ``keys[r]``; InvalidArgument, in one
    line naming the hosts, for unequal rank counts or a host whose ranks are not consecutive."""
    keys = [str(k) for k in keys]
    if not keys:
        raise InvalidArgument("a group of no ranks has no host layout")
    order: list[str] = []
    count: dict[str, int] = {}
    for k in keys:
        if k not in count:
            order.append(k)
        count[k] = count.get(k, 0) + 1
    per = set(count.values())
    if len(per) > 1:
        counts = ", ".join(f"{k}: {count[k]}" for k in order)
        raise InvalidArgument(
            f"the group's hosts run unequal numbers of ranks ({counts}); conccl's hierarchical collectives pair "
            "each host's local ranks with every other host's and need the same count on every host")
    per_host = per.pop()
    for n, k in enumerate(order):
        ranks = [r for r, key in enumerate(keys) if key == k]
        if ranks != list(range(n * per_host, (n + 1) * per_host)):
            raise InvalidArgument(
                f"host {k} runs ranks {ranks}, not {n * per_host}..{(n + 1) * per_host - 1}; conccl's hierarchical "
                "collectives need each host's ranks consecutive (torchrun's order: rank = node_rank * nproc_per_node "
                "+ local_rank)")
    return HostLayout(tuple(order), per_host)


def simulated_host_keys(spec: str, world: int | None = None) -> list[str]:
    """Each rank's simulated host (``"sim<n>"``) from a :data:`SIMULATED_HOSTS_ENV` value:
    ``"HxL"`` (H hosts of L ranks, node-major) or comma-separated host numbers, one per rank.
    ``world``: the group's size, which the spec must match (None: the spec's own)."""
    text = spec.strip()
    m = re.fullmatch(r"(\d+)\s*x\s*(\d+)", text)
    if m:
        hosts, per = int(m.group(1)), int(m.group(2))
        if hosts < 1 or per < 1 or (world is not None and hosts * per != world):
            raise InvalidArgument(f"{SIMULATED_HOSTS_ENV}={spec!r} is {hosts} x {per} = {hosts * per} ranks; the group "
                                  f"has {world}")
        return [f"sim{r // per}" for r in range(hosts * per)]
    items = [x.strip() for x in text.split(",")]
    if not all(x.isdigit() for x in items):
        raise InvalidArgument(f"{SIMULATED_HOSTS_ENV}={spec!r}: expected HOSTSxRANKS (e.g. 2x4) or one host number "
                              "per rank (e.g. 0,0,1,1)")
    if world is not None and len(items) != world:
        raise InvalidArgument(f"{SIMULATED_HOSTS_ENV}={spec!r} names {len(items)} ranks' hosts; the group has {world}")
    return [f"sim{int(x)}" for x in items]
