"""`longctx <stage>`: the command each workflow rule calls; every stage reads files and writes files."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import math
import os
import sys
from pathlib import Path

from .core.errors import ConfigError, write_atomic, write_fix

LOG_FORMAT = "[%(asctime)s] %(name)s: %(message)s"
TERMINAL = logging.getLogger("longctx.progress")  # the lines a stage run with --log shows on the terminal
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS}  # a path that cannot be written


def _job_spec(a):
    """The configuration spec a workflow job runs: --spec, or --configuration in the config files (--configfile,
    or as the workflow merged them, LONGCTX_CONFIG_SOURCES), checked against --spec-hash."""
    from . import config as cfg
    from .engines import ConfigurationSpec

    sources = json.loads(os.environ.get(cfg.CONFIG_SOURCES_VAR) or "{}")
    files = a.configfile or sources.get("configfiles")
    if a.spec:
        spec = ConfigurationSpec.from_json(a.spec)
    elif files and a.configuration:
        overrides = json.loads(a.config_overrides) if a.config_overrides else sources.get("overrides")
        spec = cfg.configuration_spec(cfg.load(files, overrides), a.configuration)
        if a.spec_hash and spec.spec_hash() != a.spec_hash:
            raise ConfigError(f"configuration {a.configuration!r} in {', '.join(files)} is not the one the workflow "
                              "planned this job for (the file changed since): run the workflow again")
    else:
        raise ConfigError(f"{a.command} needs --spec, or --configuration with --configfile (or {cfg.CONFIG_SOURCES_VAR}, "
                          "as the workflow sets it)")
    return spec


def _bench(a) -> int:
    from .measure.sweep import run_configuration

    spec = _job_spec(a)
    failed = run_configuration(spec, a.outdir or f"data/raw/{spec.name}", a.server_log or f"data/logs/server/{spec.name}.log",
                               a.resume_dir, **({} if a.progress_every is None else {"progress_every_s": a.progress_every}))
    logging.getLogger(__name__).info("%s: %d of %d lengths measured", spec.name, len(spec.lengths) - failed, len(spec.lengths))
    return 0


def _import(a) -> int:
    from .measure.imports import import_configuration

    spec = _job_spec(a)
    lengths = import_configuration(spec, a.outdir or f"data/raw/{spec.name}")
    print(f"{spec.name}: {len(lengths)} lengths imported ({', '.join(map(str, lengths))})")
    return 0


def _retry_note(a) -> int:
    from .measure.rawfiles import write_retry_note

    TERMINAL.info("%s", write_retry_note(a.out, a.raw, a.names))
    return 0


def _build_kernel(a) -> int:
    from .attention.build import CUDA_ARCHS, build

    m = build(a.name, a.kind, a.sources, a.outdir, tuple(a.cuda_arch) or CUDA_ARCHS)
    print(json.dumps(m, indent=1))
    return 0


def _bench_kernel(a) -> int:
    import torch

    from .attention import kernelbench

    if a.threads:
        torch.set_num_threads(a.threads)
    shape = kernelbench.Shape(a.heads, a.kv_lora_rank, a.rope, a.dtype)
    print(f"shape: {shape.describe()}, batch {shape.batch}, {shape.n_q} query token", flush=True)
    records = kernelbench.run(a.lengths, shape, a.kernel_dir, ("cpu", "cuda"))
    for r in records:
        print(f"{r['variant']:>10} {r['device']:>5} {r['length']:>7}: {r['seconds'] * 1e3:.3f} ms, {r['gb_s']:.2f} GB/s, "
              f"{r['fraction_of_copy']:.0%} of copy", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(a.out, json.dumps({"kernel_dir": a.kernel_dir, "records": records}, indent=1) + "\n")
    return 0


def _ab_kernel(a) -> int:
    import torch

    from .analysis import kernel_ab as verdicts
    from .attention import kernel_ab
    from .attention.shapes import Shape

    if a.device == "cpu" and a.threads:
        torch.set_num_threads(a.threads)
    shape = Shape(a.heads, a.kv_lora_rank, a.rope, a.dtype)
    try:
        kernel_a, kernel_b = kernel_ab.load_pair(a.a, a.b, a.device)
    except FileNotFoundError as exc:
        raise SystemExit(f"no kernel to time: {exc}") from None
    ids = {side: kernel_ab.identity(k) for side, k in (("A", kernel_a), ("B", kernel_b))}
    _say_lines(a, [f"A {ids['A']['name']} {ids['A']['target']} build {ids['A']['build_hash']} ({a.a}) against B "
                   f"{ids['B']['name']} {ids['B']['target']} build {ids['B']['build_hash']} ({a.b}); shape "
                   f"{shape.describe()}; {a.blocks} blocks a side of {a.calls} calls, ABBA"
                   + (f"; {torch.get_num_threads()} threads" if a.device == "cpu" else "")])
    measured = kernel_ab.alternate(kernel_a, kernel_b, shape, a.lengths, a.blocks, a.calls, a.device,
                                   progress=lambda line: logging.getLogger(__name__).info("%s", line))
    v = verdicts.verdicts(measured, a.confidence, a.margin, a.statistic)
    code = 1 if v["regressions"] or v["lost"] else 2 if len(v["no_interval"]) == len(v["rows"]) else 0
    lost = "; ".join(f"B failed at {x['length']} tokens ({x['why']})" for x in v["lost"])
    summary = ("no length got an interval (it takes 2 pairs: --blocks 2 or more)" if code == 2 else
               "; ".join(filter(None, [f"B slower beyond {a.margin:.0%} at {', '.join(map(str, v['regressions']))} tokens"
                                       if v["regressions"] else "", lost])) if code == 1 else
               f"no regression beyond {a.margin:.0%} at {len(v['rows'])} lengths")
    _say_lines(a, [verdicts.line(r) for r in v["rows"]] +
               [f"{summary} (one-sided bounds at {v['level']:.4f}: {a.confidence:g} over the {v['family']} lengths); "
                f"the A/B took {measured['wall_s']:.1f} s"])
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(a.out, json.dumps({"a": a.a, "b": a.b, "exit": code, "measured": measured, "verdicts": v},
                                       indent=1) + "\n")
    return code


def _confidence(text: str) -> float:
    try:
        c = float(text)
    except ValueError:
        c = math.nan
    if not 0 < c < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a confidence is a fraction between 0 and 1 (0.95 is 95%)")
    return c


def _aggregate(a) -> int:
    from .analysis.aggregate import aggregate

    df = aggregate(a.raw, a.out_csv, a.out_provenance, a.out_itl_depth, a.partial_dir)
    print(f"{len(df)} rows, {int((df['status'] != 'ok').sum())} not ok -> {a.out_csv}")
    return 0


def _aggregate_load(a) -> int:
    from .analysis.load import aggregate_load

    req, inter, met = aggregate_load(a.raw, a.out_requests, a.out_interference, a.out_metrics)
    print(f"{len(req)} request rows, {int((req['status'] != 'ok').sum())} not ok -> {a.out_requests}; "
          f"{len(inter)} victim rows -> {a.out_interference}; {len(met)} metric rows -> {a.out_metrics}")
    return 0


def _analyze_load(a) -> int:
    from .analysis.load_summary import analyze_file

    settings = json.loads(a.settings) if a.settings else None
    doc = analyze_file(a.requests, a.interference, a.metrics, a.out, a.fits, a.provenance, a.planner, settings)
    print(f"{len(doc['configurations'])} configurations -> {a.out}")
    return 0


def _whatif(a) -> int:
    from .analysis.whatif import whatif_file

    doc = whatif_file(a.fits, a.load, a.provenance, a.requests, a.interference, json.loads(a.settings), a.out)
    for name, c in doc["configurations"].items():
        e = (c.get("errors") or {}).get("p50") or {}
        said = c.get("reason") or (f"median absolute error at p50 {e['median_abs']:.0%} over {e['n']} figures"
                                   if e.get("median_abs") is not None else "no measured load point to check against")
        print(f"{name}: {said}; {len(c.get('whatif') or [])} what-if settings, {c.get('events', 0):,} events "
              f"in {c.get('seconds', 0):.1f} s")
    return 0


def _aggregate_prefix(a) -> int:
    from .analysis.prefix import aggregate_prefix

    df = aggregate_prefix(a.raw, a.out)
    print(f"{len(df)} request rows, {int((df['status'] != 'ok').sum())} not ok -> {a.out}")
    return 0


def _analyze_prefix(a) -> int:
    from .analysis.prefix_model import analyze_file

    settings = json.loads(a.settings) if a.settings else None
    doc = analyze_file(a.prefix, a.out, a.results, a.fits, settings)
    print(f"{len(doc['configurations'])} configurations -> {a.out}")
    return 0


def _fit(a) -> int:
    from .analysis.fits import fit_file

    settings = json.loads(a.settings) if a.settings else None
    fits = fit_file(a.results, a.out, a.provenance, a.calibration, settings, a.kernel_bench)
    print(json.dumps(fits, indent=1, default=str))
    return 0


def _calibrate(a) -> int:
    from . import config as cfg
    from .measure.calibration import calibrate, plan

    p = json.loads(a.plan) if a.plan else plan(cfg.load(a.configfile))
    doc = calibrate(p, a.out)
    print(json.dumps(doc, indent=1))
    return 0


def _plan_memory(a) -> int:
    from .analysis.memory import plan_file

    print(json.dumps(plan_file(a.provenance, a.results, a.out, [float(f) for f in a.fractions.split(",")]), indent=1))
    return 0


def _figures(a, kind: str) -> list:
    """The figures of one kind drawn from a's inputs: the measured ones, the analysis' (planner), the load
    workloads' or the reused context's; their paths."""
    from .report.figures import analysis, load, measured, prefix

    if kind == "analysis":
        return list(analysis.plot_analysis(a.results, a.fits, a.planner, a.style, a.outdir))
    if kind == "load":
        return list(load.plot_load(a.load, a.metrics, a.style, a.outdir))
    if kind == "prefix":
        return list(prefix.plot_prefix(a.prefix, a.style, a.outdir))
    return list(measured.plot_all(a.results, a.fits, a.style, a.outdir, a.itl_depth, a.provenance))


def _print_paths(paths: list) -> int:
    for p in paths:
        print(p)
    return 0


def _plot(a) -> int:
    """The measured figures, and those of each further input given (the analysis', the load workloads', the reused
    context's): the workflow draws them all in this one process."""
    if bool(a.load) != bool(a.metrics):
        raise ConfigError("longctx plot: --load and --metrics go together (data/load.json, data/load_metrics.csv)")
    given = {"analysis": a.planner, "load": a.load, "prefix": a.prefix}
    return _print_paths([p for kind in ("measured", *given) if kind == "measured" or given[kind] for p in _figures(a, kind)])


def _plot_analysis(a) -> int:
    return _print_paths(_figures(a, "analysis"))


def _plot_load(a) -> int:
    return _print_paths(_figures(a, "load"))


def _plot_prefix(a) -> int:
    return _print_paths(_figures(a, "prefix"))


def _plot_history(a) -> int:
    from .report.figures.history import plot_history

    for p in plot_history(a.history, a.style, a.outdir):
        print(p)
    return 0


def _report_inputs(a):
    """The report's inputs from the options report_inputs adds: the data files, the configuration (from
    --config-json or --configfile) and the baseline (--baseline, else the configuration's)."""
    from . import config as cfg
    from .report.context import DATA_FILES, ReportInputs

    c = json.loads(a.config_json) if a.config_json else cfg.load(a.configfile) if a.configfile else None
    baseline = a.baseline or (cfg.report_baseline(c) if c else None)
    return ReportInputs(**{name: getattr(a, name) for name in DATA_FILES}, baseline=baseline, config=c)


def _render(a) -> int:
    from .report.latex import render_report

    record = render_report(a.template, a.out, a.version_out, _report_inputs(a), versions_dir=a.versions,
                           history_out=a.history_out)
    print(f"{a.out}: version {record['n']} ({record['name']})")
    return 0


def _pdf(a) -> int:
    from .report.latex import build_pdf

    kept = build_pdf(a.tex, a.out, a.provenance, a.version, a.versions)
    print(f"{a.out}" + (f", kept as {kept}" if kept else ""))
    return 0


def _markdown(a) -> int:
    from .report.markdown import render_twin

    render_twin(a.template, a.out, a.version, _report_inputs(a), versions_dir=a.versions)
    print(a.out)
    return 0


def _plan_section(a) -> int:
    from pathlib import Path

    from .report.markdown import plan_section

    section = plan_section(a.template, a.plan, a.version, _report_inputs(a), versions_dir=a.versions)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(a.out, section)
    print(a.out)
    return 0


def _attach_plan(a) -> int:
    from pathlib import Path

    from .report.plans import attach

    attach(a.plan, Path(a.section).read_text())
    print(f"{a.plan}: Results section from {a.section}")
    return 0


def _margin(text: str) -> float:
    try:
        m = float(text)
    except ValueError:
        m = math.nan
    if not 0 <= m < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a margin is a fraction from 0 to below 1 (0.05 is 5%)")
    return m


def _say_lines(a, lines: list[str]) -> None:
    """Lines for the terminal: printed, or (with --log) on the terminal and in the log."""
    for line in lines:
        TERMINAL.info(line) if a.log else print(line)


def _gate(a) -> int:
    from .report.gate import gate

    code, answer, lines = gate(a.version, a.versions, a.against, a.margin)
    text = json.dumps(answer, indent=1, sort_keys=True) + "\n"
    if a.out:
        write_atomic(a.out, text)
    if a.json:
        print(text, end="")
    if not a.json or a.log:
        _say_lines(a, lines)
    return code


def _compare(a) -> int:
    from .report import change_words, changes, versions

    try:
        records = []
        for name in (a.before, a.now):
            record, why = versions.find(a.versions, changes.version_number(name))
            if record is None:
                raise changes.VersionError(why)
            records.append(record)
        cmp = changes.against_record(*records, a.margin)
    except SystemExit as exc:  # VersionError, or a version log that cannot be read
        _say_lines(a, [f"nothing to compare: {exc.code}"])
        return 2
    if a.json:
        print(json.dumps(cmp, indent=1, sort_keys=True))
    else:
        _say_lines(a, change_words.table_lines(cmp) + ([cmp["sentence"]] if cmp["sentence"] else []))
    return 0


def _config_sources(a) -> tuple[list[str], dict]:
    """The config files and --config values a command run in the workflow's directory takes: --configfile (or as the
    workflow merged them, LONGCTX_CONFIG_SOURCES; else config/longctx.yaml) and --config-overrides."""
    from . import config as cfg

    sources = json.loads(os.environ.get(cfg.CONFIG_SOURCES_VAR) or "{}")
    files = a.configfile or sources.get("configfiles") or ["config/longctx.yaml"]
    return files, (json.loads(a.config_overrides) if a.config_overrides else sources.get("overrides") or {})


def _workflow_config(a) -> dict:
    """The config a command run in the workflow's directory takes (_config_sources), validated."""
    from . import config as cfg

    return cfg.load(*_config_sources(a))


def _ab_config(a) -> dict:
    """The config `longctx ab` runs with (_workflow_config), the command line's baseline and level over ab.*."""
    config = _workflow_config(a)
    asked = {k: v for k, v in (("against", a.against), ("against_rev", a.against_rev), ("level", a.level)) if v}
    if asked.get("against") or asked.get("against_rev"):  # the command line's baseline replaces the config's
        config["ab"].update(against=None, against_rev=None)
    config["ab"].update(asked)
    if config["ab"]["against"]:
        from .report.changes import version_number

        config["ab"]["against"] = f"v{version_number(config['ab']['against'])}"
    return config


def _advise(a) -> int:
    import pandas as pd

    from .analysis import advise
    from .core.numbers import json_plain

    config = _workflow_config(a)
    if not config.get("advise"):
        raise ConfigError("config key 'advise': no goal is set: give the context to fit, a workload and its SLO "
                          "(docs/advise.md), in the config or with --config-overrides")
    data = Path(a.data)

    def read(name: str, default=None):
        path = data / name
        if not path.exists():
            if default is not None:
                return default
            raise SystemExit(f"{path} is missing: run the workflow first (snakemake --cores 1), then advise in its directory")
        return json.loads(path.read_text())

    def table(name: str, columns: list[str]) -> pd.DataFrame:
        path = data / name
        return pd.read_csv(path) if path.exists() else pd.DataFrame(columns=columns)

    def answer() -> dict:
        try:
            return advise.advise(read("fits.json"), read("load.json", {}), read("provenance.json"),
                                 table("load_requests.csv", ["configuration", "kind"]), config, a.configuration,
                                 table("results.csv", ["configuration", "length", "status"]))
        except advise.AdviceError as exc:
            raise ConfigError(str(exc)) from None

    doc = answer()
    if a.verify:
        code = _verify_advice(a, config, doc)
        if code:
            return code
        doc = answer()  # with what the verifying run measured
    text = json.dumps(json_plain(doc), indent=1, sort_keys=True) + "\n"
    if a.out:
        write_atomic(a.out, text)
    if a.json:
        print(text, end="")
    else:
        _say_lines(a, advise.lines(doc))
    return 0


VERIFY_FILE = "advise-verify.yaml"  # the verifying configuration `longctx advise --verify` writes, in the workflow's directory


def _verify_advice(a, config: dict, doc: dict) -> int:
    """`longctx advise --verify`: the advised configuration's server restarted with the recommended flags, as a
    configuration that verifies it (configurations.<name>.verifies: a copy of it with those flags), measured by the
    workflow with the rest of the config (the report, a version like any other); the workflow's exit status."""
    import subprocess

    import yaml

    from .analysis.advise import flag_words as advise_words
    from .core.words import listed
    from .engines import get_adapter

    advised = [n for n, c in doc["configurations"].items() if c.get("recommended")]
    name = a.configuration or (advised[0] if len(advised) == 1 else None)
    if name is None:
        raise ConfigError("--verify: name the configuration whose advice to verify with --configuration; "
                          f"allowed values: {listed(advised) or 'none (no configuration has a setting to recommend)'}")
    c = doc["configurations"][name]
    if not c.get("recommended"):
        raise SystemExit(f"longctx advise --verify: {name} has nothing to verify: "
                         f"{c.get('reason') or 'no searched setting meets the goal: ' + str(c.get('binding'))}")
    entry = config["configurations"][name]
    flags = c["recommended"]["flags"]
    if not get_adapter(entry["engine"]).managed:
        raise SystemExit(f"longctx advise --verify: {name} is a server longctx does not start ({entry['engine']}): "
                         f"restart it with {advise_words(flags)}, then add a configuration with `verifies: {name}` and its url to the "
                         "config and run the workflow (docs/advise.md)")
    verifying = f"{name}-advised"
    Path(VERIFY_FILE).write_text(
        "# written by `longctx advise --verify`: the server of configuration " + name + " restarted with the flags the\n"
        "# advice recommends; the workflow measures the goal's workload there and the advice says predicted against\n"
        "# measured. Keep it among the config files to keep the configuration in later reports.\n"
        + yaml.safe_dump({"configurations": {verifying: {
            "verifies": name, "args": flags,
            "description": f"{name} restarted with the advised flags (verifies its advice)"}}}, sort_keys=False))
    files, overrides = _config_sources(a)
    command = [sys.executable, "-m", "snakemake", "--cores", str(a.cores), "report/longctx.pdf", "report/longctx.md",
               "report/advice.json", "--configfile", *files, VERIFY_FILE,
               *(["--config", *(f"{k}={json.dumps(v)}" for k, v in overrides.items())] if overrides else [])]
    TERMINAL.info("verifying %s's advice: %s measures the goal's workload at the recommended flags (%s)", name,
                  verifying, VERIFY_FILE)
    return subprocess.run(command).returncode


def _ab(a) -> int:
    from .report import ab

    if a.from_measurements:
        m = json.loads(Path(a.from_measurements).read_text())
    else:
        config = _ab_config(a)
        ab.check(config)
        plan = ab.plan(config, config["ab"]["against"], config["ab"]["against_rev"], a.versions)
        TERMINAL.info("A/B against %s: %s; measuring %s", plan["baseline"],
                      "no kernel source differs (an A/A run)" if plan["aa"] else
                      "; ".join(f"{k['name']}: {', '.join(k['differs'])} differ" for k in plan["kernels"]),
                      ", ".join(plan["configurations"]) if config["ab"]["level"] == "server" else "the kernels alone")
        m = ab.measure(config, plan, a.data, a.server_logs)
        Path(a.measurements).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(a.measurements, json.dumps(m, indent=1, sort_keys=True) + "\n")
        if a.measure_only:
            TERMINAL.info("%s", ab.cost_line(m))
            return 0
    code, answer, lines = ab.write_outputs(m, a.out, a.markdown)
    if a.json:
        print(json.dumps(answer, indent=1, sort_keys=True))
    if not a.json or a.log:
        _say_lines(a, lines)
    return code


def _check_config(a) -> int:
    from . import config as cfg

    c = cfg.load(a.configfile)
    print(json.dumps(c, indent=1))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="longctx", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("bench", help="bring one configuration's server up, measure every length, stop it")
    s.add_argument("--spec", help="the configuration spec as JSON")
    s.add_argument("--configfile", action="append", help="or: the config files, merged in order (the workflow passes them, "
                   "and its --config values, in LONGCTX_CONFIG_SOURCES) ...")
    s.add_argument("--config-overrides", help="... --config values as JSON ...")
    s.add_argument("--configuration", help="... and the configuration's name")
    s.add_argument("--spec-hash", help="the spec's hash as the workflow planned it: a changed config file is refused")
    s.add_argument("--outdir", help="where <length>.json go (default data/raw/<configuration>)")
    s.add_argument("--server-log", help="the server's log file (default data/logs/server/<configuration>.log)")
    s.add_argument("--resume-dir", help="keep each measured length here and reuse the ones a previous run finished")
    s.add_argument("--log", help="write the whole log here; the console then gets a line per bring-up attempt, per length "
                   "and per warm-up or trial (with the time left), and errors")
    s.add_argument("--progress-every", type=float, default=None, metavar="SECONDS",
                   help="at most one warm-up or trial line this often on the console (default 10; a length's line always)")
    s.set_defaults(func=_bench)

    s = sub.add_parser("import", help="an imported configuration's result files (another tool's) as raw files, one per length")
    s.add_argument("--spec", help="the configuration spec as JSON")
    s.add_argument("--configfile", action="append", help="or: the config files, merged in order (or LONGCTX_CONFIG_SOURCES) ...")
    s.add_argument("--config-overrides", help="... --config values as JSON ...")
    s.add_argument("--configuration", help="... and the configuration's name")
    s.add_argument("--spec-hash", help="the spec's hash as the workflow planned it: a changed config file is refused")
    s.add_argument("--outdir", help="where <length>.json go (default data/raw/<configuration>)")
    s.set_defaults(func=_import)

    s = sub.add_parser("retry-note", help="note (and say) what a configuration's last run lost for a reason that may pass: "
                       "the bench job, rerun, measures it again")
    s.add_argument("--out", required=True, help="the note, data/partial/<configuration>/retry-<n>.json")
    s.add_argument("--raw", required=True, help="the configuration's raw files' directory, data/raw/<configuration>")
    s.add_argument("--names", nargs="+", required=True, help="the raw files' names the job writes (lengths, workloads)")
    s.set_defaults(func=_retry_note)

    s = sub.add_parser("build-kernel", help="build and check one attention kernel")
    s.add_argument("--name", required=True)
    s.add_argument("--kind", required=True)
    s.add_argument("--outdir", required=True)
    s.add_argument("--cuda-arch", action="append", default=[], help="sm_120, sm_90, ... (repeat); default: sm_120 and sm_90")
    s.add_argument("sources", nargs="+")
    s.set_defaults(func=_build_kernel)

    s = sub.add_parser("bench-kernel", help="time a built native kernel against the reference gather (one layer, batch 1)")
    s.add_argument("--kernel-dir", required=True)
    s.add_argument("--lengths", type=int, nargs="+", required=True)
    s.add_argument("--heads", type=int, required=True,
                   help="query heads on one tensor-parallel rank (num_attention_heads / tp_size, as served)")
    s.add_argument("--kv-lora-rank", type=int, required=True)
    s.add_argument("--rope", type=int, required=True)
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the KV cache's dtype, as served")
    s.add_argument("--threads", type=int, default=None)
    s.add_argument("--out", required=True)
    s.set_defaults(func=_bench_kernel)

    s = sub.add_parser("ab-kernel", help="two builds of one kernel (A: the baseline, B: the candidate) timed in one "
                       "process, calls alternated in ABBA blocks at each length on the same inputs: per length B/A with "
                       "its paired one-sided bounds over the lengths' family, the verdict and whether it is a regression "
                       "beyond the margin; exit 1 where one is, 2 where no length got an interval, else 0")
    s.add_argument("--a", required=True, metavar="BUILD_DIR", help="the baseline's build directory (build/kernels/<name>/, "
                   "or a directory holding a PyTorch kernel's source)")
    s.add_argument("--b", required=True, metavar="BUILD_DIR", help="the candidate's, the same kernel built from other sources")
    s.add_argument("--lengths", type=int, nargs="+", required=True, help="KV lengths (the sweep's: config lengths)")
    s.add_argument("--heads", type=int, default=2, help="query heads on one tensor-parallel rank (default 2: the default "
                   "config's model; the shape options are bench-kernel's)")
    s.add_argument("--kv-lora-rank", type=int, default=64)
    s.add_argument("--rope", type=int, default=16)
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the KV cache's dtype, as served")
    s.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    s.add_argument("--blocks", type=int, default=16, help="blocks of each side per length (default 16: 16 pairs)")
    s.add_argument("--calls", type=int, default=5, help="timed calls per block (default 5)")
    s.add_argument("--statistic", default="median", choices=["median", "min", "all"],
                   help="what a block gives its pair's difference: its median call (default), its fastest, or every call")
    s.add_argument("--threads", type=int, default=1, help="CPU threads (default 1: on a shared machine a kernel's "
                   "threads wait at their barrier for a neighbour's time slice, docs/kernels.md; 0 leaves PyTorch's)")
    s.add_argument("--confidence", type=_confidence, default=0.95, help="of the whole family of lengths (default 0.95)")
    s.add_argument("--margin", type=_margin, default=0.05, help="a regression's bound clears 1 + margin (default 0.05)")
    s.add_argument("--out", help='the answer as JSON: {"a", "b", "exit", "measured": the raw blocks per length, '
                   '"verdicts": per length ratio, ci, verdict, regression, ...}')
    s.set_defaults(func=_ab_kernel)

    s = sub.add_parser("aggregate", help="raw JSON files -> results.csv and provenance.json")
    s.add_argument("--out-csv", required=True)
    s.add_argument("--out-provenance", required=True)
    s.add_argument("--out-itl-depth", help="per-token ITL against KV depth (from itl_depth.json files)")
    s.add_argument("--partial-dir", help="the bench jobs' copies (data/partial): an unreadable raw file is taken from there")
    s.add_argument("raw", nargs="+")
    s.set_defaults(func=_aggregate)

    s = sub.add_parser("aggregate-load", help="raw load.json files -> load_requests.csv, load_interference.csv, load_metrics.csv")
    s.add_argument("--out-requests", required=True, help="data/load_requests.csv: a row per closed- or open-loop request (and per wake-probe request, and per "
                   "sweep twin beside a loop of one)")
    s.add_argument("--out-interference", required=True, help="data/load_interference.csv: a row per victim per trial")
    s.add_argument("--out-metrics", required=True, help="data/load_metrics.csv: the server's samples and the client's resident tokens")
    s.add_argument("raw", nargs="+", help="data/raw/<configuration>/load.json (a missing or unreadable one is a failed row)")
    s.set_defaults(func=_aggregate_load)

    s = sub.add_parser("analyze-load", help="the load tables (+ fits, provenance, planner) -> load.json: percentiles, "
                       "goodput, interference, KV reconciliation, SLO frontier")
    s.add_argument("--requests", required=True, help="data/load_requests.csv")
    s.add_argument("--interference", required=True, help="data/load_interference.csv")
    s.add_argument("--metrics", required=True, help="data/load_metrics.csv")
    s.add_argument("--fits", help="data/fits.json: the prefill and decode fits (the frontier's model) and the bootstrap settings")
    s.add_argument("--provenance", help="data/provenance.json: the KV pool and context length per configuration")
    s.add_argument("--planner", help="data/planner.json: the same where provenance lacks them")
    s.add_argument("--settings", help='the config\'s slo and load sections as JSON: {"slo": {...}, "load": {...}}')
    s.add_argument("--out", required=True)
    s.set_defaults(func=_analyze_load)

    s = sub.add_parser("whatif", help="fits + load points + provenance -> whatif.json: the serving model simulated, "
                       "checked against the measured load points, and the what-if grid")
    s.add_argument("--fits", required=True, help="data/fits.json: the prefill and decode fits and their bootstrap draws")
    s.add_argument("--load", required=True, help="data/load.json: the measured load points")
    s.add_argument("--provenance", required=True, help="data/provenance.json: each configuration's flags, pool and engine")
    s.add_argument("--requests", required=True, help="data/load_requests.csv: the open loop's scheduled arrivals")
    s.add_argument("--interference", required=True, help="data/load_interference.csv: the probes' background streams")
    s.add_argument("--settings", required=True, help='the config\'s whatif, slo and load sections as JSON')
    s.add_argument("--out", required=True)
    s.set_defaults(func=_whatif)

    s = sub.add_parser("aggregate-prefix", help="raw prefix.json files -> prefix.csv (a row per request of the hit-rate "
                       "points and the growing conversations)")
    s.add_argument("--out", required=True, help="data/prefix.csv")
    s.add_argument("raw", nargs="+", help="data/raw/<configuration>/prefix.json (a missing or unreadable one is a failed row; "
                   "'not configured' ones have none)")
    s.set_defaults(func=_aggregate_prefix)

    s = sub.add_parser("analyze-prefix", help="prefix.csv (+ results.csv, fits.json) -> prefix_fits.json: the prefix cache's "
                       "cost model, the saving against cold, the cached-count check, the conversations against the model")
    s.add_argument("--prefix", required=True, help="data/prefix.csv")
    s.add_argument("--results", help="data/results.csv: the cold single-request trials (fitted with the hit-rate points)")
    s.add_argument("--fits", help="data/fits.json: the cold prefill fit (the model is checked against it) and the bootstrap settings")
    s.add_argument("--settings", help='bootstrap, confidence, seed as JSON (default: fits.json\'s), e.g. the config\'s analysis section')
    s.add_argument("--out", required=True, help="data/prefix_fits.json")
    s.set_defaults(func=_analyze_prefix)

    s = sub.add_parser("calibrate", help="measure copy bandwidth and matmul rate of the devices the servers compute on")
    s.add_argument("--plan", help="what to measure, as JSON (what the workflow passes)")
    s.add_argument("--configfile", help="or: the config file to plan from")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_calibrate)

    s = sub.add_parser("fit", help="results.csv (+ provenance.json, calibration.json) -> fits.json")
    s.add_argument("--results", required=True)
    s.add_argument("--provenance", help="data/provenance.json: model spec, hardware, KV pool per configuration")
    s.add_argument("--calibration", help="data/calibration.json: the measured ceilings")
    s.add_argument("--settings", help="the config's analysis section as JSON (bootstrap, confidence, seed, regime_tolerance)")
    s.add_argument("--kernel-bench", nargs="*", default=[], help="data/kernels/<kernel>.json: kernels timed alone")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_fit)

    s = sub.add_parser("plan-memory", help="provenance.json -> planner.json (KV pool against mem-fraction-static)")
    s.add_argument("--provenance", required=True)
    s.add_argument("--results", help="data/results.csv: the longest length measured per configuration")
    s.add_argument("--fractions", default="0.5,0.6,0.7,0.8,0.85,0.9,0.95", help="comma-separated mem-fraction-static values")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_plan_memory)

    s = sub.add_parser("plot-load", help="load.json + load_metrics.csv -> load latency, interference, metrics and frontier figures")
    s.add_argument("--load", required=True)
    s.add_argument("--metrics", required=True)
    s.add_argument("--style", required=True)
    s.add_argument("--outdir", required=True)
    s.set_defaults(func=_plot_load)

    s = sub.add_parser("plot-prefix", help="prefix_fits.json -> the prefix cache's TTFT, saving and conversation figures")
    s.add_argument("--prefix", required=True, help="data/prefix_fits.json")
    s.add_argument("--style", required=True)
    s.add_argument("--outdir", required=True)
    s.set_defaults(func=_plot_prefix)

    s = sub.add_parser("plot-history", help="history.json -> the history figure: each version's TTFT and decode rate, "
                       "the steps marked")
    s.add_argument("--history", required=True, help="report/history.json (from render --history-out)")
    s.add_argument("--style", required=True)
    s.add_argument("--outdir", required=True)
    s.set_defaults(func=_plot_history)

    s = sub.add_parser("plot-analysis", help="fits.json + planner.json -> roofline, residual, extrapolation and planner figures")
    s.add_argument("--results", required=True)
    s.add_argument("--fits", required=True)
    s.add_argument("--planner", required=True)
    s.add_argument("--style", required=True)
    s.add_argument("--outdir", required=True)
    s.set_defaults(func=_plot_analysis)

    s = sub.add_parser("plot", help="results.csv + fits.json -> figures (PDF and PNG)")
    s.add_argument("--results", required=True)
    s.add_argument("--fits", required=True)
    s.add_argument("--style", required=True)
    s.add_argument("--itl-depth", help="data/itl_depth.csv")
    s.add_argument("--provenance", help="data/provenance.json: the trials configured, for the partial lengths")
    s.add_argument("--planner", help="data/planner.json: the analysis' figures too (as plot-analysis)")
    s.add_argument("--load", help="data/load.json, with --metrics: the load workloads' figures too (as plot-load)")
    s.add_argument("--metrics", help="data/load_metrics.csv, with --load")
    s.add_argument("--prefix", help="data/prefix_fits.json: the reused context's figures too (as plot-prefix)")
    s.add_argument("--outdir", required=True)
    s.set_defaults(func=_plot)

    def report_inputs(s, template_help: str) -> None:
        """The options of the commands that render the report: the template and what _report_inputs reads
        (one option per field of longctx.report.context.ReportInputs)."""
        s.add_argument("--template", required=True, help=template_help)
        s.add_argument("--results", required=True, help="data/results.csv")
        s.add_argument("--fits", required=True, help="data/fits.json")
        s.add_argument("--provenance", required=True, help="data/provenance.json")
        s.add_argument("--itl-depth", help="data/itl_depth.csv")
        s.add_argument("--planner", help="data/planner.json (the KV memory planner)")
        s.add_argument("--prefix", help="data/prefix_fits.json (the prefix cache's analysis)")
        s.add_argument("--load", help="data/load.json (the load workloads' analysis)")
        s.add_argument("--load-metrics", help="data/load_metrics.csv (the servers' /metrics through the load workloads)")
        s.add_argument("--whatif", help="data/whatif.json (the serving model simulated, the what-if grid)")
        s.add_argument("--advice", help="report/advice.json (the flags to restart with, toward the config's goal)")
        s.add_argument("--config-json", help="the validated configuration as JSON (what the workflow passes)")
        s.add_argument("--configfile", help="or: a config file")
        s.add_argument("--baseline", help="the configuration speedups are against (default: report.baseline, else the first one)")
        s.add_argument("--versions", help="where versions are kept (default: versions/ beside the output)")

    s = sub.add_parser("render", help="Jinja LaTeX template -> report .tex and its version record")
    report_inputs(s, "templates/longctx.tex.j2")
    s.add_argument("--out", required=True)
    s.add_argument("--version-out", required=True, help="the version record (report/version.json)")
    s.add_argument("--history-out", help="the history and its change points, for the history figure (report/history.json)")
    s.set_defaults(func=_render)

    s = sub.add_parser("pdf", help="report .tex -> PDF with latexmk, kept as a version")
    s.add_argument("--tex", required=True)
    s.add_argument("--provenance", required=True)
    s.add_argument("--version", help="the version record from render: keep the PDF as versions/longctx-v{N}-{hash}.pdf")
    s.add_argument("--versions", help="where versions are kept (default: versions/ beside --out)")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_pdf)

    s = sub.add_parser("markdown", help="the report's Markdown twin (report/longctx.md)")
    report_inputs(s, "templates/longctx.md.j2")
    s.add_argument("--version", required=True, help="the version record from render")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_markdown)

    s = sub.add_parser("plan-section", help="the Results section for a plan document (Markdown)")
    report_inputs(s, "templates/plan.md.j2")
    s.add_argument("--version", required=True, help="the version record from render")
    s.add_argument("--plan", required=True, help="the plan document it is for (links are relative to it)")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_plan_section)

    s = sub.add_parser("attach-plan", help="insert or update the Results section of a plan document")
    s.add_argument("--plan", required=True, help="the plan document (Markdown); everything outside the section is kept")
    s.add_argument("--section", required=True, help="the section (from plan-section)")
    s.set_defaults(func=_attach_plan)

    s = sub.add_parser("gate", help="this report version against an earlier one: exit 1 where a configuration and "
                       "length got slower beyond the margin (a line per regression), 0 where none did, 2 where nothing "
                       "can be compared; run in the workflow's directory after the report is built")
    s.add_argument("--against", help="the version to compare with, vN (default: the report's, report.compare_to: the "
                   "previous version unless pinned)")
    s.add_argument("--margin", type=_margin, help="a regression's whole interval lies beyond this fraction (default: the "
                   "report's, report.regression_margin, 0.05)")
    s.add_argument("--json", action="store_true", help='print the answer as JSON: {"against", "regressions": [{"configuration", '
                   '"length", "figure", "ratio", "low", "high", "n_before", "n_now"}], "compared", ...}')
    s.add_argument("--version", default="report/version.json", help="this version's record (default: report/version.json)")
    s.add_argument("--versions", help="where versions are kept (default: versions/ beside --version)")
    s.add_argument("--out", help="also write the JSON answer here")
    s.set_defaults(func=_gate)

    s = sub.add_parser("compare", help="two kept report versions compared, without measuring anything: per configuration "
                       "and length, the ratios now/before with their intervals, n and verdicts")
    s.add_argument("before", help="the earlier version, vN")
    s.add_argument("now", help="the later version, vN")
    s.add_argument("--margin", type=_margin, help="the regression margin (default: the later version's)")
    s.add_argument("--json", action="store_true", help="the whole comparison as JSON")
    s.add_argument("--versions", default="report/versions", help="where versions are kept (default: report/versions)")
    s.set_defaults(func=_compare)

    s = sub.add_parser("advise", help="the flags to restart the server with for the goal of config key advise (the "
                       "context to fit, a workload and its SLO), from the memory planner and the serving model of the "
                       "run measured in this directory; exit 0 with the advice, or with the nearest setting and the "
                       "constraint that binds where none meets the goal")
    s.add_argument("--configuration", help="the configuration to advise on (default: every one measured)")
    s.add_argument("--json", action="store_true", help='print the advice as JSON: {"configurations": {name: '
                   '{"feasible", "binding", "recommended": {"flags", "predicted": {"ttft_s_p50", "tpot_s_p50", '
                   '"goodput_rps"}, ...}, "runner_up", ...}}}')
    s.add_argument("--configfile", action="append", help="config files, merged in order (default: as the workflow merged "
                   "them, else config/longctx.yaml)")
    s.add_argument("--config-overrides", help="--config values as JSON")
    s.add_argument("--data", default="data", help="the run's data directory (default: data)")
    s.add_argument("--out", help="also write the JSON advice here")
    s.add_argument("--verify", action="store_true", help=f"prove the advice with one run: the configuration's server "
                   f"restarted with the recommended flags (a configuration `<name>-advised` that verifies it, written to "
                   f"{VERIFY_FILE}), the goal's workload measured by the workflow, then the advice with predicted "
                   "against measured ('verified'); exit 1 where the workflow failed")
    s.add_argument("--cores", type=int, default=1, help="--verify: the workflow's cores (default 1)")
    s.set_defaults(func=_advise)

    s = sub.add_parser("ab", help="the kernel sources of the working tree against an earlier version's, measured in one "
                       "run, interleaved in blocks (A B B A ...), and gated: exit 1 where a length got slower beyond the margin "
                       "or was lost, 0 where none did, 2 where nothing can be compared; run in the workflow's directory")
    s.add_argument("--against", help="the baseline: a kept report version, vN (its kernel sources, report/versions/sources/)")
    s.add_argument("--against-rev", help="the baseline: a git revision, whose kernel sources are taken with git show")
    s.add_argument("--level", choices=["server", "kernel"], help="server (default: ab.level): each configuration's server, "
                   "TTFT and decode, the kernel micro-benchmark beside; kernel: the micro-benchmark alone")
    s.add_argument("--configfile", action="append", help="config files, merged in order (default: as the workflow merged "
                   "them, else config/longctx.yaml)")
    s.add_argument("--config-overrides", help="--config values as JSON")
    s.add_argument("--json", action="store_true", help="print the answer as JSON: as `longctx gate --json`, with \"lost\", "
                   "\"not_compared\", each row's detectable change and \"cost\" (server starts, wall time)")
    s.add_argument("--versions", default="report/versions", help="where versions are kept (default: report/versions)")
    s.add_argument("--data", default="data/ab", help="where each length's blocks are written as measured (default: data/ab)")
    s.add_argument("--server-logs", default="data/logs/server/ab", help="the servers' logs (default: data/logs/server/ab)")
    s.add_argument("--measurements", default="data/ab/measurements.json", help="all measurements, written once done")
    s.add_argument("--measure-only", action="store_true", help="measure and write --measurements, no verdict")
    s.add_argument("--from-measurements", metavar="PATH", help="no measuring: the verdict over measurements written before")
    s.add_argument("--out", default="report/ab.json", help="the JSON answer (default: report/ab.json)")
    s.add_argument("--markdown", default="report/ab.md", help="the A/B's page (default: report/ab.md)")
    s.set_defaults(func=_ab)

    s = sub.add_parser("check-config", help="validate a config file and print it with defaults filled in")
    s.add_argument("configfile")
    s.set_defaults(func=_check_config)
    for name, s in sub.choices.items():  # bench has its own, with what its console shows
        if name != "bench":
            s.add_argument("--log", help="write everything here (this stage's output, its tools', the traceback of a "
                           "failure); the terminal gets the errors, in a line that names this file")
    return p


