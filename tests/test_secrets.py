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


def test_identity_digests_take_no_secret_value_only_a_keyed_one(tmp_path, monkeypatch):
    """Issue 54, item 5: the spec hash and the resume key (published in every raw file, version record and on the
    bench's command line) digest no secret value: the environment's values, the URL's user (a token as the user name
    alone) and password, secret flags' words and secret-named values enter keyed (an HMAC under the workflow
    directory's own key, .longctx/hash-key, 0600). The digest still moves when a value changes, differs from the
    unkeyed digest a guesser would compute, and differs under another directory's key; the URL's user alone is among
    the values every text is scrubbed of."""
    import json
    import os
    import secrets
    from dataclasses import replace

    from longctx.core.hashing import digest
    from longctx.measure.rawfiles import resume_key

    from .conftest import tiny_spec

    monkeypatch.chdir(tmp_path)
    token = "tk-" + secrets.token_hex(10)
    spec = replace(tiny_spec(), env={"HF_TOKEN": token, "OMP_NUM_THREADS": "2"}, extra_args=["--api-key", token],
                   url=f"http://{token}@127.0.0.1:9/v1")
    plain = spec.hashable()
    assert token not in json.dumps(plain)
    assert oct(os.stat(tmp_path / ".longctx" / "hash-key").st_mode & 0o777) == "0o600"
    assert spec.spec_hash() != digest(spec.to_dict())  # what a guesser holding the token could compute
    rotated = replace(spec, env={**spec.env, "HF_TOKEN": token + "x"})
    assert rotated.spec_hash() != spec.spec_hash() and resume_key(rotated, None, None) != resume_key(spec, None, None)
    assert spec.spec_hash() == spec.spec_hash()  # the same key the next time
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    assert spec.spec_hash() != digest(plain)  # another directory's key: another digest
    assert token in spec.url_secrets()  # a token given as the URL's user name alone
