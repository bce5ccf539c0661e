"""No-device tier: a group's defaults read from the environment where an Options is made
(conccl.group.options, through conccl.env), and the board row codec's shape (conccl.group.row)."""
from __future__ import annotations

import pytest

from conccl.errors import InvalidArgument
from conccl.group import row
from conccl.group.options import Options


@pytest.mark.parametrize("value, on", [(None, True), ("", True), ("spin_waits", True), ("post_settled", False),
                                       ("settled_graphs, post_settled", False)])
def test_conccl_disable_post_settled_makes_every_call_wait_for_every_row(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("CONCCL_DISABLE", raising=False)
    else:
        monkeypatch.setenv("CONCCL_DISABLE", value)
    assert Options().post_settled is on


def test_a_bad_one_shot_limit_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("CONCCL_ONE_SHOT_BELOW", "-1K")
    with pytest.raises(InvalidArgument, match="CONCCL_ONE_SHOT_BELOW must be a size"):
        Options()


def test_a_row_is_its_fixed_fields_then_what_each_rank_sends_and_receives():
    assert row.board_row_len(3) == row.NFIXED + 6
    flags = [row.FLAG_SYM_IN, row.FLAG_SYM_OUT, row.FLAG_IN_PLACE, row.FLAG_GRAPH, row.FLAG_ONE_SHOT]
    assert sum(flags) == 31 and all(f & (f - 1) == 0 for f in flags)  # one bit each
