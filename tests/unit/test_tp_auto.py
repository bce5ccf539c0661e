"""conccl.tp's automatic schedule, with no process: the planner picks from its candidates and
predicts positive times no longer than the serial one (the schedules run on ranks:
tests/multiproc/test_tp.py)."""
from __future__ import annotations

from conccl.planner import tp as tp_planner
from conccl.schedule.pipeline import SERIAL, Order, TPSchedule


def test_auto_picks_from_the_candidates_and_predicts_positive_times():
    c = tp_planner.choose("ag_gemm", 8192, 8192, 7168, 2)
    assert c.schedule in tp_planner.candidates(8192, 2) and c.predicted_s > 0
    assert c.predicted_s <= c.serial_s
    assert SERIAL in tp_planner.candidates(8192, 2) and TPSchedule(order=Order.RING) in tp_planner.candidates(8192, 2)
