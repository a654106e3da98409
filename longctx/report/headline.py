"""The headline table: per configuration and length, median TTFT and decode rate, and the speedup
of each against the baseline configuration at the same length (the ratio of the trials' geometric means), with
its interval, its verdict and the trials on each side
(longctx.analysis.compare: "faster", "slower", "no measurable difference" where the interval includes 1,
"no interval" where there is none).

`headline` is the one source of that table for the PDF, the Markdown twin and a plan's Results
section; each renders the same rows and columns, only the markup differs.
"""

from __future__ import annotations

import pandas as pd

from ..analysis.compare import METHOD, MIN_TRIALS, VERDICTS, against_baseline
from ..analysis.fits import SETTINGS
from ..core.numbers import ratio
from .numbers import is_number

# (key, header, kind): the table's columns, in order, with the format kind of each (longctx.report.numbers).
# A "speedup" column's row also carries `{key}_ci` (its interval) and the verdict (SPEEDUPS: the key of each).
COLUMNS = (
    ("configuration", "configuration", None),
    ("length", "L (tokens)", "int"),
    ("ttft_s", "TTFT (ms)", "ttft_ms"),
    ("decode_tok_s", "decode (tok/s)", "decode_tok_s"),
    ("ttft_speedup", "TTFT speedup (×)", "speedup"),
    ("decode_speedup", "decode speedup (×)", "speedup"),
)
# speedup column: (metric of longctx.analysis.compare.METRICS, key of its verdict in a row)
SPEEDUPS = {"ttft_speedup": ("ttft", "ttft_verdict"), "decode_speedup": ("decode", "decode_verdict")}


def choose_baseline(names: list[str], wanted: str | None) -> str | None:
    """The configuration others are compared with: `wanted` when the data has it, else the first name."""
    if wanted in names:
        return wanted
    return names[0] if names else None


def headline(med: pd.DataFrame, baseline: str | None, names: list[str] | None = None,
             results: pd.DataFrame | None = None, settings: dict | None = None) -> dict:
    """Rows of the headline table from the per-length medians (longctx.analysis.tables.medians).

    TTFT speedup is the baseline's TTFT over this configuration's (above 1: faster prefill); decode
    speedup is this configuration's decode rate over the baseline's, at the same length. A length
    the baseline did not measure has no speedup. The baseline's rows come first, then the others
    in `names` order (default: sorted). A row's `partial` marks a length measured by fewer successful
    trials (`ok`) than configured (`configured`).

    With the trials (`results`: results.csv's rows) each speedup of a configuration other than the
    baseline is the ratio of geometric means of the two sides' trials, with its interval (`ttft_speedup_ci`,
    `decode_speedup_ci`: [low, high] or None), verdict (`ttft_verdict`, `decode_verdict`) and trials
    (`ttft_speedup_n`: [this configuration's, the baseline's]): longctx.analysis.compare.against_baseline, with
    `settings` (fits.json's: confidence). The baseline's own rows have none (None)."""
    names = list(names) if names is not None else sorted(med["configuration"].unique())
    base = choose_baseline(names, baseline)
    st = {**SETTINGS, **(settings or {})}
    compared = against_baseline(results, base, st) if results is not None and base else {}
    order = ([base] if base else []) + [n for n in names if n != base]
    ref = med[med["configuration"] == base].set_index("length") if base else pd.DataFrame()
    rows = []
    for name in order:
        for r in med[med["configuration"] == name].sort_values("length").to_dict("records"):
            b = ref.loc[r["length"]] if r["length"] in ref.index else None
            ttft, rate = r.get("ttft_s"), r.get("decode_tok_s")
            rows.append({
                "configuration": name,
                "length": int(r["length"]),
                "ttft_s": ttft if is_number(ttft) else None,
                "decode_tok_s": rate if is_number(rate) else None,
                "ttft_speedup": ratio(b["ttft_s"], ttft) if b is not None else None,
                "decode_speedup": ratio(rate, b["decode_tok_s"]) if b is not None else None,
                "is_baseline": name == base,
                # fewer successful trials than configured (longctx.analysis.tables.medians): marked in the table
                "partial": bool(r.get("partial", False)),
                "ok": int(r["ok"]) if is_number(r.get("ok")) else None,
                "configured": int(r["configured"]) if is_number(r.get("configured")) else None,
            })
            c = compared.get((name, int(r["length"]))) or {}
            for key, (metric, verdict_key) in SPEEDUPS.items():
                one = c.get(metric) if rows[-1][key] is not None else None
                if one:  # the compared speedup: the ratio its interval is of (geometric means of the trials)
                    rows[-1][key] = one["ratio"]
                rows[-1][f"{key}_ci"] = one["ci"] if one else None
                rows[-1][verdict_key] = one["verdict"] if one else None
                rows[-1][f"{key}_n"] = [one["trials"], one["baseline_trials"]] if one else None
    verdicts = [r[v] for r in rows for _, v in SPEEDUPS.values() if r[v]]
    return {"baseline": base, "requested_baseline": baseline, "columns": [list(c) for c in COLUMNS], "rows": rows,
            # how the intervals were made, and how many speedups each verdict has
            "intervals": {"method": METHOD, "min_trials": MIN_TRIALS, "confidence": float(st["confidence"]),
                          "compared": bool(verdicts),
                          "verdicts": {v: verdicts.count(v) for v in VERDICTS}}}


def compact(h: dict) -> dict:
    """Page one's table: one row per configuration at the longest length every configuration measured with a TTFT,
    in full where they share one (its medians and speedups, as the headline's rows have them); where no length is shared, each configuration's
    longest. {length (None where they differ), rows}."""
    rows = [r for r in h.get("rows") or [] if r.get("ttft_s") is not None]
    names = list(dict.fromkeys(r["configuration"] for r in rows))
    shared = set.intersection(*({r["length"] for r in rows if r["configuration"] == n} for n in names)) if names else set()
    full = {L for L in shared if not any(r["partial"] for r in rows if r["length"] == L)}
    if shared:
        at = max(full or shared)  # the longest every configuration measured in full, where there is one
        return {"length": at, "rows": [r for r in rows if r["length"] == at]}
    return {"length": None, "rows": [max((r for r in rows if r["configuration"] == n), key=lambda r: r["length"]) for n in names]}
