"""Names of the report's figures, and where page one's marks a regime change (light: the workflow reads them when it parses its rules)."""

# overview: page one's TTFT and decode rate side by side
FIGURES = ("overview", "ttft", "decode_rate", "step_time", "itl_depth", "drafting")
# made by `longctx plot-analysis`, and by `longctx plot` given the planner (the plot_figures rule)
ANALYSIS_FIGURES = ("roofline", "residuals", "extrapolation", "planner", "prediction")
# made by `longctx plot-load` (data/load.json and data/load_metrics.csv; longctx.report.figures.load)
LOAD_FIGURES = ("load_latency", "interference", "load_metrics", "frontier")
# made by `longctx plot-prefix` (data/prefix_fits.json; longctx.report.figures.prefix)
PREFIX_FIGURES = ("prefix_ttft", "prefix_saving", "prefix_conversation")
# the figures of the data, all four kinds above: `longctx plot` with every input (the plot_figures rule)
DATA_FIGURES = FIGURES + ANALYSIS_FIGURES + LOAD_FIGURES + PREFIX_FIGURES
# made by `longctx plot-history` (report/history.json, which the render step writes; longctx.report.figures.history)
HISTORY_FIGURES = ("history",)
# the formats each figure is saved in (PDF for LaTeX, PNG for Markdown): the files the plot rules expect
FORMATS = ("pdf", "png")


def regime_places(fits: dict, names) -> list[tuple[str, int, int]]:
    """Where the configurations' regimes change, once per place: (fit kind, the last length its model fits, the
    first it misses), from fits.json's configurations. The overview's dotted verticals, and what page one's
    caption says of them."""
    return sorted({(kind, rc["fitted_up_to"], rc["from_length"]) for name in names for kind in ("prefill", "decode")
                   if (rc := ((fits.get(name) or {}).get(kind) or {}).get("regime_change"))})
