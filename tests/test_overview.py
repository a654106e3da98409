"""The overview figure of page one: TTFT and decode rate against L for every configuration, side by
side, from synthetic data with a partial length (tests/report_data.py)."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from longctx.report.figures import FIGURES, FORMATS
from longctx.report.figures.measured import overview, plot_all

from .conftest import ROOT
from .report_data import LAWS, write_data

STYLE = ROOT / "templates" / "plot.mplstyle"
PARTIAL = {("fast_kv", 64000): (1, 1.4)}  # 1 of its 3 trials succeeded


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    paths = write_data(tmp_path_factory.mktemp("overview"), partial=PARTIAL)
    return {"paths": paths, "df": pd.read_csv(paths["results_csv"]), "analysis": json.loads(paths["fits_json"].read_text()),
            "provenance": json.loads(paths["provenance_json"].read_text())}


def drawn(data):
    plt.style.use(str(STYLE))
    return overview(data["df"], data["analysis"], data["provenance"])


def points(ax, name: str) -> dict[float, tuple[float, bool]]:
    """The medians drawn for name on ax: length -> (value, hollow)."""
    out = {}
    for line in ax.lines:
        if line.get_gid() in (f"{name} median", f"{name} median partial"):
            for x, y in zip(line.get_xdata(), line.get_ydata()):
                out[float(x)] = (float(y), line.get_gid().endswith("partial"))
    return out


def test_the_workflow_makes_the_overview_in_every_format(data, tmp_path):
    assert "overview" in FIGURES  # rules/report.smk's plot_figures expands FIGURES for each of FORMATS
    written = plot_all(data["paths"]["results_csv"], data["paths"]["fits_json"], STYLE, tmp_path,
                       data["paths"]["itl_depth_csv"], data["paths"]["provenance_json"])
    for ext in FORMATS:
        assert tmp_path / f"overview.{ext}" in written and (tmp_path / f"overview.{ext}").stat().st_size > 0


def test_two_panels_on_log_length_axes_with_a_fit_per_configuration(data):
    fig = drawn(data)
    left, right = fig.axes
    assert left.get_xscale() == right.get_xscale() == "log" and left.get_yscale() == "log"
    assert right.get_yscale() == "linear" and right.get_ylim()[0] == 0
    for ax in (left, right):
        fits = [line.get_gid() for line in ax.lines if (line.get_gid() or "").endswith(" fit")]
        assert sorted(fits) == sorted(f"{name} fit" for name in LAWS)
        assert len(ax.collections) == len(LAWS)  # a band per fit
    plt.close(fig)


def test_the_markers_are_the_medians_of_the_ok_trials_hollow_where_partial(data):
    fig = drawn(data)
    left, right = fig.axes
    df = data["df"]
    ok = df[df["status"] == "ok"]
    for name in LAWS:
        g = ok[ok["configuration"] == name]
        for ax, col in ((left, "ttft_s"), (right, "decode_tok_s")):
            by_hand = {float(L): float(np.median(g[g["length"] == L][col])) for L in sorted(g["length"].unique())}
            got = points(ax, name)
            assert sorted(got) == sorted(by_hand)
            assert [got[L][0] for L in sorted(got)] == pytest.approx([by_hand[L] for L in sorted(by_hand)], rel=1e-12)
            # fast_kv's 64,000 had 1 of 3 trials; base's had its 3 (and a fourth that failed): not partial
            assert {L for L, (_, hollow) in got.items() if hollow} == ({64000.0} if name == "fast_kv" else set())
    hollow = next(line for line in right.lines if line.get_gid() == "fast_kv median partial")
    assert hollow.get_markerfacecolor() == "white"
    plt.close(fig)


def test_one_legend_of_the_configurations_and_no_note_in_the_figure(data):
    """What the marks are is page one's caption (issue 56): a note in the legend's title, one long line, made the
    figure wider and so smaller on the page (tests/test_report.py reads its size as printed)."""
    fig = drawn(data)
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == sorted(LAWS)
    assert legend.get_title().get_text() == ""
    plt.close(fig)


def test_a_regime_change_is_marked_between_the_lengths(data):
    analysis = json.loads(json.dumps(data["analysis"]))
    analysis["configurations"]["base"]["decode"]["regime_change"] = {"fitted_up_to": 16000, "from_length": 64000}
    plt.style.use(str(STYLE))
    fig = overview(data["df"], analysis, data["provenance"])
    left, right = fig.axes
    (mark,) = [line for line in right.lines if line.get_gid() == "regime decode"]
    assert list(mark.get_xdata()) == pytest.approx([32000, 32000])
    assert not [line for line in left.lines if (line.get_gid() or "").startswith("regime")]
    # the fitted curve is drawn whole: it is the fit of every length
    fit = next(line for line in right.lines if line.get_gid() == "base fit")
    assert fit.get_xdata().max() == pytest.approx(64000)
    plt.close(fig)
