"""Tables of the measurements: the single-request rows, medians per length, concurrency, step time, and
the lengths measured by fewer successful trials than configured (partial lengths)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd


def single(df: pd.DataFrame) -> pd.DataFrame:
    """The single-request trials (concurrency 1): what the scaling models and the main tables use."""
    return df[df["concurrency"].fillna(1) == 1] if "concurrency" in df else df


def ok_rows(df: pd.DataFrame, contended: bool = False) -> pd.DataFrame:
    """The successful single-request trials: what the medians, the speedups and their verdicts take. A trial whose
    server got markedly less of its device (`contended`: longctx.analysis.aggregate.flag_contended) is left out where
    its configuration has an uncontended one at that length (else it stands, and the report says so); contended=True
    keeps every one (the fits weigh them themselves)."""
    df = single(df)
    ok = df[(df["status"] == "ok") & df["ttft_s"].notna()]
    if contended or "contended" not in ok or not ok["contended"].eq(True).any():
        return ok
    flagged = ok["contended"].eq(True)
    return ok[~flagged | standing(ok, flagged, ("configuration", "length"))]


def standing(rows: pd.DataFrame, flagged: pd.Series, keys: tuple[str, ...]) -> pd.Series:
    """The flagged rows whose group (the same values of `keys`) has no row unflagged: where nothing else was measured,
    they stand (ok_rows' contended trials; longctx.analysis.fits._trusted's, where a fit has too few lengths)."""
    clean = set(map(tuple, rows.loc[~flagged, list(keys)].itertuples(index=False)))
    alone = pd.Series([tuple(x) not in clean for x in rows[list(keys)].itertuples(index=False)], index=rows.index, dtype=bool)
    return flagged & alone


def failure_reasons(rows: pd.DataFrame) -> list[str]:
    """The reasons of the rows that did not succeed (status other than ok), the most frequent first (then
    alphabetically), each with its count where it is more than one: ["timeout (3)", "HTTP 500"]."""
    bad = rows[~rows["status"].eq("ok")]
    counts = bad["reason"].fillna("no reason given").astype(str).value_counts(sort=False)
    return [r if c == 1 else f"{r} ({c})" for r, c in sorted(counts.items(), key=lambda x: (-x[1], x[0]))]


def concurrency_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per configuration, length and concurrency: median TTFT and per-request decode rate, and the
    median of the batches' overall output rate."""
    if "concurrency" not in df:
        return pd.DataFrame()
    ok = df[(df["status"] == "ok") & df["ttft_s"].notna()]
    if not (ok["concurrency"] > 1).any():
        return pd.DataFrame()
    return ok.groupby(["configuration", "length", "concurrency"], sort=True).agg(
        requests=("status", "size"), ttft_s=("ttft_s", "median"), decode_tok_s=("decode_tok_s", "median"),
        batch_output_tok_s=("batch_output_tok_s", "median"),
    ).reset_index()


def step_seconds(df: pd.DataFrame) -> pd.Series:
    """Seconds per decode step: the time per output token times the tokens a step produces (the
    speculative acceptance length where there is one, else 1)."""
    tokens = df["spec_accept_length"].where(df["spec_accept_length"].notna(), 1.0) if "spec_accept_length" in df else 1.0
    return df["tpot_s"] * tokens


def configured_trials(df: pd.DataFrame, provenance: dict | None = None) -> dict[str, int]:
    """Per configuration: the single-request trials its protocol asked for at each length (provenance
    protocol.trials), else the most trials any of its lengths has."""
    df = single(df)
    entries = (provenance or {}).get("configurations") or {}
    out = {}
    for name, g in df.groupby("configuration", sort=True):
        asked = ((entries.get(name) or {}).get("protocol") or {}).get("trials")
        if isinstance(asked, (int, float)) and not isinstance(asked, bool) and asked > 0:
            out[name] = int(asked)
        else:
            out[name] = int(g.groupby("length").size().max())
    return out


def partial_lengths(df: pd.DataFrame, provenance: dict | None = None) -> dict[str, dict[int, dict]]:
    """Per configuration, its partial lengths: those with at least one ok single-request trial but fewer
    than the configured trials (configured_trials); each {ok, trials, configured}. A length with no ok
    trial is a failed length, not a partial one."""
    df = single(df)
    asked = configured_trials(df, provenance)
    chose = chosen_trials(provenance)
    out: dict[str, dict[int, dict]] = {}
    for (name, length), g in df.groupby(["configuration", "length"], sort=True):
        ok = int((g["status"] == "ok").sum())
        want = len(g) if name in chose else asked[name]
        if 0 < ok < want:
            out.setdefault(name, {})[int(length)] = {"ok": ok, "trials": len(g), "configured": want}
    return out


