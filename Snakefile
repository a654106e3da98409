# longctx: `snakemake --cores 1 report/longctx.pdf`. Logic lives in the longctx package; rules/ only wire it.
import os
import sys

from snakemake.utils import min_version

from longctx.config import ConfigError, config_error_lines

min_version("9.0")


# A lock left by an interrupted run (Ctrl-C, SIGHUP, a crash) is cleared when no other snakemake runs
# here, so that the README's command works again as written; a job step never clears one. A lock that a
# live run holds stands, and Snakemake's refusal names that run and says to wait for it (not to --unlock).
# Snakemake locks per file, and that is kept: a second run whose files do not overlap the first's (another
# kernel's build, a --configfile of other configurations) goes ahead. Refusing it too would take a lock of
# our own around every run and stop the harmless ones (a report rendered while a kernel builds); a bench
# that shares the machine with another is what the contention flags in results.csv catch.
# Ctrl-C exits 130 (the onerror below), once Snakemake has cancelled its jobs.
if workflow.is_main_process:
    from longctx.measure.rerun import clear_stale_locks, name_lock_holders, watch_interrupt

    _cleared = clear_stale_locks(os.getcwd())
    if _cleared:
        print(_cleared, file=sys.stderr)
    name_lock_holders(os.getcwd())
    watch_interrupt()


# The default config, unless others are given with --configfile (Snakemake would otherwise merge
# them into it, configurations included).
if not workflow.overwrite_configfiles:

    configfile: "config/longctx.yaml"


# A config error is its one line (its message names the key and the allowed values), exit status 1: not
# Snakemake's report of an exception in rules/common.smk, with a fragment of its traceback.
try:

    include: "rules/common.smk"
    include: "rules/kernels.smk"
    include: "rules/bench.smk"
    include: "rules/analyze.smk"
    include: "rules/report.smk"

except ConfigError as _error:
    sys.exit(config_error_lines(_error))


rule all:
    input:
        "report/longctx.pdf",
        "report/longctx.md",
        CFG["report"]["plans"],
        [f"report/{plan}" for plan in CFG["report"]["plans"]],
    default_target: True


# The exit status is the truth: a run that leaves a configured length with no successful measurement exits 1 once
# the report that says why is written, naming what is missing in one line (allow_missing: true lets a partial report
# pass); one that measured nothing, always. So does a rerun that has nothing to do, which Snakemake ends before
# onsuccess (longctx.measure.rerun.judge_nothing_to_do).
onsuccess:
    from longctx.analysis.aggregate import run_verdict

    _problem = run_verdict("data/results.csv", CFG["allow_missing"])
    if _problem:
        print(f"longctx: {_problem}", file=sys.stderr)
        sys.exit(1)


if workflow.is_main_process:
    from longctx.analysis.aggregate import run_verdict
    from longctx.measure.rerun import judge_nothing_to_do

    judge_nothing_to_do(lambda: run_verdict("data/results.csv", CFG["allow_missing"]),
                        lambda: not (workflow.dryrun or workflow.touch or workflow.execution_settings.no_hooks)
                        and any("data/results.csv" in map(str, job.output) for job in workflow.dag.jobs))


# Ctrl-C: Snakemake has cancelled its jobs (each bench kept what it measured and stopped its server); the run
# exits 130, the shell's convention for an interrupted command, not 1.
onerror:
    from longctx.measure.rerun import interrupted, interrupted_message

    if interrupted():
        print(interrupted_message(log), file=sys.stderr)
        sys.exit(130)
