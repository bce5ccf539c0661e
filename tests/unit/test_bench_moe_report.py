"""No-device tier: ``conccl bench moe``'s report from its records (what a GPU run writes), the
routings it draws, and its configuration from the command line."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

torch = pytest.importorskip("torch")

from conccl.bench import moe  # noqa: E402
from conccl.cli import bench_moe, build_parser  # noqa: E402


def _records():
    recs = [moe.Record("random", "conccl", 1.5, 0.1, 0.75, 0.05, 6470, 31.4, 562.0, 2.3, 2.27, 0.98, 2.0, False),
            moe.Record("random", "reference", 2.9, 0.2, 2.5, 0.04, 8220, 20.2, 3554.0, 5.0, 5.0, 0.99, 5.8, False),
            moe.Record("random", "nccl_a2a", 0.28, 0.3, None, None, 8220, 208.9, 209.0, 0.49, 0.48, 0.99, 0.5)]
    layer = {"layer": {"chunks": 2, "ffn": 2048, "conccl_overlapped": {"ms": 3.0, "spread": 0.02},
                       "reference": {"ms": 6.0, "spread": 0.01}}}
    train = {"config": {"layers": 4, "dim": 2048, "ffn": 1024, "tokens_per_rank": 4096, "steps": 20}, "equal": True,
             "first_loss": 9.5, "last_loss": 0.01, "conccl": {"step_ms": 36.3, "spread": 0.4}, "reference": {}}
    return recs + [layer, train]


def test_the_report_has_every_part_and_the_json_round_trips():
    meta = {"machine_kind": "nvidia-h100-x2", "device": "NVIDIA H200", "world": 2, "date": "d", "commit": "abc",
            "nccl": "2.28.9"}
    doc = moe.document(meta, moe.MoEBenchConfig(), _records())
    assert [r["impl"] for r in doc["results"]] == ["conccl", "reference", "nccl_a2a"]
    assert doc["layer"]["chunks"] == 2 and doc["training"]["equal"] is True
    text = moe.markdown(json.loads(json.dumps(doc)))
    assert "| random | conccl | 1.500 |" in text and "| random | nccl_a2a | 0.280 |" in text
    assert "| conccl_overlapped | 3.000 | 2.0% | 0.500 |" in text  # against the reference's 6 ms
    assert "equal bit for bit" in text and "a new routing every run" in text


def test_failed_parts_are_reported_not_raised():
    recs = _records()[:3] + [{"layer": {"error": "RuntimeError: boom"}}, {"error": "ValueError: no", "equal": False}]
    text = moe.markdown(moe.document({}, moe.MoEBenchConfig(fresh_routing=False), recs))
    assert "MoE layer timing failed: RuntimeError: boom" in text and "Training failed: ValueError: no" in text
    assert "one routing" in text


@pytest.mark.parametrize("kind", moe.ROUTINGS)
def test_routings_pick_distinct_experts_and_normalised_weights(kind):
    idx, w = moe.routing(torch, kind, 512, 8, 2, 3, "cpu")
    assert idx.shape == (512, 2) and (idx[:, 0] != idx[:, 1]).all() and ((idx >= 0) & (idx < 8)).all()
    assert torch.allclose(w.sum(dim=1), torch.ones(512))
    counts = torch.bincount(idx.flatten(), minlength=8)
    if kind == "skewed":  # the first experts are the popular ones
        assert counts[0] > 3 * counts[7]
    else:
        assert counts.min() > 0.5 * counts.max()


def test_the_command_line_makes_the_configuration():
    args = build_parser().parse_args(["bench-moe", "--out", "o", "--tokens", "64", "--same-routing",
                                      "--layer-chunks", "0", "--impls", "conccl,nccl_a2a"])
    cfg = bench_moe.config(args)
    assert (cfg.tokens, cfg.fresh_routing, cfg.layer_chunks, cfg.impls) == (64, False, 0, ("conccl", "nccl_a2a"))
    assert set(asdict(cfg)) >= {"tokens", "hidden", "experts", "topk", "ffn", "train_steps", "layer_chunks"}
