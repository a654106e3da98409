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


# A run in which no configuration measured anything exits non-zero, once the report that says what failed
# is written (a run where some measured exits 0: page one names what was not measured).
onsuccess:
    from longctx.analysis.aggregate import nothing_measured

    _nothing = nothing_measured("data/results.csv")
    if _nothing:
        print(f"longctx: {_nothing}", file=sys.stderr)
        sys.exit(1)


# Ctrl-C: Snakemake has cancelled its jobs (each bench kept what it measured and stopped its server); the run
# exits 130, the shell's convention for an interrupted command, not 1.
onerror:
    from longctx.measure.rerun import interrupted, interrupted_message

    if interrupted():
        print(interrupted_message(log), file=sys.stderr)
        sys.exit(130)