def _to_log(path: str, command: str):
    """Everything the stage writes from here on (stdout, stderr, its subprocesses', every log record) goes to
    path; the terminal keeps the lines meant for it (logger longctx.progress, errors) prefixed `longctx
    <command>:`. Returns the terminal's stream."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    terminal = os.fdopen(os.dup(2), "w", buffering=1)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    to_file = logging.StreamHandler(sys.stderr)
    to_file.setFormatter(logging.Formatter(LOG_FORMAT))
    console = logging.StreamHandler(terminal)
    console.setFormatter(logging.Formatter(f"longctx {command}: %(message)s"))
    console.addFilter(lambda r: r.name == TERMINAL.name or r.levelno >= logging.ERROR)
    root.addHandler(to_file)
    root.addHandler(console)
    root.setLevel(logging.INFO)
    return terminal


def _written(args) -> list[str]:
    """The paths a stage was told to write (its --out* and --outdir options), for an error that names none."""
    return [str(v) for k, v in sorted(vars(args).items()) if (k in ("out", "outdir") or k.startswith("out_") or k.endswith("_out")) and v]


def _write_failure(exc: OSError, args) -> str:
    """'cannot write data/fits.json: No space left on device; free space on ...': the file the error names, else
    the ones the stage was told to write."""
    outs = [exc.filename] if exc.filename else _written(args)
    where = " or ".join(map(str, outs)) or "its output"
    return f"cannot write {where}: {exc.strerror or exc}; {write_fix(exc.errno, str(outs[0]) if outs else '.')}"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    log_path = getattr(args, "log", None)
    terminal = sys.stderr
    try:
        if log_path:
            terminal = _to_log(log_path, args.command)
    except OSError as exc:
        print(f"longctx {args.command}: cannot write its log {log_path}: {exc.strerror or exc}; "
              f"{write_fix(exc.errno, log_path)}", file=sys.stderr)
        return 1
    if not log_path:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    # nor one per font table each figure's PDF embeds (over 500 lines a plotting stage, and its time)
    logging.getLogger("fontTools").setLevel(logging.WARNING)

    def say(message: str) -> None:  # one line on the terminal, and in the log
        print(f"longctx {args.command}: {message}", file=terminal, flush=True)
        if log_path:
            print(message, file=sys.stderr, flush=True)

    try:
        return args.func(args)
    except ConfigError as exc:
        say(str(exc))
        return 2
    except SystemExit as exc:  # ReportError, PlanError: a message for people, not a traceback
        if isinstance(exc.code, str):
            say(exc.code)
            return 1
        raise
    except KeyboardInterrupt:  # Ctrl-C, or (bench) SIGTERM and SIGHUP: what was measured is kept
        say("interrupted; " + ("the lengths measured so far are kept, and " if args.command == "bench" else "")
            + "the same command resumes")
        return 130
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:  # a full disk, a path that cannot be written
            say(_write_failure(exc, args))
            return 1
        if not log_path:
            raise
        # a defect: the traceback goes to the log, the terminal gets its line and the log's path
        logging.getLogger(__name__).exception("failed")
        first = str(exc).splitlines()[0] if str(exc) else ""
        say(f"failed: {type(exc).__name__}: {first} (the traceback: {log_path})")
        return 1


if __name__ == "__main__":
    sys.exit(main())
