"""The study's figures read at a glance: no series hidden behind another, axes that start where a
reader expects, bars with their values, and a prediction's every title saying so."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from conccl.cli import main  # noqa: E402
from conccl.study import figures  # noqa: E402
from conccl.study.results import load_results  # noqa: E402

DRAWN = (figures.efficiency_per_strategy, figures.by_group, figures.gemm_sm_loss, figures.collective_ctas,
         figures.memory_bandwidth, figures.ideal_speedup)


@pytest.fixture(scope="module")
def prediction(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig") / "study"
    assert main(["study", "--predict", "--out", str(out)]) == 0
    return out, load_results(out)


def _titles(fig) -> list[str]:
    return [t for t in [fig._suptitle.get_text() if fig._suptitle else ""] + [a.get_title() for a in fig.axes] if t]


def test_every_figure_is_drawn_and_a_prediction_says_so_in_its_title(prediction):
    out, res = prediction
    assert sorted(p.name for p in (out / "figures").glob("*.png")) == sorted(f.__name__ + ".png" for f in DRAWN)
    for fn in DRAWN:
        fig = fn(res, plt, "PREDICTION - ")
        assert _titles(fig)[0].startswith("PREDICTION - "), fn.__name__
        plt.close(fig)


def test_gemm_sm_loss_gives_each_gemm_its_own_panel(prediction):
    _, res = prediction
    gemms = {r.gemm for r in res.gemm_sm_loss}
    fig = figures.gemm_sm_loss(res, plt, "")
    panels = [a for a in fig.axes if a.get_visible()]
    assert len(panels) == len(gemms)
    assert {a.get_title().split()[0] for a in panels} == gemms
    # In a prediction GEMMs of one class share a curve: still one coloured line per panel.
    for a in panels:
        assert sum(1 for ln in a.get_lines() if ln.get_color() == "tab:blue") == 1
    plt.close(fig)


def test_speedup_bars_start_at_the_serial_run_and_efficiency_at_zero(prediction):
    _, res = prediction
    fig = figures.by_group(res, plt, "")
    eff, spd = fig.axes
    assert eff.get_ylim()[0] == 0
    assert all(b.get_y() == pytest.approx(1.0) for b in spd.patches)  # bars grow from 1.0 = serial
    assert spd.get_ylim()[0] <= 1.0 <= spd.get_ylim()[1]
    plt.close(fig)


def test_bandwidth_and_strategy_bars_carry_their_values(prediction):
    _, res = prediction
    for fn in (figures.memory_bandwidth, figures.efficiency_per_strategy):
        fig = fn(res, plt, "")
        for ax in fig.axes:
            bars = [p for p in ax.patches if p.get_width() > 0 and p.get_height() > 0]
            labels = [t for t in ax.texts if t.get_text()]
            assert bars and len(labels) == len(bars), fn.__name__
        plt.close(fig)
