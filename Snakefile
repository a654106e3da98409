# longctx: `snakemake --cores 1 report/longctx.pdf`. Logic lives in the longctx package; rules/ only wire it.
import os
import sys

from snakemake.utils import min_version

min_version("9.0")


# A lock left by an interrupted run (Ctrl-C, SIGHUP, a crash) is cleared when no other snakemake runs
# here, so that the README's command works again as written; a job step never clears one.
if workflow.is_main_process:
    from longctx.measure.rerun import clear_stale_locks

    _cleared = clear_stale_locks(os.getcwd())
    if _cleared:
        print(_cleared, file=sys.stderr)


# The default config, unless others are given with --configfile (Snakemake would otherwise merge
# them into it, configurations included).
if not workflow.overwrite_configfiles:

    configfile: "config/longctx.yaml"


include: "rules/common.smk"
include: "rules/kernels.smk"
include: "rules/bench.smk"
include: "rules/analyze.smk"
include: "rules/report.smk"


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
# onsuccess: the check then runs where it says "Nothing to be done" (its lock released on the way out).
def _verdict():
    from longctx.analysis.aggregate import run_verdict

    return run_verdict("data/results.csv", CFG["allow_missing"])


onsuccess:
    _problem = _verdict()
    if _problem:
        print(f"longctx: {_problem}", file=sys.stderr)
        sys.exit(1)


if workflow.is_main_process:
    import logging

    from snakemake.common import NOTHING_TO_BE_DONE_MSG

    class _NothingToDo(logging.Filter):
        def filter(self, record):
            if record.getMessage() == NOTHING_TO_BE_DONE_MSG and not workflow.dryrun:
                problem = _verdict()
                if problem:
                    print(f"{NOTHING_TO_BE_DONE_MSG}\nlongctx: {problem}", file=sys.stderr)
                    raise SystemExit(1)
            return True

    logging.getLogger("snakemake.logging").addFilter(_NothingToDo())
