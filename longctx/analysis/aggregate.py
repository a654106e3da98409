"""data/raw/<configuration>/<length>.json -> data/results.csv (a row per trial) and data/provenance.json.

Each configuration's metronome.json (longctx.measure.metronome) goes into provenance.json as its entry's `metronome`:
the readings, the run's drift figure over them (longctx.analysis.drift.within), and the file's status and reason.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pandas as pd

from ..core.errors import write_atomic
from ..core.numbers import is_number
from ..measure.gpm import METRICS as GPM_METRICS
from ..measure.rawfiles import read_raw
from ..measure.telemetry import NVML_METRICS, PSUTIL_METRICS
from ..specs import hardware
from ..specs.pool import observed_pool
from .drift import within

log = logging.getLogger("longctx.analysis.aggregate")
terminal = logging.getLogger("longctx.progress")  # what a stage run with --log (longctx.cli) also says on the terminal

COLUMNS = [
    "configuration", "engine", "length", "concurrency", "trial", "request", "status", "reason",
    "ttft_s", "tpot_s", "decode_tok_s", "e2e_s", "itl_median_s", "itl_max_s",
    "prompt_tokens", "completion_tokens", "cached_tokens", "server_ttft_s",
    "usage_source", "prompt_count_checked", "tokens_estimated", "early_stop", "burst", "decode_unmeasured",
    "length_fault", "length_reason",
    "length_remeasured",
    "spec_verify_ct", "spec_accept_length", "spec_accept_rate", "spec_num_correct_drafts", "spec_num_proposed_drafts",
    "kv_bytes_per_token", "kv_pool_tokens", "run_id", "batch_output_tok_s", "needle",
    "needle_answer", "needle_reason",
    *(f"{window}_{m}_mean" for window in ("prefill", "decode") for m in (*NVML_METRICS, *PSUTIL_METRICS)),
    # GPM's DRAM bandwidth share times the datasheet's bandwidth of the GPU (longctx.specs.hardware), where both exist
    "prefill_gpm_dram_gbs_mean", "decode_gpm_dram_gbs_mean",
    # GPM per GPU of the server (a JSON list, NVML's order of the GPUs telemetry watched), and the counted time that
    # lay outside the window (longctx.measure.telemetry.summarize)
    *(f"{window}_{m}_by_gpu" for window in ("prefill", "decode") for m in GPM_METRICS),
    "prefill_gpm_outside_s", "decode_gpm_outside_s",
    "prefill_samples", "decode_samples", "contended", "contended_reason",
]
# A trial whose server got markedly less of its device than the configuration's other trials is contended (another
# job on the machine, a throttled GPU): its figure under CONTENDED_SHARE of the configuration's median over its
# single-request trials, each from a window of at least MIN_WINDOW_SAMPLES telemetry samples (a short prefill's one
# sample says little), at least MIN_TRIALS_COMPARED of them. Per column: what it is, its unit, the telemetry scope it
# needs (the server's own process tree for a CPU share: the whole machine's rises with contention)
CONTENDED_SHARE = 0.7
MIN_WINDOW_SAMPLES = 3
MIN_TRIALS_COMPARED = 4
# Another process's work on the server's GPUs (NVML's per-process utilisation, telemetry's others_sm_util_pct), which
# a clock does not show: a trial during which others took OTHERS_SM_PCT of the SMs or more is contended
OTHERS_SM_PCT = 10.0
OTHERS = {"prefill_others_sm_util_pct_mean": "other processes' SM utilisation on its GPUs during prefill",
          "decode_others_sm_util_pct_mean": "other processes' SM utilisation on its GPUs during decode"}
CONDITIONS = {
    "prefill_cpu_util_pct_mean": ("the server's CPU share during prefill", "% of a core", "process"),
    "decode_cpu_util_pct_mean": ("the server's CPU share during decode", "% of a core", "process"),
    "prefill_sm_clock_mhz_mean": ("the GPU's SM clock during prefill", " MHz", None),
    "decode_sm_clock_mhz_mean": ("the GPU's SM clock during decode", " MHz", None),
}


# how the sweep words a length lost to its server (a raw file from before `fault` was recorded)
SERVER_FAULTS = ("the server died while measuring", "the server stopped answering")


def length_fault(raw: dict) -> str | None:
    """What lost a length, where it was its server (it died, or stopped answering its health path), not
    its requests: the sweep's `fault`, else the server part of an older file's reason; up to the server
    log's path (the log's last line follows it in the raw file)."""
    text = raw.get("fault") or raw.get("reason") or ""
    if not text.startswith(SERVER_FAULTS):
        return None
    found = re.match(r"(.*?server log: [^\s;]+)", text, re.S)
    return (found.group(1) if found else text.split("\n", 1)[0]).strip()


def remeasured_words(raw: dict) -> str | None:
    """'measured again on the restarted server: the server died while measuring length 64 (...)': a length whose
    first attempt a transient fault lost, and how it was measured again (measure.sweep); None where it was not."""
    r = raw.get("remeasured")
    if not r:
        return None
    why = length_fault({"fault": r.get("why")}) or str(r.get("why") or "a transient fault").split("\n", 1)[0]
    return f"measured {r.get('how') or 'again'}, after {why}"


def _rows(path: Path, partial_dir: Path | None = None) -> tuple[list[dict], dict | None]:
    """A raw file's rows, and the file; a raw file that cannot be read is taken from its copy in
    partial_dir/<configuration>/ where that one is intact (raw["recovered_from"] says so), else it is
    one failed row that names both."""
    configuration, length = path.parent.name, int(path.stem)
    raw, problem = read_raw(path)
    if raw is None:
        copy = partial_dir / configuration / path.name if partial_dir else None
        kept, copy_problem = read_raw(copy) if copy else (None, None)
        if kept is None or kept.get("length", length) != length:
            also = f"; its copy {copy}: {copy_problem or 'another length'}" if copy else ""
            terminal.warning("%s is unreadable (%s)%s: length %d of %s is reported as failed; the same command, run "
                             "again, measures it again", path, problem, also or "; no copy was kept", length, configuration)
            return [{"configuration": configuration, "length": length, "status": "failed",
                     "reason": f"unreadable raw file {path} ({problem}){also}"}], None
        raw = {**kept, "recovered_from": str(copy), "recovered_because": f"{path}: {problem}"}
        terminal.warning("%s is unreadable (%s): recovered from its intact copy %s", path, problem, copy)
    prov = raw.get("provenance", {})
    base = {
        "configuration": raw.get("configuration", configuration),
        "engine": raw.get("engine"),
        "length": raw.get("length", length),
        "kv_bytes_per_token": prov.get("model", {}).get("kv_bytes_per_token"),
        "kv_pool_tokens": observed_pool(prov)[0],  # the server's info, else its log (vLLM reports it only there)
        "run_id": raw.get("run_id"),
        "needle": (raw.get("needle") or {}).get("status"),
        "needle_answer": (raw.get("needle") or {}).get("answer"),  # the model's words, where it answered
        "needle_reason": (raw.get("needle") or {}).get("reason"),  # why it failed, was not run, or is off its length
        "length_fault": length_fault(raw),
        "length_reason": raw.get("reason"),  # the length's own: its trials' reasons, a failed warm-up, a fault
        "length_remeasured": remeasured_words(raw),
    }
    trials = raw.get("trials") or []
    if not trials:
        return [{**base, "status": raw.get("status", "failed"), "reason": raw.get("reason")}], raw
    rows = []
    batched = [{**r, "trial": r["batch"]} for b in raw.get("batches") or [] for r in b["requests"]]
    peak = dram_peak_Bps(raw)
    for t in [{**t, "concurrency": 1, "request": 0} for t in trials] + batched:
        row = {**base, **{k: t.get(k) for k in COLUMNS if k in t}}
        for window, summary in (t.get("telemetry") or {}).items():
            row.update({f"{window}_{k}": v for k, v in summary.items() if k.endswith("_mean") and not k.endswith("_by_gpu_mean")})
            row.update({f"{window}_{k[:-len('_mean')]}": json.dumps([round(x, 4) for x in v])
                        for k, v in summary.items() if k.endswith("_by_gpu_mean") and isinstance(v, list)})
            row[f"{window}_samples"] = summary.get("n")
            row[f"{window}_gpm_outside_s"] = summary.get("gpm_outside_s")
            share = summary.get("gpm_dram_bw_pct_mean")
            if peak and is_number(share):
                row[f"{window}_gpm_dram_gbs_mean"] = share / 100 * peak / 1e9
        rows.append(row)
    return rows, raw


def dram_peak_Bps(raw: dict) -> float | None:
    """The datasheet's memory bandwidth (bytes/s) of the GPU a raw file's server ran on (its provenance's first GPU,
    as NVML names it; longctx.specs.hardware), or None where the machine has no GPU or the table does not know it."""
    gpus = ((raw.get("provenance") or {}).get("hardware") or {}).get("gpus") or []
    entry = hardware.match(gpus[0].get("name")) if gpus else None
    return entry["memory_bandwidth_si"] if entry else None


ITL_DEPTH_COLUMNS = ["configuration", "length", "status", "reason", "token", "depth", "itl_s"]


def itl_depth_rows(path: Path) -> list[dict]:
    """One row per decoded token of the ITL-against-depth request (one failed row if it failed)."""
    configuration = path.parent.name
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        return [{"configuration": configuration, "status": "failed", "reason": f"unreadable raw file {path}: {exc}"}]
    base = {"configuration": raw.get("configuration", configuration), "length": raw.get("length"),
            "status": raw.get("status"), "reason": raw.get("reason")}
    if raw.get("status") != "ok" or not raw.get("itl_s"):
        return [base]
    return [{**base, "token": i + 1, "depth": d, "itl_s": t} for i, (d, t) in enumerate(zip(raw["depth"], raw["itl_s"]))]


def _flag(df: pd.DataFrame, i, reason: str) -> None:
    """Row i contended, for the first reason found."""
    if not df.at[i, "contended"]:
        df.at[i, "contended"], df.at[i, "contended_reason"] = True, reason


def flag_contended(df: pd.DataFrame, prov: dict) -> pd.DataFrame:
    """results.csv's rows with `contended` and `contended_reason` (CONDITIONS: the figure that flagged it, against the
    configuration's median), from the telemetry the trials already carry."""
    df = df.copy()
    df["contended"] = False
    df["contended_reason"] = None
    for name, g in df.groupby("configuration", sort=False):
        entry = (prov.get("configurations") or {}).setdefault(name, {})
        scope = (entry.get("telemetry_scope") or {}).get("over")
        ok = g[g["status"].eq("ok") & pd.to_numeric(g["concurrency"], errors="coerce").eq(1)]
        checked = []
        for column, (what, unit, needs) in CONDITIONS.items():
            if needs and scope != needs:
                continue
            window = column.split("_", 1)[0]
            enough = pd.to_numeric(ok[f"{window}_samples"], errors="coerce").fillna(0) >= MIN_WINDOW_SAMPLES
            values = pd.to_numeric(ok[column], errors="coerce")[enough].dropna()
            values = values[values > 0]
            if len(values) < MIN_TRIALS_COMPARED:
                continue
            checked.append(what)
            median = float(values.median())
            for i, v in values[values < CONTENDED_SHARE * median].items():
                _flag(df, i, f"{what} {v:,.0f}{unit} against the configuration's median {median:,.0f}{unit}")
        for column, what in OTHERS.items():  # another process's share of the GPUs, where NVML attributes it
            values = pd.to_numeric(ok[column], errors="coerce").dropna() if column in ok else pd.Series(dtype=float)
            if not len(values):
                continue
            checked.append(what)
            for i, v in values[values >= OTHERS_SM_PCT].items():
                _flag(df, i, f"{what} {v:,.0f}%")
        # what the check could read, or why it could not: the report says so rather than imply it looked
        device = entry.get("device")
        why = (f"fewer than {MIN_TRIALS_COMPARED} trials with {MIN_WINDOW_SAMPLES} telemetry samples or more in a window"
               if scope == "process" or device == "gpu" else
               "the telemetry does not watch the server's own process" if device == "cpu" else
               "no telemetry of the server: it runs elsewhere, or telemetry is off")
        entry["contention"] = {"checked": checked} if checked else {"checked": [], "why_not": why}
    return df


