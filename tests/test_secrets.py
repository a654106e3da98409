"""Secrets stay in the config file (issue 16, item 5): no value of a configuration's `env:` reaches a
Snakemake param, a command line, a log, `.snakemake/` or the report, unless report.env_shown names
the variable. Checked on a real workflow run by searching every file it wrote (the PDF's text through
pdftotext) and every process's command line while it ran, for a marker value."""

import subprocess
import sys
import threading
import time

import psutil
import pytest
import yaml

from .conftest import ENV, TINY, copy_workflow
from .test_report import pdftotext

pytestmark = pytest.mark.slow
MARKER = "mk-7f3e91c2-secret"


def test_env_values_are_found_nowhere_the_workflow_writes(tmp_path):
    work = copy_workflow(tmp_path)
    config = yaml.safe_load(TINY.read_text())
    config.update(lengths=[64, 128, 256], protocol={**config["protocol"], "concurrency": [], "itl_depth": {"length": None}})
    page1 = {**config["configurations"]["page1"], "env": {"API_KEY": MARKER, "DB_PASS": MARKER, "AUTH_HEADER": f"Bearer {MARKER}",
                                                          "OMP_NUM_THREADS": "2"}}
    config["configurations"] = {"page1": page1}
    (work / "secret.yaml").write_text(yaml.safe_dump(config))
    seen: set[str] = set()
    done = threading.Event()

    def watch():  # every process's command line, while the workflow runs
        while not done.is_set():
            for proc in psutil.process_iter(["cmdline"]):
                line = " ".join(proc.info["cmdline"] or [])
                if MARKER in line:
                    seen.add(line[:300])
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", "secret.yaml"], cwd=work,
                             env=ENV, capture_output=True, text=True, timeout=600)
        # then a changed param: Snakemake's "Params have changed" message must not print the values either
        config["configurations"]["page1"]["env"]["OMP_NUM_THREADS"] = "1"
        (work / "secret.yaml").write_text(yaml.safe_dump(config))
        rerun = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", "secret.yaml"], cwd=work,
                               env=ENV, capture_output=True, text=True, timeout=600)
    finally:
        done.set()
        watcher.join()
    assert run.returncode == 0, run.stderr[-3000:]
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert MARKER not in run.stdout + run.stderr + rerun.stdout + rerun.stderr
    assert not seen, seen
    found = []
    for path in work.rglob("*"):
        if path.is_file() and path.name != "secret.yaml":
            data = pdftotext(path).encode() if path.suffix == ".pdf" else path.read_bytes()
            if MARKER.encode() in data:
                found.append(str(path.relative_to(work)))
    assert not found, found
    text = " ".join(pdftotext(work / "report" / "longctx.pdf").split())
    assert "API_KEY: (hidden)" in text and "DB_PASS: (hidden)" in text and "AUTH_HEADER: (hidden)" in text
    assert "OMP_NUM_THREADS: '1'" in text or "OMP_NUM_THREADS: 1" in text  # report.env_shown's default lists it
