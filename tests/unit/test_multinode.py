"""The multi-node prediction (conccl.planner.multinode, `conccl plan --nodes`): its formulas on
hand-computed cases and limits, the command's output and JSON, and docs/planner.md's FSDP table
against the script that generates it."""
from __future__ import annotations

import importlib.util
import json
import math
import pathlib

import pytest

from conccl.cli import main
from conccl.planner import multinode as mn
from conccl.planner.plan import PlanError
from conccl.planner.profile import load_profile

ROOT = pathlib.Path(__file__).resolve().parents[2]
US = 1e-6


def _links(nodes=2, gpn=4, net=10e9, ce=100e9, nccl=80e9, red=1e12, ctas=10, red_ctas=5, latencies=False) -> mn.Links:
    lat = {} if latencies else {"ce_call_s": 0.0, "nccl_base_s": 0.0, "nccl_intra_step_s": 0.0, "nccl_net_step_s": 0.0}
    return mn.Links(nodes, gpn, net, ce, nccl, red, ctas, red_ctas, **lat)


# ------------------------------------------------------------------ hand-computed cases
def test_all_gather_bandwidth_terms_by_hand():
    # 2 nodes x 4 GPUs, 8 MB gathered: chunks of 1 MB
    pr = mn.predict(_links(), "all_gather", 8_000_000)
    assert pr.whole_bytes == 8_000_000
    assert pr.flat_busbw == pytest.approx(40e9)  # min(4 x 10, 80 x 4/3) GB/s: the node's 4 NICs
    assert pr.flat_s == pytest.approx(7 / 8 * 8e6 / 40e9)  # 175 us
    net, node = pr.steps
    assert (net.where, net.ranks, net.whole_bytes, node.where, node.ranks) == ("network", 2, 2_000_000, "node", 4)
    assert net.seconds == pytest.approx(1 / 2 * 2e6 / 10e9)  # 100 us: N-1 chunks of 1 MB over the NIC
    assert node.seconds == pytest.approx(3 / 4 * 8e6 / 100e9)  # 60 us on copy engines
    assert pr.hier_s == pytest.approx(160 * US)
    assert pr.flat_sm_s == pytest.approx(10 * 175 * US) and pr.hier_sm_s == pytest.approx(10 * 100 * US)
    assert pr.sm_s_saved == pytest.approx(10 * 75 * US)
    assert pr.pipelined_bound_s == pytest.approx(100 * US)


def test_reduce_scatter_adds_the_sum_and_its_ctas():
    pr = mn.predict(_links(), "reduce_scatter", 1_000_000)  # 1 MB out per rank: 8 MB in
    assert pr.whole_bytes == 8_000_000
    node, net = pr.steps  # node first, then the network
    assert (node.where, net.where) == ("node", "network")
    assert node.sum_s == pytest.approx(5 * 2e6 / 1e12)  # L + 1 = 5 passes of F/L = 2 MB: 10 us
    assert node.seconds == pytest.approx(70 * US) and net.seconds == pytest.approx(100 * US)
    assert pr.hier_sm_s == pytest.approx(10 * 100 * US + 5 * 10 * US)
    assert pr.flat_s == pytest.approx(175 * US)


def test_all_reduce_is_rs_then_network_all_reduce_then_ag():
    pr = mn.predict(_links(), "all_reduce", 8_000_000)
    assert [(s.where, s.collective) for s in pr.steps] == [
        ("node", "reduce_scatter"), ("network", "all_reduce"), ("node", "all_gather")]
    assert pr.flat_s == pytest.approx(2 * 7 / 8 * 8e6 / 40e9)
    assert pr.steps[1].seconds == pytest.approx(2 * 1 / 2 * 2e6 / 10e9)


def test_latencies_follow_nccls_ring_model():
    links = _links(latencies=True)
    ag = mn.predict(links, "all_gather", 8_000_000)
    # 8 ranks on 2 nodes: 7 ring steps, 1 across nodes
    assert ag.flat_latency_s == pytest.approx((8.4 + 6 * 3.4 + 14) * US)
    assert ag.steps[0].latency_s == pytest.approx((8.4 + 14) * US)  # 2 ranks, one step across
    assert ag.steps[1].latency_s == pytest.approx(27 * US)  # conccl's call
    ar = mn.predict(links, "all_reduce", 8_000_000)
    assert ar.flat_latency_s == pytest.approx((8.4 + 12 * 3.4 + 2 * 14) * US)  # 14 steps, 2 across