def chosen_trials(provenance: dict | None) -> set[str]:
    """The configurations whose sweep chose each length's trials itself (an adaptive sweep: provenance `sweep`):
    a length's trials are those it recorded, not protocol.trials."""
    return {n for n, e in ((provenance or {}).get("configurations") or {}).items() if (e or {}).get("sweep")}


def per_gpu_median(values: pd.Series) -> str | None:
    """The median of each GPU's figure over the trials, from results.csv's JSON lists (one figure per GPU, in the
    order telemetry watched them), as a JSON list; None without a list, or where the trials watched different GPUs."""
    lists = [json.loads(v) for v in values.dropna() if isinstance(v, str) and v.startswith("[")]
    if not lists or len({len(x) for x in lists}) != 1:
        return None
    return json.dumps([float(np.median([x[k] for x in lists])) for k in range(len(lists[0]))])


def medians(df: pd.DataFrame, provenance: dict | None = None) -> pd.DataFrame:
    """One row per (configuration, length): medians over ok trials, and the trial counts: `trials`
    (recorded), `ok`, `configured` (what the protocol asked for: configured_trials) and `partial` (some
    ok trials, but fewer than configured: partial_lengths); `burst`, the ok trials whose decode was not measurable
    (their tokens did not arrive apart), and `decode_unmeasured`, the first one's reason."""
    df = single(df)
    asked = configured_trials(df, provenance)
    counts = df.groupby(["configuration", "length"], sort=True).agg(
        trials=("status", "size"), ok=("status", lambda s: int((s == "ok").sum()))
    )
    cols = ["ttft_s", "tpot_s", "decode_tok_s", "e2e_s", "spec_accept_length", "spec_accept_rate",
            *(c for c in df.columns if c.startswith(("prefill_", "decode_")) and c.endswith("_mean"))]
    med = ok_rows(df).reindex(columns=["configuration", "length", *cols]).groupby(["configuration", "length"], sort=True)[cols].median()
    out = counts.join(med).reset_index()
    chose = chosen_trials(provenance)
    out["configured"] = [t if c in chose else asked[c] for c, t in zip(out["configuration"], out["trials"])]
    out["partial"] = (out["ok"] > 0) & (out["ok"] < out["configured"])
    for column in ("needle", "needle_answer", "needle_reason"):
        if column in df:
            first = df.groupby(["configuration", "length"])[column].first()
            out[column] = [first.get((c, l)) for c, l in zip(out["configuration"], out["length"])]
    for column in (c for c in df.columns if c.endswith("_by_gpu")):  # GPM per GPU (JSON lists): each GPU's median
        per = {key: per_gpu_median(g[column]) for key, g in ok_rows(df).groupby(["configuration", "length"], sort=True)}
        out[column] = [per.get((c, l)) for c, l in zip(out["configuration"], out["length"])]
    # the trials whose decode was not measurable (their tokens did not arrive apart: longctx.measure.burst),
    # counted, and the first one's reason: their TTFT is in the medians, their decode figures are not
    ok = ok_rows(df)
    flagged = ok[ok["burst"].eq(True)] if "burst" in ok else ok.iloc[:0]
    counts_burst = flagged.groupby(["configuration", "length"]).size()
    first_why = flagged.groupby(["configuration", "length"])["decode_unmeasured"].first() if len(flagged) else {}
    out["burst"] = [int(counts_burst.get((c, l), 0)) for c, l in zip(out["configuration"], out["length"])]
    out["decode_unmeasured"] = [first_why.get((c, l)) if len(flagged) else None
                                for c, l in zip(out["configuration"], out["length"])]
    causes = {key: length_cause(g) for key, g in df.groupby(["configuration", "length"], sort=True)}
    out["reason"] = [causes.get((c, l)) for c, l in zip(out["configuration"], out["length"])]
    return out


def decode_absent(df: pd.DataFrame) -> str:
    """Why df's successful single-request trials give no decode rate, in words ('No figure: ...', a figure's 'not
    measured: ...'): their tokens did not arrive apart (longctx.measure.burst), or none decoded a second one."""
    ok = ok_rows(df)
    if "burst" in ok and ok["burst"].eq(True).any():
        return "no stream's tokens arrived apart (likely buffering between the server and the client)"
    return "no trial decoded a second token"


def length_cause(g: pd.DataFrame) -> str | None:
    """Why a length's requests failed, decided once for the diagnosis, the failures section and page one (g:
    its results.csv rows): its server, where that lost it (it died, it stopped answering: the sweep's fault,
    not the transport errors of the requests it cut off); else the length's own reason (raw file); else its
    failed requests' reasons; None where nothing failed."""
    bad = g[g["status"] != "ok"]
    for column in ("length_fault", "length_reason"):
        said = g[column].dropna() if column in g else ()
        if len(said) and (len(bad) or column == "length_reason"):
            return str(said.iloc[0])
    if bad.empty:
        return None
    return "; ".join(sorted(set(bad["reason"].dropna().astype(str)))) or "failed"
