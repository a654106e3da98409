# Config validation (longctx.config: the schema in config/schema.yaml, defaults filled in) and
# the helpers the rules share.
import glob
import json
import os
import re

from longctx import config as lcfg
from longctx.core.hashing import canonical_json
from longctx.measure.calibration import plan as calibration_plan
from longctx.report.figures import DATA_FIGURES, FORMATS, HISTORY_FIGURES
from longctx.measure.resources import bench_resources
from longctx.measure import imports
from longctx.measure.rawfiles import retry_input
from longctx.engines import get_adapter

CFG = lcfg.validate(config)
CONFIGURATIONS = sorted(CFG["configurations"])
# the lengths every measured configuration's bench job writes a file for: the fixed sweep's, or the adaptive
# sweep's grid (lengths.adaptive; the lengths it does not choose are files that say so, and sweep.json its path)
LENGTHS = lcfg.length_grid(CFG)
ADAPTIVE = lcfg.adaptive_of(CFG) is not None
# Configurations whose results another tool measured (engine: imported; longctx.measure.imports): their
# result files are inputs of their import rule, and their lengths are the ones those files hold (read
# when the workflow is parsed: a changed file can change them). The others are measured (bench_configuration).
IMPORTED = [c for c in CONFIGURATIONS if not get_adapter(CFG["configurations"][c]["engine"]).measures]
MEASURED = [c for c in CONFIGURATIONS if c not in IMPORTED]
IMPORTED_FILES = {c: [str(p) for p in imports.files_of(CFG["configurations"][c], c)] for c in IMPORTED}
CONFIGURATION_LENGTHS = {c: imports.lengths_of(lcfg.configuration_spec(CFG, c)) for c in IMPORTED}
# ... and a configuration that verifies the advice (configurations.<name>.verifies) measures the goal's lengths alone
VERIFYING = [c for c in MEASURED if CFG["configurations"][c].get("verifies")]
CONFIGURATION_LENGTHS.update({c: lcfg.verify_lengths(CFG) for c in VERIFYING})
# Where each bench job keeps a copy of every length it measured (resumed from; aggregation recovers
# an unreadable raw file from it).
PARTIAL = "data/partial"
ENV = "../envs/longctx.yaml"
# The report template includes these; an edit to one re-renders the report.
TEMPLATE_SECTIONS = sorted(glob.glob("templates/sections/*.tex.j2"))
# Every file under templates/ (LaTeX, Markdown, the plot style) is part of a report version's hash,
# so each is an input of render_report: an edit makes a new version.
TEMPLATES = sorted(p for p in glob.glob("templates/**", recursive=True) if os.path.isfile(p))
MARKDOWN_PARTIALS = sorted(glob.glob("templates/markdown/*.md.j2"))
BASELINE = lcfg.report_baseline(CFG)
# What the report prints as its configuration (and hashes into its version): env values hidden
# (longctx.config.report_config), as in every param, so that none reaches .snakemake/ or a log.
REPORT_CONFIG = json.dumps(lcfg.report_config(CFG))  # in the config file's order
# What a bench job reads its configuration from: the config files Snakemake merged, in order, and
# its --config values, handed to `longctx bench` in its environment (LONGCTX_CONFIG_SOURCES; a job step
# on a cluster node parses the workflow again and sets it there too). Neither a param nor part of the
# command: the same spec under another file name reruns nothing, and the job's params carry only the
# spec's hash, its staleness, never the spec.
os.environ[lcfg.CONFIG_SOURCES_VAR] = canonical_json({"configfiles": [str(f) for f in workflow.configfiles],
                                                      "overrides": workflow.config_settings.config or {}})
# The data every rendering of the report reads (the PDF's .tex, the Markdown twin, a plan's section):
# the inputs of those rules, each a field of longctx.report.context.ReportInputs and an option of
# `longctx render/markdown/plan-section` (--results, --fits, --provenance, --itl-depth, --planner).
REPORT_DATA = dict(results="data/results.csv", fits="data/fits.json", provenance="data/provenance.json",
                   itl_depth="data/itl_depth.csv", planner="data/planner.json", load="data/load.json",
                   load_metrics="data/load_metrics.csv", prefix="data/prefix_fits.json", whatif="data/whatif.json",
                   # the advice toward the config's goal (rule advise), only where a goal is set
                   **({"advice": "report/advice.json"} if CFG.get("advise") else {}))
# ... and the baseline and configuration those rules pass (their params).
REPORT_PARAMS = dict(baseline=BASELINE, config=REPORT_CONFIG)


# Only the bench jobs, the calibration (the ceilings of the machine the servers run on) and the
# kernel builds need a compute node; the rest runs where snakemake runs.
localrules:
    aggregate_results,
    check_regressions,
    check_ab,
    aggregate_load,
    analyze_load,
    whatif,
    aggregate_prefix,
    analyze_prefix,
    fit_models,
    plan_memory,
    plot_figures,
    render_report,
    plot_history,
    build_pdf,
    render_markdown,
    render_plan_section,
    attach_plan,
    all,