# ------------------------------------------------------------------ limits
@pytest.mark.parametrize("coll,size", [("all_gather", 1 << 24), ("reduce_scatter", 1 << 21), ("all_reduce", 1 << 24)])
def test_one_node_reduces_to_the_node_local_time(coll, size):
    links = _links(nodes=1, gpn=8, latencies=True)
    pr = mn.predict(links, coll, size)
    assert all(s.where == "node" for s in pr.steps)
    f = pr.whole_bytes
    expect = sum(links.ce_call_s + (2 if s.collective == "all_reduce" else 1) * 7 / 8 * f / links.nvlink_bytes_per_s
                 + s.sum_s for s in pr.steps)
    assert pr.hier_s == pytest.approx(expect)
    assert pr.flat_busbw == links.nccl_nvlink_bytes_per_s  # no network in the flat ring either
    assert pr.hier_sm_s == pytest.approx(links.reduce_ctas * sum(s.sum_s for s in pr.steps))


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter", "all_reduce"])
def test_infinite_nvlink_leaves_the_network_part(coll):
    links = _links(nodes=8, gpn=8, ce=1e30, red=1e30, latencies=True)
    links = mn.Links(**{**links.__dict__, "ce_call_s": 0.0})
    pr = mn.predict(links, coll, 1 << 20 if coll == "reduce_scatter" else 1 << 26)
    (net,) = [s for s in pr.steps if s.where == "network"]
    bf = 2 * 7 / 8 if coll == "all_reduce" else 7 / 8
    assert net.transfer_s == pytest.approx(bf * (pr.whole_bytes / 8) / links.network_bytes_per_s)
    assert pr.hier_s == pytest.approx(net.seconds)
    assert pr.hier_sm_s == pytest.approx(links.nccl_ctas * net.seconds)


def test_one_gpu_per_node_has_no_node_step_and_a_network_bound_ring():
    pr = mn.predict(_links(nodes=4, gpn=1), "all_gather", 4_000_000)
    assert [s.where for s in pr.steps] == ["network"]
    assert pr.flat_busbw == 10e9 and pr.hier_s == pytest.approx(pr.flat_s)


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter", "all_reduce"])
def test_times_and_sm_time_grow_with_size(coll):
    links = mn.links_from_profile(load_profile(), 8, 8)
    preds = [mn.predict(links, coll, s) for s in (1 << 16, 1 << 20, 1 << 24, 1 << 28)]
    for a, b in zip(preds, preds[1:]):
        assert b.flat_s > a.flat_s and b.hier_s > a.hier_s and b.flat_sm_s > a.flat_sm_s and b.hier_sm_s > a.hier_sm_s


def test_more_nodes_never_speed_a_call_up():
    prof = load_profile()
    flat = [mn.predict(mn.links_from_profile(prof, n, 8), "all_gather", 1 << 29).flat_s for n in (1, 2, 8, 64)]
    assert flat[1:] == sorted(flat[1:])  # (one node is NCCL over NVLink alone: no bound by 2 nodes')
    hier = [mn.predict(mn.links_from_profile(prof, n, 8), "all_gather", 1 << 29).hier_s for n in (1, 2, 8, 64)]
    assert hier == sorted(hier)


# ------------------------------------------------------------------ inputs
def test_defaults_come_from_the_profile_and_are_named():
    prof = load_profile()
    links = mn.links_from_profile(prof, 2, 8)
    assert links.network_bytes_per_s == 50e9 and links.nvlink_bytes_per_s == prof.nvlink_bytes_per_s
    assert links.nccl_ctas == 32 and links.reduce_ctas == prof.sm_count // 2
    assert links.reduce_bytes_per_s == pytest.approx(mn.REDUCE_HBM_SHARE * prof.hbm_bytes_per_s)
    ratio = prof.collectives["nccl"]["all_gather"]["bus_bytes_per_s"] / prof.nvlink_bytes_per_s
    given = mn.links_from_profile(prof, 2, 8, network_bytes_per_s=25e9, nvlink_bytes_per_s=200e9, nccl_ctas=8)
    assert (given.network_bytes_per_s, given.nvlink_bytes_per_s, given.nccl_ctas) == (25e9, 200e9, 8)
    assert given.nccl_nvlink_bytes_per_s == pytest.approx(200e9 * ratio)
    assert given.source["network"] == "given" and "400" in links.source["network"]


@pytest.mark.parametrize("change,match", [
    ({"nodes": 1, "gpus_per_node": 1}, "one rank"), ({"nodes": 0}, "nodes"), ({"network_bytes_per_s": -1.0}, "network"),
    ({"nvlink_bytes_per_s": math.inf}, "nvlink"), ({"nccl_ctas": 2.5}, "nccl_ctas"), ({"ce_call_s": -1e-6}, "ce_call_s")])
def test_links_refuse_what_is_not_a_job(change, match):
    with pytest.raises(PlanError, match=match):
        mn.Links(**{**_links().__dict__, **change})


def test_all_to_all_and_too_small_a_size_are_refused():
    with pytest.raises(PlanError, match="all_gather, reduce_scatter, all_reduce"):
        mn.predict(_links(), "all_to_all", 1 << 20)
    with pytest.raises(PlanError, match="at least 8"):
        mn.predict(_links(), "all_gather", 7)


