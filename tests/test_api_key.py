"""A server behind an API key (issue 31, item 3): `api_key_env` names the environment variable that holds the
key; the bench reads it, sends it as a Bearer token with every request, gives it to a managed server, and
writes it nowhere. Secret-named values in args, launch commands and server info are masked wherever they are
shown.

The reference engine's --api-key does what SGLang's does (sglang/srt/utils/auth.py): 401 without the token,
the health and metrics paths open. vLLM's own --api-key (through VLLM_API_KEY) is the third-party check, in
tests/test_realmodel.py."""

from __future__ import annotations

import json
import secrets
from dataclasses import replace

import httpx
import pytest

from longctx import config as lcfg
from longctx.core.errors import ConfigError
from longctx.core.secrets import HIDDEN, mask, mask_argv, scrub, secret_name
from longctx.engines import get_adapter
from longctx.measure.process import ManagedServer, free_port
from longctx.measure.sweep import run_configuration

from .conftest import TINY, refengine_command, tiny_spec

VAR = "LONGCTX_TEST_API_KEY"


@pytest.fixture
def key(monkeypatch) -> str:
    value = "lk-" + secrets.token_hex(16)
    monkeypatch.setenv(VAR, value)
    return value


def test_secret_names_and_masks():
    for name in ("api-key", "api_key", "API_KEY", "hf-token", "HF_TOKEN", "AUTH_HEADER", "DB_PASS", "Authorization",
                 "password", "client_secret", "aws.credentials"):
        assert secret_name(name), name
    for name in ("tokenizer", "max_tokens", "max-total-tokens", "api_key_env", "ssl-keyfile", "author", "model-path"):
        assert not secret_name(name), name
    # only a text value is hidden: kv_bytes_per_token is named like a token but holds a number
    assert mask({"a": {"api_key": "k", "kv_bytes_per_token": 5, "tokenizer": "/p"}, "l": [{"hf_token": "t"}]}) == \
        {"a": {"api_key": HIDDEN, "kv_bytes_per_token": 5, "tokenizer": "/p"}, "l": [{"hf_token": HIDDEN}]}
    assert mask_argv(["python", "-m", "sglang.launch_server", "--api-key", "K1", "--port", "3", "--hf-token=abc",
                      "--disable-radix-cache", "--model-path", "m"]) == \
        ["python", "-m", "sglang.launch_server", "--api-key", HIDDEN, "--port", "3", f"--hf-token={HIDDEN}",
         "--disable-radix-cache", "--model-path", "m"]
    assert scrub("key abcd1234 in abcd1234.", "abcd1234") == f"key {HIDDEN} in {HIDDEN}."


def test_the_key_reaches_each_engine_its_own_way():
    """SGLang by its --api-key flag; vLLM by VLLM_API_KEY and the reference engine by REFENGINE_API_KEY, off their
    command lines (everyone's process list)."""
    cmd, env = ["serve"], {"A": "1"}
    assert get_adapter("sglang").with_api_key(cmd, env, "K") == (["serve", "--api-key", "K"], env)
    assert get_adapter("reference").with_api_key(cmd, env, "K") == (cmd, {"A": "1", "REFENGINE_API_KEY": "K"})
    assert get_adapter("vllm").with_api_key(cmd, env, "K") == (cmd, {"A": "1", "VLLM_API_KEY": "K"})
    assert get_adapter("vllm").with_api_key(cmd, env, None) == (cmd, env)


def test_config_errors_name_the_key():
    raw = lcfg.read(TINY)
    with pytest.raises(ConfigError, match=r"configurations\.page1\.args\.api-key.*api_key_env"):
        lcfg.validate(lcfg.merge(raw, {"configurations": {"page1": {"args": {"api-key": "k"}}}}))
    config = lcfg.validate(lcfg.merge(raw, {"configurations": {"page1": {"api_key_env": "LONGCTX_NOT_SET_ANYWHERE"}}}))
    spec = lcfg.configuration_spec(config, "page1")
    with pytest.raises(ConfigError, match=r"configurations\.page1\.api_key_env.*LONGCTX_NOT_SET_ANYWHERE is not set"):
        spec.auth_headers()
    with pytest.raises(ConfigError, match=r"api_key_env"):
        lcfg.validate(lcfg.merge(raw, {"configurations": {"page1": {"api_key_env": "not a name"}}}))