# `--resources gpu=N` caps the GPUs all running jobs hold together (the machine's, or a cluster share).
resource_scopes:
    gpu="global",


wildcard_constraints:
    configuration="|".join(re.escape(c) for c in CONFIGURATIONS),
    kernel="|".join(re.escape(k) for k in CFG["kernels"]) or "(?!)",
    plan="[A-Za-z0-9][A-Za-z0-9_.-]*",


ITL_DEPTH = bool(CFG["protocol"]["itl_depth"]["length"])


def raw_names(configuration, load=True):
    """The names of the files a bench (or import) job writes in data/raw/<configuration>/: a file per length (an
    imported configuration's own lengths, a verifying one's the goal's), the ITL-against-depth request when
    configured, an adaptive sweep's path,
    a measured configuration's metronome readings (longctx.measure.metronome; or a record that it takes none), and
    (with load) load.json and prefix.json: the load and the reused-context workloads, or a record that the
    configuration measures none."""
    c = configuration
    names = [str(n) for n in CONFIGURATION_LENGTHS.get(c, LENGTHS)] + (["itl_depth"] if ITL_DEPTH else [])
    names += ["sweep"] if ADAPTIVE and c not in IMPORTED + VERIFYING else []
    names += ["metronome"] if c not in IMPORTED else []
    return names + (["load", "prefix"] if load else [])


def raw_files(configurations=CONFIGURATIONS, load=True):
    """What a bench (or import) job writes (raw_names), as paths."""
    return [f"data/raw/{c}/{n}.json" for c in ([configurations] if isinstance(configurations, str) else configurations)
            for n in raw_names(c, load)]


def load_files():
    return expand("data/raw/{configuration}/load.json", configuration=CONFIGURATIONS)


def prefix_files():
    return expand("data/raw/{configuration}/prefix.json", configuration=CONFIGURATIONS)


def kernel_build(wildcards):
    """The build of the kernel a configuration uses: editing its sources reruns that configuration."""
    kernel = CFG["configurations"][wildcards.configuration]["kernel"]
    return [f"{lcfg.kernel_build_dir(kernel)}/manifest.json"] if kernel else []


# Native kernels that a configuration uses are also timed alone (rule bench_kernel) at the shape they
# serve, for the roofline (one no configuration uses serves no shape).
NATIVE_KERNELS = sorted(k for k, v in CFG["kernels"].items()
                        if v["kind"] == "native" and any(c["kernel"] == k for c in CFG["configurations"].values()))


def kernel_bench_shape(wildcards):
    """`longctx bench-kernel`'s shape options: the shape the configurations using the kernel serve (heads
    per tensor-parallel rank, KV dtype: each configuration's model as its engine runs it), or a
    ConfigError where they serve none or several (longctx.attention.shapes)."""
    from longctx.attention.shapes import served_shape
    from longctx.engines import get_adapter

    served = {name: get_adapter(conf["engine"]).model_spec(CFG["model"], conf["args"])
              for name, conf in CFG["configurations"].items() if conf["kernel"] == wildcards.kernel}
    return served_shape(wildcards.kernel, served).options()


def bench_spec_hash(wildcards):
    """The hash of the configuration's spec (longctx.engines.ConfigurationSpec): a changed spec reruns its bench."""
    return lcfg.configuration_spec(CFG, wildcards.configuration).spec_hash()


def bench_resource(name):
    """The bench job's Snakemake resource `name` (gpu, mem_mb, runtime) from the config."""
    return lambda wildcards: bench_resources(CFG, wildcards.configuration)[name]


def report_shell(command, options):
    """The shell command that renders the report, its twin or a plan's section, for rules whose input
    holds REPORT_DATA and a template and whose params are REPORT_PARAMS: `longctx <command>` with the
    template, the data, the baseline and the configuration, then `options`; its output to the log."""
    data = " ".join(f"--{name.replace('_', '-')} {{input.{name}}}" for name in REPORT_DATA)
    return (f"longctx {command} --template {{input.template}} {data} --baseline {{params.baseline:q}} "
            f"--config-json {{params.config:q}} {options} --log {{log}}")


def ab_sources(wildcards):
    """The sources of every kernel a configuration uses: an edit to one reruns the A/B."""
    return sorted({s for c in CFG["configurations"].values() if c.get("kernel") for s in CFG["kernels"][c["kernel"]]["sources"]})


def ab_revision():
    """The commit ab.against_rev names now (a branch moves), or None."""
    rev = CFG["ab"]["against_rev"]
    if not rev:
        return None
    import subprocess

    proc = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True, text=True)
    return proc.stdout.strip() or rev