def aggregate(raw_files: list[str | Path], out_csv: str | Path, out_provenance: str | Path,
              out_itl_depth: str | Path | None = None, partial_dir: str | Path | None = None) -> pd.DataFrame:
    """With partial_dir (the bench's resume directory, data/partial), a raw file that cannot be read is
    recovered from its copy there, and provenance.json lists it under the configuration's `recovered`."""
    rows: list[dict] = []
    prov: dict = {"configurations": {}}
    # a configuration's load.json and prefix.json hold its load and reused-context workloads (longctx.analysis.load
    # and .prefix read them), not a length
    paths = [p for p in map(Path, raw_files) if p.stem not in ("load", "prefix", "sweep", "metronome")]
    sweeps = {p.parent.name: p for p in map(Path, raw_files) if p.stem == "sweep"}
    metronomes = {p.parent.name: p for p in map(Path, raw_files) if p.stem == "metronome"}
    depth_rows = [r for p in sorted(paths) if p.stem == "itl_depth" for r in itl_depth_rows(p)]
    if out_itl_depth:
        write_atomic(out_itl_depth, pd.DataFrame(depth_rows, columns=ITL_DEPTH_COLUMNS).to_csv(index=False))
    for path in sorted((p for p in paths if p.stem != "itl_depth"), key=lambda p: (p.parent.name, int(p.stem))):
        r, raw = _rows(path, Path(partial_dir) if partial_dir else None)
        if raw is not None and raw.get("status") == "not chosen":  # a grid length the adaptive sweep did not measure
            continue
        rows += r
        if raw is None:
            continue
        entry = prov["configurations"].setdefault(raw["configuration"], {
            "engine": raw.get("engine"),
            "spec_hash": raw.get("spec_hash"),
            **{k: v for k, v in raw.get("provenance", {}).items()},
            "first_started_at": raw.get("started_at"),
        })
        entry["last_finished_at"] = raw.get("finished_at")
        if raw.get("recovered_from"):
            entry.setdefault("recovered", []).append({"length": raw.get("length"), "from": raw["recovered_from"],
                                                      "because": raw["recovered_because"]})
    for name, path in sorted(sweeps.items()):  # an adaptive sweep's path: every choice, with its reason and its time
        sweep, problem = read_raw(path)
        prov["configurations"].setdefault(name, {})["sweep"] = (
            {k: sweep.get(k) for k in ("settings", "grid", "path", "outcome", "spent_s", "predicted_s", "at_max", "reason")}
            if sweep else {"reason": f"unreadable {path}: {problem}"})
    for name, path in sorted(metronomes.items()):  # the run's drift (longctx.measure.metronome)
        prov["configurations"].setdefault(name, {})["metronome"] = metronome_entry(path, Path(partial_dir) if partial_dir else None)
    df = pd.DataFrame(rows, columns=COLUMNS).sort_values(["configuration", "length", "concurrency", "trial", "request"],
                                                         kind="stable")
    df = flag_contended(df, prov)
    Path(out_csv).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out_csv, df.to_csv(index=False))
    write_atomic(out_provenance, json.dumps(prov, indent=1, sort_keys=True) + "\n")
    return df


