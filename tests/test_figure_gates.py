"""Figures follow the gates and read at any range (issue 33, item 2): a fit that fails its quality gate
(longctx.analysis.bounds.quality, the decision the text follows) is drawn dashed, without its band, its legend
entry saying it is not used; a log length axis over a narrow range labels 1, 2 and 5 times the powers of ten and
leaves the other ticks unlabelled, so that no two labels run into each other."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from longctx.report.figures.measured import ttft_panel  # noqa: E402
from longctx.report.figures.style import NOT_USED, length_axis  # noqa: E402

STYLE = {"color": "C0", "linestyle": "-", "marker": "o"}
MED = pd.DataFrame({"configuration": "c", "length": [512, 1024, 2048, 4096], "ttft_s": [0.1, 0.2, 0.4, 0.8]})
PREFILL = {"a_s": 0.0, "b_s_per_token": 2e-4, "c_s_per_token2": 0.0}


def drawn(quality: dict | None):
    fig, ax = plt.subplots()
    fit = {"prefill": PREFILL, "quality": {"prefill": quality} if quality else {}}
    ttft_panel(ax, "c", STYLE, MED, fit, np.geomspace(256, 8192, 20))
    (line,) = [x for x in ax.get_lines() if x.get_gid() == "c fit"]
    out = (line.get_linestyle(), line.get_label(), len(ax.collections))
    plt.close(fig)
    return out


def test_a_fit_that_fails_its_gate_is_drawn_dashed_and_labelled_not_used():
    style, label, bands = drawn({"usable": False, "problems": ["R² is 0.30, below the 0.8 required"]})
    assert style == "--" and label == "c" + NOT_USED and bands == 0
    style, label, _ = drawn({"usable": True, "problems": []})
    assert style == "-" and label == "c fit"


def test_a_narrow_log_axis_labels_only_ticks_that_do_not_overlap():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([512, 7000], [1, 2])
    length_axis(ax, [512, 1024, 2048, 4096, 7000])
    fig.canvas.draw()
    lo, hi = ax.get_xlim()
    labels = [t for t in ax.get_xticklabels() + ax.get_xticklabels(minor=True)
              if t.get_text() and lo <= t.get_position()[0] <= hi]
    boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: b.x0)
    assert [t.get_text() for t in sorted(labels, key=lambda t: t.get_window_extent().x0)] == ["500", "1k", "2k", "5k"]
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:]))
    plt.close(fig)