# ------------------------------------------------------------------ the command
def test_plan_nodes_prints_a_labelled_prediction(capsys):
    assert main(["plan", "--nodes", "8", "--size", "464M"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PREDICTION") and "8 node(s) x 8 GPUs = 64 ranks" in out
    pr = mn.predict(mn.links_from_profile(load_profile(), 8, 8, size=464 << 20), "all_gather", 464 << 20)
    assert f"{1e3 * pr.flat_s:.3f} ms" in out and f"{1e3 * pr.hier_s:.3f} ms" in out
    assert f"{1e3 * pr.sm_s_saved:.2f} SM-ms per GPU per call" in out and "not built" in out


def test_plan_nodes_json(capsys, tmp_path):
    argv = ["plan", "--nodes", "2", "--gpus-per-node", "4", "--collective", "reduce_scatter", "--size", "1M",
            "--network-gbps", "200", "--nvlink-gbps", "2400", "--nccl-ctas", "16"]
    assert main([*argv, "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == mn.FORMAT and doc["prediction"] is True
    assert doc["links"]["network_bytes_per_s"] == 25e9 and doc["links"]["nvlink_bytes_per_s"] == 300e9
    assert doc["links"]["nccl_ctas"] == 16
    r = doc["result"]
    assert (r["world"], r["collective"], r["size"], r["whole_bytes"]) == (8, "reduce_scatter", 1 << 20, 8 << 20)
    assert r["sm_s_saved"] == pytest.approx(r["flat_sm_s"] - r["hier_sm_s"])
    assert r["hier_s"] == pytest.approx(sum(s["seconds"] for s in r["steps"]))
    path = tmp_path / "p.json"
    assert main([*argv, "--json", str(path)]) == 0
    assert "PREDICTION" in capsys.readouterr().out and json.loads(path.read_text())["result"] == r


# ------------------------------------------------------------------ the docs' table
def test_the_docs_fsdp_table_is_the_scripts_output():
    spec = importlib.util.spec_from_file_location("multinode_fsdp_table", ROOT / "scripts" / "multinode_fsdp_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shape = script.ModelShape()
    assert script.block_bytes(shape, 16) == 2 * shape.parameters() // shape.layers  # no padding at these worlds
    want = script.markdown(shape, script.step_rows(shape, [2, 8, 64], 8), 8)
    doc = (ROOT / "docs" / "planner.md").read_text()
    start = doc.index("<!-- multinode-fsdp-table")
    table = doc[doc.index("\n", start) + 1:doc.index("<!-- end multinode-fsdp-table")].strip()
    assert table == want.strip()


def test_fsdp2_pads_dim_0_to_the_world():
    spec = importlib.util.spec_from_file_location("multinode_fsdp_table", ROOT / "scripts" / "multinode_fsdp_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shape = script.ModelShape(dim=6, ffn=10, heads=2, layers=1)
    # qkv 18 x 6, out 6 x 6, gate_up 20 x 6, down 6 x 10, two norms of 6; world 4: rows to 20, 8, 20, 8, 8, 8
    assert script.block_bytes(shape, 4) == 2 * (20 * 6 + 8 * 6 + 20 * 6 + 8 * 10 + 8 + 8)


def test_the_study_sweep_is_predict_at_every_fitting_size_of_every_collective():
    import dataclasses

    p = load_profile()
    rows = mn.sweep(p, 2, 8)
    assert [(pr.collective, pr.size) for _, pr in rows] == [(c, s) for c in mn.HIERARCHY for s in mn.STUDY_SIZES]
    for links, pr in rows:  # each row is the single-call model, links made for that call
        want = mn.predict(mn.links_from_profile(p, 2, 8, collective=pr.collective, size=pr.size), pr.collective, pr.size)
        assert pr == want and links.world == 16
    # a GPU too small for the largest calls drops those rows, not the others
    small = dataclasses.replace(p, memory_bytes=8 << 30)
    kept = [(pr.collective, pr.size) for _, pr in mn.sweep(small, 2, 8)]
    assert ("reduce_scatter", 1 << 30) not in kept and ("all_gather", 1 << 30) in kept  # 16 GiB in, 1 GiB out
    text = mn.sweep_markdown(rows)
    assert text.startswith("# PREDICTION: 2 node(s) x 8 GPUs") and text.count("\n| ") == 2 + len(rows)


def test_study_predict_nodes_writes_multinode_beside_the_report(tmp_path, capsys):
    out = tmp_path / "st"
    argv = ["study", "--predict", "--quick", "--out", str(out), "--nodes", "4", "--gpus-per-node", "2",
            "--network-gbps", "200"]
    assert main(argv) == 0
    doc = json.loads((out / "multinode.json").read_text())
    assert doc["prediction"] is True and doc["format"] == mn.SWEEP_FORMAT
    first = doc["results"][0]
    assert first["links"]["nodes"] == 4 and first["links"]["gpus_per_node"] == 2 and first["links"]["world"] == 8
    assert math.isclose(first["links"]["network_bytes_per_s"], mn.gbps(200))
    assert "PREDICTION" in (out / "multinode.md").read_text() and (out / "report.md").exists()
    assert "multinode.md" in capsys.readouterr().out


@pytest.mark.parametrize("argv,words", [
    (["--gpus-per-node", "4"], "without --nodes"),
    (["--nodes", "1", "--gpus-per-node", "1"], "one rank"),
])
def test_study_nodes_flags_refused_with_one_line(tmp_path, capsys, argv, words):
    assert main(["study", "--predict", "--quick", "--out", str(tmp_path / "st"), *argv]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "st" / "report.md").exists()  # refused before the study ran