def metronome_entry(path: Path, partial_dir: Path | None = None) -> dict:
    """A configuration's provenance `metronome`: its metronome.json's settings, status, reason and readings, and the
    run's drift over them (longctx.analysis.drift.within; None with fewer than two readings); a file that cannot be
    read is taken from its intact copy in partial_dir/<configuration>/ (said in `recovered_from`), else said so."""
    raw, problem = read_raw(path)
    if raw is None and partial_dir is not None:
        copy = partial_dir / path.parent.name / path.name
        kept, _ = read_raw(copy)
        if kept is not None:
            raw = {**kept, "recovered_from": str(copy), "recovered_because": f"{path}: {problem}"}
            terminal.warning("%s is unreadable (%s): its readings recovered from its intact copy %s", path, problem, copy)
    if raw is None:
        return {"status": "failed", "reason": f"unreadable {path}: {problem}", "readings": [], "drift": None}
    readings = raw.get("readings") or []
    return {"settings": raw.get("metronome"), "status": raw.get("status"), "reason": raw.get("reason"),
            "points": raw.get("points") or [], "readings": readings, "drift": within(readings),
            **{k: raw[k] for k in ("recovered_from", "recovered_because") if k in raw}}


def missing(df: pd.DataFrame) -> dict[str, list[tuple[int, str]]]:
    """The configured lengths with no successful measurement, per configuration: [(length, why)], why the length's
    server fault where one lost it (not the transport errors it caused), else the length's own reason, else its
    first row's (a length the adaptive sweep did not choose is not in results.csv, so not missing)."""
    out: dict[str, list[tuple[int, str]]] = {}
    for (conf, length), rows in df.groupby(["configuration", "length"], sort=True):
        if not (rows["status"] == "ok").any():
            reasons = [rows[c].dropna().astype(str) for c in ("length_fault", "length_reason", "reason") if c in rows]
            why = next((r.iloc[0] for r in reasons if len(r)), "no reason recorded")
            out.setdefault(str(conf), []).append((int(length), why))
    return out


