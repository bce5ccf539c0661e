"""No device, one process: the host board's posts (rows published without waiting for the
peers', ``HostBoard.post``), with two ranks' boards on one shared segment driven in turn. A
rank runs ahead up to the ring's pages and no further; a posted row is compared with what the
peers published for that exchange, a difference raising PostedMismatch on the posting rank."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from conccl.group.board import PAGES, HostBoard, PostedMismatch
from conccl.errors import CollectiveError, CollectiveTimeout


@pytest.fixture
def boards():
    name = f"conccl_test_post_{os.getpid()}"
    b0 = HostBoard(name, 0, 2, 3, create=True)
    b1 = HostBoard(name, 1, 2, 3, create=False)
    yield b0, b1
    b1.close()
    b0.close()


def _rows(c, mine=7, theirs=8):
    return np.array([[c, mine, 0], [c, theirs, 0]], dtype=np.int64)


def test_posts_run_ahead_up_to_the_ring_then_wait_for_the_slowest_peer(boards):
    b0, b1 = boards
    for c in range(1, PAGES + 1):
        b0.post([c, 7, 0], _rows(c), "x", c, 1.0)
    assert b0.posts == PAGES and b0.pending_posts == PAGES
    with pytest.raises(CollectiveTimeout) as e:  # the next would overwrite a page rank 1 has not read
        b0.post([PAGES + 1, 7, 0], _rows(PAGES + 1), "x", PAGES + 1, 0.05)
    assert e.value.missing == [1] and b0.count == PAGES  # nothing published
    rows = b1.exchange([1, 8, 0], "x", 1.0)  # rank 1 reads exchange 1: its page may be reused
    assert rows.tolist() == _rows(1).tolist() and b1.last_posted.tolist() == [True, False]
    b0.post([PAGES + 1, 7, 0], _rows(PAGES + 1), "x", PAGES + 1, 1.0)
    assert b0.pending_posts == PAGES  # exchange 1 compared (alike) and dropped, PAGES + 1 added


def test_a_posted_row_the_peers_did_not_match_raises_where_it_was_posted(boards):
    b0, b1 = boards
    b0.post([1, 7, 0], _rows(1), "conccl all_gather", 1, 1.0)
    b0.post([2, 7, 0], _rows(2), "conccl all_gather", 2, 1.0)
    b0.check_posted()  # nothing published by rank 1 yet: nothing to compare
    b1.exchange([1, 8, 0], "x", 1.0)
    assert b0.posted_mismatch() is None
    b1.exchange([2, 9, 0], "x", 1.0)  # another call than rank 0 assumed
    found = b0.posted_mismatch()
    assert isinstance(found, PostedMismatch) and found.ranks == [1] and found.seq == 2
    assert b0.pending_posts == 2  # posted_mismatch changes nothing
    with pytest.raises(PostedMismatch) as e:
        b0.check_posted()
    assert isinstance(e.value, CollectiveError) and "rank(s) 1 made another call" in str(e.value)
    assert "sequence number 2" in str(e.value) and b0.pending_posts == 1  # exchange 1 matched
    back = pickle.loads(pickle.dumps(e.value))
    assert back.ranks == [1] and str(back) == str(e.value)


def test_an_exchange_compares_every_earlier_post_before_it_publishes(boards):
    b0, b1 = boards
    b0.post([1, 7, 0], _rows(1), "x", 1, 1.0)
    b1.exchange([1, 5, 0], "x", 1.0)  # rank 1 made another call at exchange 1
    with pytest.raises(PostedMismatch) as e:
        b0.exchange([2, 7, 0], "x", 1.0)
    assert e.value.seq == 1 and e.value.ranks == [1] and b0.count == 1  # found before publishing


def test_a_rank_that_ran_ahead_and_then_waits_in_an_exchange_lets_its_peer_catch_up(boards):
    """Rank 0 posts as far as the ring lets it, then makes a call that exchanges: while it
    waits for rank 1's row it compares its posts as rank 1 publishes them, so its consumed
    count moves and rank 1 can publish every exchange up to that one."""
    import threading

    b0, b1 = boards
    for c in range(1, PAGES + 1):
        b0.post([c, 7, 0], _rows(c, 7, 7), "x", c, 1.0)
    b1.exchange([1, 7, 0], "x", 1.0)
    b0.post([PAGES + 1, 7, 0], _rows(PAGES + 1, 7, 7), "x", PAGES + 1, 1.0)
    b1.exchange([2, 7, 0], "x", 1.0)
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("rows", b0.exchange([PAGES + 2, 7, 0], "x", 10.0)))
    waiter.start()
    for c in range(3, PAGES + 3):  # rank 1 catches up with the same calls
        b1.exchange([c, 7, 0], "x", 10.0)
    waiter.join(15.0)
    assert not waiter.is_alive() and got["rows"].tolist() == _rows(PAGES + 2, 7, 7).tolist()
    assert b0.pending_posts == 0 and int(b0._consumed[0]) == PAGES + 2
