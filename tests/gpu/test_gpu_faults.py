"""GPU tier of the fault handling: a peer SIGKILLed or stalled during a 1 GiB all-gather, and
a soak. The workers are the fault benchmark's (conccl.bench.faults), with shorter settings."""
from __future__ import annotations

from conccl.bench.faults import run_peer_fault, soak_worker


def _survivors(result):
    return [r for r in result["ranks"] if r is not None and r["role"] == "survivor"]


def test_a_peer_killed_during_a_1GiB_all_gather():
    res = run_peer_fault("killed", timeout_s=5.0)
    victim = res["world"] - 1
    assert res["ranks"][victim] is None and res["exitcodes"][victim] == -9
    survivors = _survivors(res)
    assert len(survivors) == res["world"] - 1
    for r in survivors:
        assert r["warm_ok"] and r["error"] == "CollectiveTimeout", r
        assert r["missing"] == [victim] and r["exited"] == [victim], r
        assert r["detect_s"] <= res["timeout_s"] + 1.0, r
        assert r["stream_ok"] and r["next_call_error"] == "GroupBroken" and r["next_call_s"] < 0.5, r
        assert res["exitcodes"][r["rank"]] == 0, res["exitcodes"]  # and the survivors exit cleanly


def test_a_peer_stalled_past_the_timeout():
    res = run_peer_fault("stalled", timeout_s=2.0, stall_s=4.0)
    victim = res["world"] - 1
    for r in _survivors(res):
        assert r["error"] == "CollectiveTimeout" and r["missing"] == [victim] and r["exited"] == [], r
        assert 2.0 <= r["detect_s"] <= 3.0, r
        assert r["stream_ok"] and r["next_call_error"] == "GroupBroken", r
    stalled = res["ranks"][victim]
    # its part ran after the others gave up: it must not report success
    assert stalled["error"] == "GroupBroken" and "timed out waiting for rank(s)" in stalled["message"], stalled
    assert res["exitcodes"] == [0] * res["world"], res["exitcodes"]


def test_soak_mixed_calls_no_wrong_value_no_growth():
    from conccl.launch import run_per_gpu

    for r in run_per_gpu(soak_worker, 2000):
        assert r["wrong"] == 0, r
        assert min(r["kinds"].values()) > 0 and "reduce_scatter" in r["kinds"] and "all_reduce" in r["kinds"], r
        assert abs(r["device_growth_bytes"]) < (1 << 20), r
        assert r["at_end"]["threads"] == r["at_100"]["threads"] and r["at_end"]["watchdog_in_flight"] == 0, r