ALLOW_MISSING = "--config allow_missing=True"
# what a missing length's reason needs done before it can be measured: the reasons that do not pass by themselves
# (measure.rawfiles.transient), so that the same command does not send it again
FIXES = (("gave up after", "fix: what the server's log says of it; then `snakemake --forcerun bench_configuration` (or a "
                          "changed configuration) sends it again"),
         ("exceed the context length", "fix: a server with a longer context, or a shorter `lengths`"),
         ("of the KV pool", "fix: more KV memory for the server (its memory fraction), or a shorter `lengths`"),
         ("HTTP 401", "fix: the key, configurations.{conf}.api_key_env"),
         ("HTTP 403", "fix: the key, configurations.{conf}.api_key_env"))


def _with_fix(why: str, conf: str) -> str:
    fix = next((f for words, f in FIXES if words in why), None)
    return f"{why}; {fix.format(conf=conf)}" if fix else why


def run_verdict(results_csv: str | Path, allow_missing: bool = False) -> str | None:
    """Why the run is not a success, in one line, for the workflow's exit status: nothing was measured (always), or
    (unless allow_missing) a configured length has no successful measurement; None where every length was measured
    or results.csv was not made."""
    try:
        df = pd.read_csv(results_csv)
    except (OSError, ValueError):
        return None
    if df.empty:
        return None
    if not (df["status"] == "ok").any():
        names = sorted(df["configuration"].astype(str).unique())
        return (f"nothing was measured: every length of {', '.join(names)} failed; the report says why each did "
                "(its Failures section)")
    lost = missing(df)
    if not lost or allow_missing:
        return None
    n = sum(len(v) for v in lost.values())
    parts = []
    for conf, lengths in lost.items():
        by_why: dict[str, list[int]] = {}
        for length, why in lengths:
            by_why.setdefault(_with_fix(why.split(";")[0][:150], conf), []).append(length)
        parts.append(f"{conf} " + ", ".join(f"L={'/'.join(map(str, ls))} ({why})" for why, ls in by_why.items()))
    return (f"{n} configured length(s) have no successful measurement: {'; '.join(parts)}. The report is written and "
            "says why; the same command, run again, measures again those lost to a fault that may pass; "
            f"{ALLOW_MISSING} counts a partial report as success")