def test_redacted_config_hides_secret_args_and_flags():
    raw = lcfg.read(TINY)
    config = lcfg.validate(lcfg.merge(raw, {"configurations": {"page1": {
        "extra_args": ["--hf-token", "hf-secret-1", "--log-level", "info"], "api_key_env": VAR}}}))
    shown = json.dumps(lcfg.redacted(config))
    assert "hf-secret-1" not in shown and VAR in shown  # the variable's name is shown, never a value


def test_the_reference_engine_refuses_a_request_without_the_key(key, tmp_path):
    port = free_port()
    with ManagedServer(refengine_command(port, "--api-key", key), tmp_path / "server.log") as server:
        base = f"http://127.0.0.1:{port}"
        server.wait_healthy(base + "/health", 120)
        body = {"text": "hello", "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(base + "/generate", json=body).status_code == 401
        assert httpx.post(base + "/generate", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.post(base + "/generate", json=body, headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert httpx.get(base + "/health").status_code == 200  # open, as SGLang's
        # an external configuration pointed at it without the key is told what to set
        spec = replace(tiny_spec(lengths=[64]), engine="external", url=base, api="sglang", args={})
        assert run_configuration(spec, tmp_path / "raw-nokey", tmp_path / "nokey.log") == 1
        refused = (tmp_path / "raw-nokey" / "64.json").read_text()
        assert "unauthorized (HTTP 401): it wants an API key" in refused and "api_key_env" in refused
        # with it, it is measured
        keyed = replace(spec, api_key_env=VAR)
        keyed.protocol.update(warmup=0, trials=1, output_tokens=3)
        assert run_configuration(keyed, tmp_path / "raw-ext", tmp_path / "ext.log") == 0
    assert key not in (tmp_path / "server.log").read_text()  # its server_args line hides it


def test_a_managed_server_with_a_key_is_measured_and_the_key_written_nowhere(key, tmp_path):
    """The reference engine started by longctx with --api-key: every request carries the key (or it would be
    refused), and no file the bench wrote holds it: the raw files (launch command, server info, which carries
    api_key as SGLang's /server_info does), the server log."""
    spec = replace(tiny_spec(lengths=[64]), api_key_env=VAR)
    spec.protocol.update(warmup=0, trials=1, output_tokens=3)
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 0
    result = json.loads((tmp_path / "raw" / "64.json").read_text())
    assert [t["status"] for t in result["trials"]] == ["ok"]
    prov = result["provenance"]
    assert prov["server_info"]["api_key"] == HIDDEN and "--api-key" not in prov["launch_command"]
    found = [str(p) for p in tmp_path.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert not found, found


def test_a_managed_servers_key_is_not_in_the_process_list(key, tmp_path):
    """Issue 46, item 2: while the reference engine runs with a key, its command line (what every user of the
    machine reads in the process list, /proc/<pid>/cmdline) does not hold it; the key is in its environment, which
    only its owner can read, and the server requires it."""
    from pathlib import Path

    from longctx.engines import get_adapter as adapter
    from longctx.measure.session import Session

    spec = replace(tiny_spec(lengths=[64]), api_key_env=VAR)
    session = Session(adapter("reference"), spec, tmp_path / "server.log", {})
    try:
        session.up()
        pid = session.server.pid
        assert key.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert f"REFENGINE_API_KEY={key}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
        assert Path(f"/proc/{pid}/environ").stat().st_mode & 0o077 == 0  # its owner's alone
        assert httpx.get(session.base + "/v1/models").status_code == 401
    finally:
        session.close()


def test_a_password_in_the_url_is_sent_as_basic_auth_and_written_nowhere(tmp_path, caplog):
    """Issue 46, item 1: `http://user:pass@host` for an external server. The server (a stub that answers 401
    without the credential) measures every length, so the user and password went as HTTP Basic; the password is in
    no file the bench wrote (raw files and their provenance, base_url included), none of its log lines, not the
    config the workflow passes to `longctx render` and to every Snakemake param (config.redacted), and not the
    error of a server that is not there. A token in the URL's query cannot ride on a base URL (longctx appends its
    paths): a config error that hides it."""
    import base64
    import logging
    import secrets as stdlib_secrets

    from longctx.core.errors import ConfigError

    from .openai_servers import openai_server
    from .test_prompts import external

    password = "pw-" + stdlib_secrets.token_hex(8)
    cred = base64.b64encode(f"alice:{password}".encode()).decode()
    with caplog.at_level(logging.INFO), openai_server("no-health", tmp_path, basic=cred) as (base, seen):
        url = base.replace("http://", f"http://alice:{password}@")
        config = external(url, str(tmp_path / "no-health"), lengths=(64,))
        spec = lcfg.configuration_spec(config, "ext")
        assert spec.base_url() == base and spec.auth_headers() == {"Authorization": f"Basic {cred}"}
        assert run_configuration(spec, tmp_path / "raw", tmp_path / "x.log") == 0
        assert len(seen) > 1
    result = json.loads((tmp_path / "raw" / "64.json").read_text())
    assert result["status"] == "ok" and result["provenance"]["base_url"] == base
    # not there any more: the reason and every message
    assert run_configuration(spec, tmp_path / "raw-down", tmp_path / "y.log") == 1
    found = [str(p) for p in tmp_path.rglob("*") if p.is_file() and password.encode() in p.read_bytes()]
    assert not found and password not in caplog.text, found
    shown = json.dumps(lcfg.redacted(config))
    assert password not in shown and f"http://(hidden)@{base.removeprefix('http://')}" in shown
    with pytest.raises(ConfigError, match=r"carries a query") as e:
        external(base + "/?token=" + password, str(tmp_path / "no-health"))
    assert password not in str(e.value)


def test_one_redaction_for_every_path_and_the_names_it_knows():
    """Issue 46, item 3: the report's config listing reads a config given by `longctx render --configfile` as the
    file says; it goes through the same redaction as the workflow's params (longctx.core.secrets.redact_config): an
    env value under a name that does not look secret, a key in extra_args, a URL's password, each secret of a list.
    And the names: ACCESS_KEY, PRIVATE_KEY, CREDENTIALS, SESSION, COOKIE."""
    from longctx.core.secrets import redact_config
    from longctx.report.context import context

    from .report_data import config as report_config
    from .report_data import inputs, write_data

    for name in ("ACCESS_KEY", "aws_access_key_id", "PRIVATE_KEY", "private-key", "CREDENTIALS", "SESSION", "session_id",
                 "COOKIE", "set-cookie", "secret_key", "bearer"):
        assert secret_name(name), name
    assert mask({"hf_token": ["t1", "t2"], "secret": "t3", "n": 4}) == {"hf_token": [HIDDEN, HIDDEN], "secret": HIDDEN, "n": 4}
    c = report_config()
    name = next(iter(c["configurations"]))
    c["configurations"][name].update(env={"ENDPOINT_NOTE": "plain-value-77"}, extra_args=["--api-key", "xa-key-55"])
    c["configurations"]["remote"] = {"engine": "external", "url": "http://bob:pw-url-99@10.0.0.1:8000", "api": "openai"}
    assert redact_config(redact_config(c)) == redact_config(c)  # idempotent: a redacted config passes as it is
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        listing = "\n".join(context(inputs(write_data(Path(d)), config=c))["config_yaml"])
    for value in ("plain-value-77", "xa-key-55", "pw-url-99", "bob"):
        assert value not in listing, (value, listing)
    assert "http://(hidden)@10.0.0.1:8000" in listing and "--api-key" in listing


def test_sglangs_key_goes_in_a_file_of_its_own_and_never_into_its_log(tmp_path):
    """Issue 46, item 2 for SGLang, which reads no environment variable for its key: the key goes in a YAML file only
    this user can read, named by SGLang's --config, and SGLang's own parser (the installed sglang's
    prepare_server_args) takes the key from it, so the process list shows a path. SGLang logs its arguments
    (`server_args=ServerArgs(... api_key='...')`): the server's output reaches its log through a filter that hides the
    key as each line is written (ManagedServer's secrets), so the log does not hold it even after the server and its
    bench are killed without a clean stop."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from longctx.measure.process import ManagedServer

    key = "sk-" + secrets.token_hex(8)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    cmd, env = get_adapter("sglang").with_api_key(["python", "-m", "sglang.launch_server", "--model-path", "m"], {}, key, private)
    (i,) = [n for n, w in enumerate(cmd) if w == "--config"]
    path = cmd[i + 1]
    assert key not in " ".join(cmd) and env == {} and os.stat(path).st_mode & 0o777 == 0o600
    # SGLang's own parser and its own repr of what it parsed, printed as its launch does
    show = ("import sys, time; from sglang.srt.server_args import prepare_server_args; "
            "print(f'server_args={prepare_server_args(sys.argv[1:])!r}', flush=True); time.sleep(60)")
    probe = subprocess.run([sys.executable, "-c", "import sglang.srt.server_args"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("SGLang's argument parser is not installed (make test installs it)")
    server = ManagedServer([sys.executable, "-c", show, *cmd[3:]], tmp_path / "server.log", secrets=(key,))
    server.start()
    try:
        deadline = time.monotonic() + 60
        while "server_args=ServerArgs(" not in (tmp_path / "server.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = (tmp_path / "server.log").read_text()
        assert "api_key='(hidden)'" in text and key not in text, text[-500:]
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # no clean stop: nothing scrubs the log afterwards
        server.proc.wait()
    assert key not in (tmp_path / "server.log").read_text()


@pytest.mark.parametrize("form", ["--config F", "--config=F"])
def test_sglangs_key_goes_in_a_copy_of_the_users_own_config_never_on_its_command_line(tmp_path, form):
    """Issue 54, item 5: a command that has the user's own SGLang --config (either form): the key goes in a private
    copy of that file (SGLang takes one --config), the user's flags kept; SGLang's own parser reads both from it."""
    import os
    import subprocess
    import sys

    key = "sk-" + secrets.token_hex(8)
    own = tmp_path / "mine.yaml"
    own.write_text("mem-fraction-static: 0.61\nmax-running-requests: 7\n")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    given = ["--config", str(own)] if form == "--config F" else [f"--config={own}"]
    cmd, env = get_adapter("sglang").with_api_key(["python", "-m", "sglang.launch_server", "--model-path", "m", *given],
                                                  {}, key, private)
    assert key not in " ".join(cmd) and env == {} and str(own) not in " ".join(cmd)
    (i,) = [n for n, w in enumerate(cmd) if w.startswith("--config")]
    assert cmd[i] == "--config" and os.stat(cmd[i + 1]).st_mode & 0o777 == 0o600 and key not in own.read_text()
    show = ("import sys; from sglang.srt.server_args import prepare_server_args; a = prepare_server_args(sys.argv[1:]); "
            "print(a.mem_fraction_static, a.max_running_requests, a.api_key)")
    probe = subprocess.run([sys.executable, "-c", "import sglang.srt.server_args"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("SGLang's argument parser is not installed (make test installs it)")
    out = subprocess.run([sys.executable, "-c", show, *cmd[3:]], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["0.61", "7", key], out.stderr[-2000:]


def test_a_secret_key_value_word_is_masked_on_every_command_line_shown():
    """Issue 54, item 5: `--config hf_token=...` (Snakemake's KEY=VALUE words), a lock holder's command line as the
    lock message shows it, and a configuration's own `command` in the redacted config."""
    from longctx.core.secrets import HIDDEN, mask_argv, redact_config

    token = "hf_" + secrets.token_hex(12)
    words = ["snakemake", "--cores", "1", "--config", f"hf_token={token}", "lengths=[64]", f"API_KEY={token}"]
    assert mask_argv(words) == ["snakemake", "--cores", "1", "--config", f"hf_token={HIDDEN}", "lengths=[64]",
                                f"API_KEY={HIDDEN}"]
    config = {"configurations": {"v": {"engine": "vllm", "command": ["vllm", "serve", "--hf-token", token, f"--api-key={token}"]}}}
    assert token not in json.dumps(redact_config(config))
