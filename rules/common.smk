# Config validation (longctx.config: the schema in config/schema.yaml, defaults filled in) and
# the helpers the rules share.
import glob
import re

from longctx import config as lcfg
from longctx.calibrate import plan as calibration_plan
from longctx.figures import ANALYSIS_FIGURES, FIGURES, FORMATS

CFG = lcfg.validate(config)
CONFIGURATIONS = sorted(CFG["configurations"])
LENGTHS = CFG["lengths"]
ENV = "../envs/longctx.yaml"
# The report template includes these; an edit to one re-renders the report.
TEMPLATE_SECTIONS = sorted(glob.glob("templates/sections/*.tex.j2"))


wildcard_constraints:
    configuration="|".join(re.escape(c) for c in CONFIGURATIONS),
    kernel="|".join(re.escape(k) for k in CFG["kernels"]) or "(?!)",


ITL_DEPTH = bool(CFG["protocol"]["itl_depth"]["length"])


def raw_files(configurations=CONFIGURATIONS):
    """What a bench job writes: a file per length, and the ITL-against-depth request when configured."""
    names = [str(n) for n in LENGTHS] + (["itl_depth"] if ITL_DEPTH else [])
    return expand("data/raw/{configuration}/{name}.json", configuration=configurations, name=names)


def kernel_build(wildcards):
    """The build of the kernel a configuration uses: editing its sources reruns that configuration."""
    kernel = CFG["configurations"][wildcards.configuration]["kernel"]
    return [f"{lcfg.kernel_build_dir(kernel)}/manifest.json"] if kernel else []


def bench_spec(wildcards):
    return lcfg.canonical_json(lcfg.configuration_spec(CFG, wildcards.configuration))
