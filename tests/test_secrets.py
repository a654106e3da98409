"""Secrets stay in the config file (issue 16, item 5): no value of a configuration's `env:` reaches a
Snakemake param, a command line, a log, `.snakemake/` or the report, unless report.env_shown names
the variable. Checked on the suite's real workflow run (tests/configs/tiny.yaml gives page1 an env with a
marker value) by searching every file it wrote (the PDF's text through pdftotext), its console output, and
every process's command line sampled while it ran."""

import pytest

from .conftest import TINY_RUN
from .test_report import pdftotext

pytestmark = pytest.mark.slow
MARKER = "mk-7f3e91c2-secret"


def test_env_values_are_found_nowhere_the_workflow_writes(tiny_workflow):
    work = tiny_workflow
    assert MARKER in (work / "tiny.yaml").read_text()  # the config has it, nothing else may
    assert MARKER not in TINY_RUN["console"]
    assert TINY_RUN["command_lines"] and not [c for c in TINY_RUN["command_lines"] if MARKER in c]
    found = []
    for path in work.rglob("*"):
        if path.is_file() and not (path.parent == work and path.suffix == ".yaml"):  # the config files themselves
            data = pdftotext(path).encode() if path.suffix == ".pdf" else path.read_bytes()
            if MARKER.encode() in data:
                found.append(str(path.relative_to(work)))
    assert not found, found
    text = " ".join(pdftotext(work / "report" / "longctx.pdf").split())
    assert "API_KEY: (hidden)" in text and "DB_PASS: (hidden)" in text and "AUTH_HEADER: (hidden)" in text
    assert "HF_HUB_OFFLINE: '1'" in text  # report.env_shown's default lists it
