"""A trained model on two real servers nobody here wrote: SmolLM2-135M-Instruct (tests/realmodel.py) served by
llama-cpp-python (its own GGUF, Q4_1) and by vLLM's CPU build (the same GGUF made into bf16 safetensors), each
measured by the whole workflow as `engine: external` (device cpu) with the needle probe on, and what longctx
recorded held against each server's own record: llama.cpp's per-request perf lines in its log (prompt tokens
evaluated and their time), vLLM's Prometheus counters and its tokenizer endpoint. Every prompt is cut from the
Python standard library's own text (protocol.text_source: stdlib, the default). vLLM runs twice, without and with
its n-gram speculative decoding, and the report answers whether drafting pays at each length, checked against
vLLM's own speculative counters.

The needle's question is a cloze ("The secret password is"): the model is an instruct model, and the needle
probe asks through /v1/completions, without the chat template. Measured here, the default question ("What is
the secret password? Answer with one word.") was answered with an end-of-sequence token (an empty answer) at
most lengths on both servers, and with "The secret password is The." on vLLM; the cloze was answered "Dog."
at 256 to 2,048 tokens on both.

    LONGCTX_VLLM_PYTHON=.venv-vllm/bin/python LONGCTX_LLAMACPP_PYTHON=.venv-llamacpp/bin/python \\
        .venv/bin/python -m pytest tests/test_realmodel.py -s
prints the figures side by side.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest
import yaml

from longctx import config as lcfg

from .conftest import CORES, ENV, copy_workflow, measuring, snakemake
from .realmodel import PERF, PREFIX_HIT, gguf_path, held_or_said, hf_directory, llamacpp_python, vllm_configuration
from .vllm_cpu import counter, require_vllm, serving, start_vllm, ttft_histogram

VLLM_PYTHON = require_vllm()
LLAMACPP_PYTHON = llamacpp_python()
GGUF = gguf_path()

# alone under -n (tests/conftest.py): TTFT is held against the servers' own records, and the what-if against measurement
pytestmark = [pytest.mark.alone, pytest.mark.slow, pytest.mark.thirdparty]

MODEL_NAME = "SmolLM2-135M-Instruct"
# Prefill runs at ~200 tokens/s on llama.cpp here (2 cores; 4 to 13 s at 1,024 tokens, 11 to 38 s at 2,048 on a
# busy machine), so 512 is the longest length (issue 54, the suite under 20 minutes on 2 cores: 1,024 was 21 s of the
# machine alone, its warm-up, two trials and the needle's 7 s, where 128 is 3 s; at 2,048 the suite ran 21.8 minutes)
LENGTHS = [128, 256, 512]
WARMUP, TRIALS = 1, 2
NEEDLE = {"question": "The secret password is", "answer": "Dog", "output_tokens": 6}  # needle: "The secret password is Dog."


def external_config(url: str, model: dict, lengths=LENGTHS, trials=TRIALS, output_tokens=8, more: dict | None = None,
                    load: dict | None = None, prime: bool = True, **conf) -> dict:
    """The workflow's config for one external server (`real`) at `url`, and `more` configurations beside it; `load`:
    its load workloads (closed loops only, no /metrics, no wake probe)."""
    loaded = {"load": {"output_tokens": 8, "open": {"rates": []}, "interference": {"lengths": []}, "wake": {"idle_s": []},
                       "metrics": {"enabled": False}, **load}} if load else {}
    return lcfg.validate({
        "lengths": lengths,
        **loaded,
        "protocol": {"warmup": WARMUP, "trials": trials, "output_tokens": output_tokens, "request_timeout_s": 300,
                     "needle": NEEDLE, "prime": prime},
        "calibration": {"copy_mib": 16, "matmul_size": 256, "repeats": 3},  # as tests/configs/tiny.yaml: seconds
        "analysis": {"bootstrap": 300},
        "model": {"name": MODEL_NAME, **model},
        "configurations": {"real": {"engine": "external", "url": url, "api": "openai", "device": "cpu", **conf},
                           **(more or {})},
    })


def run_workflow(work: Path, config: dict) -> Path:
    """The workflow's measurements, alone on the machine under -n (whichever test sets the fixture up: the tests that
    read it share the machine); then the rest of it (aggregation to the PDF and the twin), which reports what was
    measured, beside the other worker's tests."""
    copy_workflow(work)
    (work / "real.yaml").write_text(yaml.safe_dump(config))
    targets = ("report/longctx.pdf", "report/longctx.md", "--configfile", "real.yaml")
    with measuring():
        snakemake(work, *CORES, *targets, "--until", "bench_configuration", "calibrate_hardware")
    snakemake(work, *CORES, *targets)
    return work


def raw(work: Path, length: int, configuration: str = "real") -> dict:
    return json.loads((work / "data" / "raw" / configuration / f"{length}.json").read_text())


def metronome(work: Path, configuration: str = "real", points: tuple[str, ...] | None = None) -> list[dict]:
    """The requests the run's metronome sent (longctx.measure.metronome: the same short request at fixed points of the
    run), in order, at the points named (all where None)."""
    readings = json.loads((work / "data" / "raw" / configuration / "metronome.json").read_text())["readings"]
    return [q for r in readings if points is None or r["point"] in points for q in r["requests"]]


def pdf_text(work: Path) -> str:
    return subprocess.run(["pdftotext", "-layout", str(work / "report" / "longctx.pdf"), "-"],
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """The Hugging Face directory made from the GGUF (tokenizer and config for longctx, weights for vLLM)."""
    out = hf_directory(GGUF, VLLM_PYTHON)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
            cfg["num_hidden_layers"]) == ("llama", 9, 3, 64, 30)
    return out


def check_needles(work: Path, lengths=LENGTHS) -> dict[int, dict]:
    """Every length's needle probe answered (pass or fail, never failed: each of its requests got HTTP 200 and
    an answer), at least one pass; {length: needle record}."""
    needles = {length: raw(work, length)["needle"] for length in lengths}
    for length, n in needles.items():
        assert n["status"] in ("pass", "fail"), (length, n)
        assert n["length_matched"] and abs(n["prompt_tokens"] - length) <= max(16, 0.02 * length), (length, n)
        assert n["status"] == ("pass" if "dog" in n["answer"].lower() else "fail")
    assert any(n["status"] == "pass" for n in needles.values()), needles
    print("\n" + "\n".join(f"needle at {length}: {n['status']} ({n['prompt_tokens']} tokens): {n['answer']!r}"
                           for length, n in needles.items()))
    df = pd.read_csv(work / "data" / "results.csv")
    df = df[df["configuration"] == "real"]
    assert {(int(r.length), r.needle) for r in df.itertuples()} == {(length, n["status"]) for length, n in needles.items()}
    return needles


def check_report_verdicts(work: Path, needles: dict[int, dict]) -> None:
    """The model as the report describes it (from the converted config.json: GQA, 2 x 3 KV heads x 64 x 30 layers
    x 2 bytes = 23,040 KV bytes per token), and the needle section of the PDF: one row per length, its verdict."""
    text = pdf_text(work)
    assert re.search(rf"model\s+{MODEL_NAME}, GQA, 23,040 KV bytes per token", text), text[:800]
    section = text[text.index("Needle probe"):]
    for length, n in needles.items():
        assert re.search(rf"real\s+{length:,}\s+{n['status']}\b", section), (length, section[:1500])


# --- llama-cpp-python's server ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llamacpp_server(tmp_path_factory):
    """llama-cpp-python's OpenAI-compatible server on the GGUF, stopped by its process group. logits_all off: the
    server's default (on) keeps the logits of every prompt token, which made its prefill ~1.5 times slower here.
    interrupt_requests off: by default a request that arrives ends the one streaming (the load stage's loop of 2 had
    three of four requests stopped after their first token), where the server should take them one after another."""
    from longctx.measure.process import ManagedServer, free_port

    port = free_port()
    log = tmp_path_factory.mktemp("llamacpp") / "server.log"
    server = ManagedServer([LLAMACPP_PYTHON, "-m", "llama_cpp.server", "--model", str(GGUF), "--model_alias", MODEL_NAME,
                            "--n_ctx", "8192", "--logits_all", "False", "--interrupt_requests", "False",
                            "--host", "127.0.0.1", "--port", str(port)], log)
    server.start()
    try:
        base = f"http://127.0.0.1:{port}"
        server.wait_ready(base, ("/v1/models",), 120, port=port)
        yield {"base": base, "log": log}
    finally:
        server.stop()


@pytest.fixture(scope="module")
def llamacpp_workflow(llamacpp_server, smollm2, tmp_path_factory):
    """The workflow against llama.cpp, text prompts built with the converted tokenizer; llama.cpp's log of it."""
    log = llamacpp_server["log"]
    start = log.stat().st_size
    # its scheduler as the server was started (one completion at a time, prompts in n_batch batches of 512), a closed
    # loop of 2 (issue 45: predicted by a model that fitted nothing on load points; a loop of 1, as this had before,
    # checked nothing and took 8 s alone: the lone request beside the loop is its sweep twins). Not primed:
    # llama.cpp reserves its compute buffers for a whole batch when it loads the model (its log's "compute buffer
    # size"), so a long first prompt grows nothing, and a 512-token prompt takes 2 to 6 s here
    work = run_workflow(tmp_path_factory.mktemp("llamacpp-wf"),
                        external_config(llamacpp_server["base"], {"tokenizer": str(smollm2), "hf_config": str(smollm2)},
                                        server_log=str(log), scheduler={"engine": "llama-cpp-python",
                                                                            "args": {"n_ctx": 8192, "interrupt_requests": False}},
                                        load={"lengths": [256], "closed": {"concurrency": [2], "requests": 4}},
                                        prime=False))
    with log.open("rb") as f:
        f.seek(start)
        return {"work": work, "log": f.read().decode(errors="replace")}


# the model's conversion and the three servers' start-ups (llama.cpp, then both vLLMs: half a minute of imports each)
# time nothing: they share the machine, all at the module's start, beside test_thirdparty's own start-ups (the suite
# runs the two modules first: tests/conftest.py, FIRST), so that no start-up is left for later, when the other worker
# would stand waiting for the machine alone. The vLLMs idle while llama.cpp is measured (one, up and served once, took
# 0.22 CPU seconds in 20 s, 1.1% of a core, here on 2026-12-07).
@pytest.mark.alone(False)
def test_llamacpp_serves_the_gguf_under_the_models_name(llamacpp_server, smollm2, vllm_servers):
    assert [m["id"] for m in httpx.get(llamacpp_server["base"] + "/v1/models").json()["data"]] == [MODEL_NAME]


def completions(log_text: str) -> list[dict]:
    """llama.cpp's record of each completion in its log, in order: the prompt tokens it counted (those it
    evaluated and those it reused from the previous request's KV cache), the time it spent evaluating them, and
    the tokens it generated (one from the prompt's logits, then one per decode step: steps + 1, where the last
    token is not evaluated, as when max_tokens ends the request)."""
    out, hit = [], 0
    for m in re.finditer(f"{PREFIX_HIT.pattern}|{PERF.pattern}", log_text):
        if m[1] is not None:  # a prefix-match line: its reused tokens belong to the next completion's prompt
            hit = int(m[1])
            continue
        out.append({"prompt_tokens": hit + int(m[4]), "prompt_eval_s": float(m[3]) / 1e3, "reused": hit,
                    "generated": int(m[6]) + 1})
        hit = 0
    return out


@pytest.mark.alone(False)  # it reads what its workflow measured (alone: run_workflow)
def test_llamacpp_every_length_is_measured_with_text_prompts(llamacpp_workflow, smollm2):
    """llama-cpp-python takes text prompts only (a token-id prompt fails its request validation): the probe turns
    to text built with the converted tokenizer, and its non-streamed answer's usage (its stream has none)
    counts them as longctx does."""
    work = llamacpp_workflow["work"]
    df = pd.read_csv(work / "data" / "results.csv")
    assert len(df) == len(LENGTHS) * TRIALS and (df["status"] == "ok").all(), df[["length", "status", "reason"]]
    assert (df["prompt_tokens"] == df["length"]).all() and not df["early_stop"].any()
    probe = raw(work, LENGTHS[0])["provenance"]["prompt_probe"]
    assert (probe["prompt"], probe["tokenizer"], probe["usage"], probe["added_tokens"]) == ("text", str(smollm2), "response", 0)
    assert probe["answers"][0].startswith("token-id prompt of 32: HTTP 500"), probe["answers"]


@pytest.mark.alone(False)  # it reads what its workflow measured (alone: run_workflow)
def test_llamacpp_counted_and_timed_each_prompt_as_longctx_recorded(llamacpp_workflow):
    """Third-party truth: llama.cpp's own perf record of every completion (llama_perf_context_print, printed by
    llama-cpp-python after each one). Each length's warm-up and trials are the first run of consecutive records of
    exactly L prompt tokens after the previous length's (the needle's tries follow them): llama.cpp counted L
    tokens in each of longctx's text prompts, and longctx's TTFT (first byte sent to first token received) holds
    llama.cpp's prompt evaluation and little more. llama.cpp generated the 8 tokens longctx counted (from the
    stream's events: llama.cpp's stream carries no usage), though it ignores ignore_eos: the model did not stop
    early on these prompts."""
    records = completions(llamacpp_workflow["log"])
    # every completion llama.cpp answered 200 left one record (the probe's token-id prompt was refused: no record)
    answered = re.findall(r'"POST /v1/completions HTTP/1\.1" (\d+)', llamacpp_workflow["log"])
    assert answered.count("200") == len(records), (answered, len(records))
    # the load stage's requests come last, each whole (one completion at a time, none interrupted), with the sweep's
    # lone request sent just before and after the loop (load.sweep_twins, 2 a side): set them aside
    workloads = json.loads((llamacpp_workflow["work"] / "data" / "raw" / "real" / "load.json").read_text())["workloads"]
    twins = [r for w in workloads for r in w.get("sweep_twins") or []]
    assert [t["twin"] for t in twins] == ["before", "before", "after", "after"], twins
    loaded = [r for w in workloads for r in w["requests"]] + twins
    assert all(r["completion_tokens"] == 8 and not r["early_stop"] for r in loaded), loaded
    # ... but for the metronome's last reading, after them (its requests of its own short length)
    last = metronome(llamacpp_workflow["work"], points=("end",))
    assert last and [r["prompt_tokens"] for r in records[-len(last):]] == [q["prompt_tokens"] for q in last]
    records = records[:-len(last)]
    assert [r["prompt_tokens"] for r in records[-len(loaded):]] == [256] * len(loaded)
    records = records[:-len(loaded)]
    between = metronome(llamacpp_workflow["work"], points=("after_sweep",))  # the reading between the sweep and the load
    assert between and [r["prompt_tokens"] for r in records[-len(between):]] == [q["prompt_tokens"] for q in between]
    records = records[:-len(between)]
    # and the prompt probe's requests and the metronome's first reading before the sweep (its short length may be one
    # of the sweep's: 128)
    first = [q["prompt_tokens"] for q in metronome(llamacpp_workflow["work"], points=("start",))]
    at = next((j for j in range(len(records)) if [r["prompt_tokens"] for r in records[j:j + len(first)]] == first), None)
    assert first and at is not None and all(r["prompt_tokens"] < min(LENGTHS) for r in records[:at]), records[:at + 3]
    records = records[at + len(first):]
    n, starts, i = WARMUP + TRIALS, [], 0
    for length in LENGTHS:
        while i + n <= len(records) and any(r["prompt_tokens"] != length for r in records[i:i + n]):
            i += 1
        assert i + n <= len(records), f"no {n} consecutive records of {length} prompt tokens in llama.cpp's log"
        starts.append(i)
        i += n
    rows = []
    for k, length in enumerate(LENGTHS):
        result = raw(llamacpp_workflow["work"], length)
        for rec, req in zip(records[starts[k]:starts[k] + n], result["warmup"] + result["trials"]):
            assert req["prompt_tokens"] == rec["prompt_tokens"] == length
            assert req["completion_tokens"] == rec["generated"] == 8 and req["usage_source"] == "client"
            rows.append((length, req["ttft_s"], rec["prompt_eval_s"], rec["reused"]))
        # the needle's tries come next, up to the next length's requests: its last one is the probe's answer
        tries = records[starts[k] + n:starts[k + 1] if k + 1 < len(starts) else len(records)]
        assert 1 <= len(tries) <= 3 and tries[-1]["prompt_tokens"] == result["needle"]["prompt_tokens"], (length, tries)
    print("\nlength  longctx TTFT (ms)  llama.cpp prompt eval (ms)  difference (ms)  reused tokens")
    for length, ours, theirs, reused in rows:
        print(f"{length:6d}  {ours * 1e3:17.1f}  {theirs * 1e3:26.1f}  {(ours - theirs) * 1e3:15.1f}  {reused:13d}")
    # measured here: longctx's TTFT 9 to 22 ms over llama.cpp's prompt evaluation (1.0 to 13.2 s; the rest is
    # llama-cpp-python's tokenization and the HTTP and streaming hops): never less, more by at most 30 ms + 1 %
    for length, ours, theirs, _ in rows:
        assert 0 < theirs <= ours <= theirs * 1.01 + 0.03, (length, ours, theirs)


@pytest.mark.alone(False)  # it reads what its workflow measured (alone: run_workflow)
def test_llamacpp_what_if_predicts_two_clients_from_a_model_that_fitted_nothing_under_load(llamacpp_workflow):
    """Issue 45, items 4 and 5: llama-cpp-python's server simulated by its own rules (one completion at a time, each
    prompt in n_batch batches of 512), the configuration's scheduler key naming them; its serving model is the sweep's
    fits alone (one request at a time: r never enters). The closed loop of 2 (a higher concurrency than any the model
    saw, each request waiting for the other's completion) predicted within the report's 15%, TTFT and TPOT."""
    from longctx.report.whatif import TOLERANCE

    work = llamacpp_workflow["work"]
    doc = json.loads((work / "data" / "whatif.json").read_text())["configurations"]["real"]
    assert "reason" not in doc, doc
    assert (doc["rules"]["policy"], doc["rules"]["max_running"], doc["rules"]["chunk"]) == ("prefill_first", 1, 512)
    rows = [x for x in doc["check"] if x["kind"] == "closed" and x["which"] == "p50"]
    said = "; ".join(f"c={x['level']} {x['quantity']}: {x['predicted'] * 1e3:.0f} ms predicted, {x['measured'] * 1e3:.0f} "
                     f"measured ({x['error']:+.1%})" for x in rows)
    print(f"\n{said}")
    assert {(x["level"], x["quantity"]) for x in rows} == {(2, "ttft"), (2, "tpot")}
    assert all(x["anchor"] for x in rows), rows
    print(held_or_said(work, "real", {x["quantity"]: x["error"] for x in rows if x["level"] == 2},
                       {"ttft": TOLERANCE, "tpot": TOLERANCE}))


@pytest.mark.alone(False)  # it reads what its workflow measured (alone: run_workflow)
def test_llamacpp_needle_answers_and_report(llamacpp_workflow):
    work = llamacpp_workflow["work"]
    check_report_verdicts(work, check_needles(work))


# --- vLLM's CPU build ----------------------------------------------------------------------------------------------

# vLLM runs behind an API key (its own --api-key, given as longctx gives it: VLLM_API_KEY), which the workflow
# reads from this variable (api_key_env) and must send with every request and write nowhere
KEY_VAR = "LONGCTX_TEST_VLLM_API_KEY"
KEY = os.environ.setdefault(KEY_VAR, "lk-" + secrets.token_hex(16))  # conftest.ENV was copied before: set it there too
ENV[KEY_VAR] = KEY


# prefill on vLLM's CPU build: 0.35, 0.8 and 1.9 s at 256, 512 and 1,024 tokens here; a trial at 2,048 took 5.6 s
# (decode ~140 ms a token there), and the two configurations' sweeps to 2,048 a minute each; at 1,024, 12 s of each
# configuration's sweep (a warm-up, three trials and the needle), where 128 takes 3 s (issue 54: the suite under 20
# minutes)
VLLM_LENGTHS = [128, 256, 512]
VLLM_TRIALS = 3  # a speedup's interval needs 3 trials a side (longctx.analysis.compare.MIN_TRIALS)
VLLM_OUTPUT = 16  # decode: ~30 tokens/s without drafting here (32, as before, took 10 s more of the machine alone)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def vllm_spec(smollm2: Path, **args):
    config = lcfg.validate({
        "lengths": VLLM_LENGTHS, "model": {"name": MODEL_NAME, "path": str(smollm2)},
        # enable-prompt-tokens-details: vLLM's cached count in every usage (its prefix cache's own word)
        "configurations": {"vllm-cpu": {**vllm_configuration(VLLM_PYTHON, **{"enable-prompt-tokens-details": True, **args}),
                                        "api_key_env": KEY_VAR}}})
    return lcfg.configuration_spec(config, "vllm-cpu")


@pytest.fixture(scope="module")
def vllm_servers(smollm2, tmp_path_factory):
    """vLLM on the converted weights twice, started as longctx starts vLLM (the adapter's command line and its API
    key), stopped by their process groups: without drafting, and with its n-gram speculative decoding (prompt
    lookup, 4 draft tokens a step). Both start at once (half a minute each, mostly imports)."""
    plain = start_vllm(vllm_spec(smollm2), tmp_path_factory.mktemp("vllm-real"))
    ngram = start_vllm(vllm_spec(smollm2, **{"speculative-config": NGRAM}), tmp_path_factory.mktemp("vllm-ngram"))
    with serving(plain) as a, serving(ngram) as b:
        yield {"plain": a, "ngram": b}


@pytest.fixture(scope="module")
def vllm_server(vllm_servers):
    return vllm_servers["plain"]


@pytest.fixture(scope="module")
def vllm_workflow(vllm_servers, smollm2, tmp_path_factory):
    """The workflow against both vLLMs as external servers (`real` without drafting, `real-ngram` with), its prompts
    the token ids of the standard library's text (protocol.text_source: stdlib, the default), as the probe finds vLLM
    takes ids and the model's tokenizer is in model.path; each vLLM's /metrics before and after."""
    bases = {k: v["base"] for k, v in vllm_servers.items()}
    before = {k: httpx.get(b + "/metrics").text for k, b in bases.items()}
    ngram = {"real-ngram": {"engine": "external", "url": bases["ngram"], "api": "openai", "device": "cpu",
                            "api_key_env": KEY_VAR, "load": False}}
    # `real` under load (issue 45): closed loops of 2 and 4, simulated by vLLM's V1 rules at the flags it was started
    # with (its CPU defaults: a budget of 2,048 tokens, 128 sequences), as its configuration's scheduler key says
    config = external_config(bases["plain"], {"path": str(smollm2), "hf_config": str(smollm2)}, lengths=VLLM_LENGTHS,
                             trials=VLLM_TRIALS, output_tokens=VLLM_OUTPUT, more=ngram, api_key_env=KEY_VAR,
                             scheduler={"engine": "vllm", "args": vllm_spec(smollm2).args},
                             load={"lengths": [256], "output_tokens": 16, "closed": {"concurrency": [2, 4], "requests": 8}})
    work = run_workflow(tmp_path_factory.mktemp("vllm-real-wf"), config)
    return {"work": work, "before": before["plain"], "after": httpx.get(bases["plain"] + "/metrics").text,
            "ngram_before": before["ngram"], "ngram_after": httpx.get(bases["ngram"] + "/metrics").text}


@pytest.mark.alone(False)  # it times nothing: it shares the machine
def test_vllm_refuses_a_request_without_its_key(vllm_servers):
    """vLLM's own --api-key, as the adapter passed it: a completion without the key is refused (401), with it answered."""
    for up in vllm_servers.values():
        body = {"model": up["model"], "prompt": "hi", "max_tokens": 1}
        assert httpx.post(up["base"] + "/v1/completions", json=body).status_code == 401
        assert httpx.post(up["base"] + "/v1/completions", json=body,
                          headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


@pytest.mark.alone(False)  # it reads what its workflow measured (alone: run_workflow)
def test_vllm_every_length_is_measured_and_counted_as_vllm_counted(vllm_workflow):
    """Third-party truth: vLLM's usage (the counts longctx recorded are vLLM's, not its own) and its counters over
    the whole run: its prompt-token counter moved by at least what longctx recorded (the rest: the prompt probe and
    the needle's earlier tries, which longctx does not keep), for as many requests as it says it answered."""
    work = vllm_workflow["work"]
    df = pd.read_csv(work / "data" / "results.csv")
    assert len(df) == 2 * len(VLLM_LENGTHS) * VLLM_TRIALS and (df["status"] == "ok").all(), df[["length", "status", "reason"]]
    assert (df["prompt_tokens"] == df["length"]).all()
    recorded = [r for length in VLLM_LENGTHS for r in raw(work, length)["warmup"] + raw(work, length)["trials"]]
    assert all(r["usage_source"] == "server" for r in recorded)
    probe = raw(work, VLLM_LENGTHS[0])["provenance"]["prompt_probe"]
    assert probe["prompt"] == "token_ids" and probe["text_source"]["kind"] == "text", probe
    needles = [raw(work, length)["needle"] for length in VLLM_LENGTHS]
    # beside the lengths: the load stage's requests (with the sweep's lone request sent before and after each point:
    # load.sweep_twins), the metronome's, and the request that primed the server (the run's longest prompt)
    loaded = [r for w in json.loads((work / "data" / "raw" / "real" / "load.json").read_text())["workloads"]
              for r in w["requests"] + (w.get("sweep_twins") or [])]
    (primed,) = raw(work, VLLM_LENGTHS[0])["provenance"]["primed"]
    assert primed["status"] == "ok" and primed["length"] == max(VLLM_LENGTHS), primed
    before, after = vllm_workflow["before"], vllm_workflow["after"]
    tokens = counter(after, "vllm:prompt_tokens") - counter(before, "vllm:prompt_tokens")
    requests = counter(after, "vllm:request_success") - counter(before, "vllm:request_success")
    kept = recorded + needles + loaded + metronome(work)
    ours = sum(r["prompt_tokens"] for r in kept) + primed["length"]
    print(f"\nvLLM counted {tokens:.0f} prompt tokens in {requests:.0f} requests; longctx kept {ours} in {len(kept) + 1}")
    # at most 3 probe requests and 2 earlier needle tries per length beside what longctx kept
    assert len(kept) + 1 < requests <= len(kept) + 1 + 3 + 2 * len(VLLM_LENGTHS)
    assert ours < tokens


@pytest.mark.alone(False)  # it reads what its workflow measured (alone: run_workflow)
def test_vllms_what_if_answer_at_a_concurrency_its_model_never_saw_holds(vllm_workflow):
    """Issue 45, item 4 on vLLM with a real model: the what-if grid asked for a closed loop of 4 (8 requests of 256
    prompt and 16 output tokens) by a serving model that never saw one (the fits of the sweep, r fitted to the loop of
    2 alone, vLLM's V1 rules as the configuration's scheduler key names them), against the loop of 4 the load stage
    measured: median TPOT within the report's 15% (longctx.report.whatif.TOLERANCE; 0% and -2% in two runs), TTFT
    within 25% (-4% and -16%), of the range the prediction spans as r spans what one loop of 8 requests tells of it, where the fits pass their quality gate (realmodel.held_or_said: on a busy machine
    the decode fit failed it once, r = 9 ms from the loop of 2 took the loop of 4's TPOT 29% high, and the report
    said the model stood on a failed fit). The TTFT's miss is the model's, and said: vLLM took the first of the four prompts
    alone, then the three others in one step, which cost 408 ms where one took 141 (each further 256-token prompt
    ~134 ms, not the 78 ms of its own b L + c L^2: the CPU backend's batched prefill grows faster than the sum of its
    prompts), and the serving model prices a step's prompts separately. The check table's row for that loop is the
    same answer within 5% (r left out of the point it is checked on; the loop's clients started when they were, not
    the median gap apart). Both loops were bracketed by the sweep's lone request (load.sweep_twins): r is fitted, and
    the loop of 4 predicted, on the model set to the lone request measured beside each loop (issue 53, item 7), so
    that a machine that moved between the sweep and the load stage moves the model with it."""
    from dataclasses import replace as with_

    from longctx.analysis.simulate import Costs, Rules
    from longctx.analysis.whatif import anchor, calibrate_r, closed_starts, grid, scaled
    from longctx.report.whatif import TOLERANCE

    work = vllm_workflow["work"]
    doc = json.loads((work / "data" / "whatif.json").read_text())["configurations"]["real"]
    assert "reason" not in doc, doc
    assert doc["rules"]["policy"] == "token_budget" and doc["rules"]["chunk"] == 2048, doc["rules"]
    load = json.loads((work / "data" / "load.json").read_text())["configurations"]["real"]
    two, four = ([p for p in load["closed"] if p["level"] == c][0] for c in (2, 4))
    requests = pd.read_csv(work / "data" / "load_requests.csv")
    two = {**two, "starts": closed_starts(requests[requests["configuration"] == "real"], two)}
    costs = Costs(**{**doc["costs"], "wake": tuple(map(tuple, doc["costs"]["wake"]))})
    rules = Rules(**doc["rules"])
    g = {"max_running_requests": [], "chunked_prefill_size": [], "mem_fraction_static": [], "concurrency": [4],
         "rates": [], "arrival": "poisson", "burstiness": 1.0, "seed": 0, "lengths": [256], "output_tokens": 16,
         "requests": 8}

    def predicted(at: str = "value") -> tuple[float, dict]:
        """r fitted to the loop of 2 (at its median TPOT, or at an end of the median's interval: `at`, whatif.R_ENDS),
        and the grid's loop of 4 with it; the grid starts its clients the median first-send gap apart, as the measured
        loops' client did."""
        r, _ = calibrate_r(costs, rules, [two], at=at)
        model = scaled(with_(costs, r=r), **anchor(costs, rules, four))  # set to the lone request beside the loop of 4
        (setting,), _ = grid(model, rules, None, g, {"ttft_s": 10.0}, 0.95, doc["client_stagger_s"])
        return r, setting["points"][0]

    assert two.get("sweep_twins", {}).get("n") and four.get("sweep_twins", {}).get("n"), (two, four)
    r, point = predicted()
    rows = {x["quantity"]: x for x in doc["check"] if x["kind"] == "closed" and x["level"] == 4 and x["which"] == "p50"}
    for q in ("ttft", "tpot"):  # the check's row: the same model, the loop's clients started as they were
        assert rows[q]["r_left_out"] and rows[q]["predicted"] == pytest.approx(point[f"{q}_p50"], rel=0.05)
    # r stands on one loop's median TPOT, 8 requests: its spread is carried into the bound. r fitted at the two ends of
    # that median's interval (load_summary's order statistics), as the model's draws fit it (whatif.r_end), gives the
    # prediction's range (one loop of 2 gave r from 0 to 5.6 ms in
    # different runs, the loop of 4's TPOT 30% apart, and this check failed about one run in three before); the error
    # is the measured median's distance from that range
    spread = two["tpot"]["p50"]
    assert spread["low"] is not None and spread["low"] <= spread["value"] <= spread["high"], spread
    ends = [predicted(k) for k in ("low", "high")]
    span = {q: (min(p[f"{q}_p50"] for _, p in [(r, point), *ends]), max(p[f"{q}_p50"] for _, p in [(r, point), *ends]))
            for q in ("ttft", "tpot")}
    measured = {q: four[q]["p50"]["value"] for q in span}
    errors = {q: min(0.0, span[q][1] / measured[q] - 1) + max(0.0, span[q][0] / measured[q] - 1) for q in span}
    said = "; ".join(f"{q}: {point[f'{q}_p50'] * 1e3:.1f} ms predicted ({span[q][0] * 1e3:.1f} to {span[q][1] * 1e3:.1f} "
                     f"over r's spread), {measured[q] * 1e3:.1f} ms measured ({errors[q]:+.1%} from the range)" for q in span)
    print(f"\n{said} (r = {r * 1e3:.2f} ms, {ends[0][0] * 1e3:.2f} to {ends[1][0] * 1e3:.2f} over the loop of 2's interval); "
          f"the run's error: {doc['errors']['p50']}")
    print(held_or_said(work, "real", errors, {"tpot": TOLERANCE, "ttft": 25 / 15 * TOLERANCE}))


@pytest.mark.alone(False)  # it reads what its workflow measured (alone: run_workflow)
def test_vllms_key_is_written_nowhere(vllm_servers, vllm_workflow):
    """vLLM refuses a request without its key (test_vllm_refuses_a_request_without_its_key) and the workflow measured
    every length (above), so it sent the key; no file the workflow wrote (raw files, provenance, the PDF's text, the
    twin, Snakemake's records and logs) nor vLLM's own log holds it."""
    from .test_report import pdftotext

    work = vllm_workflow["work"]
    found = [str(p.relative_to(work)) for p in work.rglob("*") if p.is_file()
             and KEY.encode() in (pdftotext(p).encode() if p.suffix == ".pdf" else p.read_bytes())]
    assert not found and not any(KEY in v["log"].read_text() for v in vllm_servers.values()), found
    assert KEY_VAR in (work / "report" / "longctx.md").read_text() or KEY_VAR in pdftotext(work / "report" / "longctx.pdf")


@pytest.mark.alone(False)  # it reads what its workflow measured (alone: run_workflow)
def test_vllm_needle_answers_and_report(vllm_workflow):
    work = vllm_workflow["work"]
    check_report_verdicts(work, check_needles(work, VLLM_LENGTHS))


@pytest.mark.alone(False)  # it reads what its workflow measured (alone: run_workflow)
def test_vllm_drafting_acceptance_is_what_vllms_counters_moved_by(vllm_workflow):
    """Third-party truth: vLLM's own speculative counters (vllm:spec_decode_num_drafts, _num_draft_tokens,
    _num_accepted_tokens). Per trial of real-ngram, longctx's acceptance is what they moved by over that trial: each
    draft proposes 1 to the 4 tokens asked; no step accepts more than it proposed, nor a request more tokens than it
    generated after its first. Over the run, the counters moved by what longctx recorded plus what the requests it
    does not keep (the prompt probe's, the needle's) could accept: at most their output tokens less one each. The
    server without drafting reports no acceptance anywhere."""
    work = vllm_workflow["work"]
    recorded = [r for length in VLLM_LENGTHS for r in raw(work, length, "real-ngram")["warmup"] + raw(work, length, "real-ngram")["trials"]]
    for r in recorded:
        assert r["spec_source"] == "metrics" and r["spec_verify_ct"] > 0, r
        # each draft proposes 1 to the 4 tokens asked: vLLM's n-gram proposer cuts one where the text after the matched
        # n-gram runs out before 4 (vllm/v1/spec_decode/ngram_proposer.py: k = min(k, total_token - start_position));
        # 43 of 44 at 512 tokens once
        assert r["spec_verify_ct"] <= r["spec_num_proposed_drafts"] <= NGRAM["num_speculative_tokens"] * r["spec_verify_ct"], r
        assert 0 <= r["spec_num_correct_drafts"] <= min(r["spec_num_proposed_drafts"], r["completion_tokens"] - 1), r
        assert r["spec_accept_length"] == pytest.approx(1 + r["spec_num_correct_drafts"] / r["spec_verify_ct"])
    before, after = vllm_workflow["ngram_before"], vllm_workflow["ngram_after"]
    moved = {k: counter(after, f"vllm:spec_decode_num_{k}") - counter(before, f"vllm:spec_decode_num_{k}")
             for k in ("drafts", "draft_tokens", "accepted_tokens")}
    requests = counter(after, "vllm:request_success") - counter(before, "vllm:request_success")
    ours = {"drafts": sum(r["spec_verify_ct"] for r in recorded), "accepted_tokens": sum(r["spec_num_correct_drafts"] for r in recorded)}
    needles = [raw(work, length, "real-ngram")["needle"] for length in VLLM_LENGTHS]
    unkept = int(requests) - len(recorded) - len(needles)  # the probe's requests and the needle's earlier tries
    most = max(NEEDLE["output_tokens"], 6) - 1  # 6: the prompt probe's output tokens (measure.probe.PROBE_OUTPUT)
    print(f"\nvLLM's counters moved by {moved} over {requests:.0f} requests; longctx recorded {ours} in {len(recorded)}")
    assert 0 <= moved["accepted_tokens"] - ours["accepted_tokens"] <= most * (unkept + len(needles))
    assert 0 <= moved["drafts"] - ours["drafts"] <= most * (unkept + len(needles))
    plain = pd.read_csv(work / "data" / "results.csv")
    assert plain[plain["configuration"] == "real"]["spec_accept_length"].isna().all()


@pytest.mark.alone(False)  # it reads what its workflow measured (alone: run_workflow)
def test_the_report_answers_the_drafter_question_per_length(vllm_workflow):
    """The same server with and without n-gram drafting, per length: the speedup of decode with its interval (Welch's
    on the logs, recomputed here with scipy from results.csv's trials at the family's Bonferroni level), n, and a
    verdict that follows the interval; page one's sentence in the PDF and its twin; the text and the model named."""
    from scipy import stats

    work = vllm_workflow["work"]
    fits = json.loads((work / "data" / "fits.json").read_text())["drafting"]
    c = fits["configurations"]["real-ngram"]
    assert c["baseline"] == "real" and list(fits["configurations"]) == ["real-ngram"], c
    assert fits["family"]["tests"] == len(VLLM_LENGTHS) and fits["family"]["level"] == pytest.approx(1 - 0.05 / len(VLLM_LENGTHS))
    # the trials the comparison takes: a trial flagged contended (the server got markedly less of its CPU) is left out
    # where its length has others (tables.ok_rows); a side left with fewer than MIN_TRIALS has no interval. A flake hunt
    # round had real's first 256-token trial contended (another test's vLLM still starting beside it) and this test,
    # which took every trial, failed on that length's missing interval
    from longctx.analysis.compare import MIN_TRIALS
    from longctx.analysis.tables import ok_rows

    df = ok_rows(pd.read_csv(work / "data" / "results.csv"))
    print("\nlength  acceptance  decode tok/s with / without  speedup [interval]  n  verdict")
    compared = 0
    for r in c["rows"]:
        on = np.log(df[(df["configuration"] == "real-ngram") & (df["length"] == r["length"])]["decode_tok_s"].to_numpy())
        off = np.log(df[(df["configuration"] == "real") & (df["length"] == r["length"])]["decode_tok_s"].to_numpy())
        if min(len(on), len(off)) < MIN_TRIALS:
            assert r["ci"] is None and r["verdict"] == "no interval" and (r["n"], r["n_baseline"]) == (len(on), len(off)), r
            print(f"{r['length']:6d}  no interval: {len(on)} and {len(off)} trials after the contended ones")
            continue
        compared += 1
        va, vb = on.var(ddof=1) / len(on), off.var(ddof=1) / len(off)
        dof = (va + vb) ** 2 / (va**2 / (len(on) - 1) + vb**2 / (len(off) - 1))
        half = stats.t.ppf(0.5 + fits["family"]["level"] / 2, dof) * np.sqrt(va + vb)
        d = on.mean() - off.mean()
        assert r["ci"] == pytest.approx([np.exp(d - half), np.exp(d + half)], rel=1e-9) and r["speedup"] == pytest.approx(np.exp(d))
        assert (r["n"], r["n_baseline"]) == (len(on), len(off))
        assert r["verdict"] == ("faster" if r["ci"][0] > 1 else "slower" if r["ci"][1] < 1 else "no measurable difference")
        print(f"{r['length']:6d}  {r['acceptance']:10.2f}  {r['decode_tok_s']:12.1f} / {r['baseline_decode_tok_s']:6.1f}  "
              f"{r['speedup']:.2f}x [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]  {r['n']}/{r['n_baseline']}  {r['verdict']}")
    assert compared >= len(VLLM_LENGTHS) - 1, c["rows"]  # one length may lose a trial to contention, not more
    print(f"stops paying: {c['stops_paying']}")
    md = " ".join((work / "report" / "longctx.md").read_text().split())
    flat = " ".join(pdf_text(work).split())
    sentence = md[md.index("With drafting in real-ngram (against real)"):]
    sentence = sentence[:sentence.index(")." ) + 2]
    print(sentence)
    page_one = flat[:flat.index("Every length against the baseline")]
    assert "With drafting in real-ngram (against real)" in page_one and "tokens per step" in page_one
    assert f"that of {MODEL_NAME} on real text: the Python standard library's documentation and source" in md


@pytest.mark.alone(False)  # counts only, nothing timed: it shares the machine
def test_vllms_prefix_cache_finds_nothing_shared_between_two_trials_real_text_prompts(vllm_server, smollm2):
    """Third-party truth: vLLM's prefix cache (whole 128-token blocks, hashed from the start; its cached count in
    usage.prompt_tokens_details) serves none of a trial's prompt from another trial's, though both read the same
    document after their 16-token heads; the same prompt sent again is served from the cache (the check can fail).
    And vLLM's own detokenizer reads the prompt after its head as the source's text, verbatim."""
    from longctx.measure.prompts import load_tokenizer
    from longctx.measure.text import DocumentText

    doc = DocumentText(load_tokenizer({"tokenizer": str(smollm2)}), "stdlib")
    headers = {"Authorization": f"Bearer {KEY}"}
    cached = []
    for key in ("run/real/1024/0", "run/real/1024/1", "run/real/1024/0"):
        body = {"model": vllm_server["model"], "prompt": doc.ids(1024, 0, key), "max_tokens": 1}
        usage = httpx.post(vllm_server["base"] + "/v1/completions", json=body, headers=headers, timeout=120).json()["usage"]
        assert usage["prompt_tokens"] == 1024
        cached.append((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    assert cached[:2] == [0, 0] and cached[2] >= 1024 - 128, cached
    # readable: vLLM's own detokenizer reads the prompt after its head as the standard library's words, verbatim
    ids = doc.ids(1024, 0, "run/real/1024/0")
    text = httpx.post(vllm_server["base"] + "/detokenize", json={"model": vllm_server["model"], "tokens": ids[16:]},
                      headers=headers, timeout=60).json()["prompt"]
    from pydoc_data.topics import topics

    assert len(text) > 3000 and text in "".join(topics[k] + "\n\n" for k in sorted(topics)), text[:300]


def test_vllm_counts_and_times_longctxs_text_prompts_as_longctx_does(vllm_server, smollm2):
    """longctx's text prompts (built with the converted tokenizer) against vLLM, each request alone. Third-party
    truth: vLLM's tokenizer endpoint counts each prompt as L tokens, its prompt-token counter moves by L, and its
    TTFT histogram by the TTFT it recorded, which longctx's holds with the HTTP hops: never less, and more by at
    most 15 ms + 2 % (tests/test_thirdparty.py measured 2 to 6 ms more on the tiny model)."""
    from longctx.measure.bodies import openai_body
    from longctx.measure.prompts import TextPrompts, load_tokenizer
    from longctx.measure.stream import stream_generate
    from longctx.measure.transport import timed_client

    base, model = vllm_server["base"], vllm_server["model"]
    texts = TextPrompts(load_tokenizer({"tokenizer": str(smollm2)}))
    rows = []
    with timed_client(headers={"Authorization": f"Bearer {KEY}"}) as client:
        for i, length in enumerate([256] + LENGTHS[1:] * 2):
            prompt = texts.text(length, 0, f"direct/{i}")
            counted = client.post(base + "/tokenize", json={"model": model, "prompt": prompt}).json()["count"]
            before = client.get(base + "/metrics").text
            rec = stream_generate(client, base + "/v1/completions", openai_body(prompt, 8, model), 120, api="openai")
            s = rec.summary()
            after = client.get(base + "/metrics").text
            assert s["status"] == "ok" and counted == s["prompt_tokens"] == length, (length, counted, s)
            assert counter(after, "vllm:prompt_tokens") - counter(before, "vllm:prompt_tokens") == length
            total, count = (a - b for a, b in zip(ttft_histogram(after), ttft_histogram(before)))
            assert count == 1
            if i:  # the first is a warm-up
                rows.append((length, s["ttft_s"], total))
    print("\nlength  longctx TTFT (ms)  vLLM's TTFT (ms)  difference (ms)")
    for length, ours, theirs in rows:
        print(f"{length:6d}  {ours * 1e3:17.2f}  {theirs * 1e3:16.2f}  {(ours - theirs) * 1e3:15.2f}")
    for length, ours, theirs in rows:
        assert 0 < theirs <= ours <= theirs * 1.02 + 0.015, (length, ours, theirs)


@pytest.mark.alone(False)  # it reads what its workflow measured (alone: run_workflow)
def test_llamacpp_is_described_as_its_log_says(llamacpp_workflow):
    """What llama.cpp logged of itself (configurations.real.server_log): its pool of n_ctx = 8,192 cells (180 MiB),
    its f16 K and V (not the bf16 of the converted config), its Q4_1 weights; so no FLOP roof (PyTorch's matmul)
    is compared with its prefill or decode, and no FP8 KV figure is priced (llama.cpp has no FP8 cache)."""
    work = llamacpp_workflow["work"]
    prov = raw(work, LENGTHS[0])["provenance"]
    assert prov["kv_pool"]["log"]["tokens"] == 8192
    spec = prov["model_spec"]
    assert (spec["kv_cache_dtype"], spec["weight_format"], spec["kv_bytes_per_token"]) == ("float16", "Q4_1", 23_040)
    fits = json.loads((work / "data" / "fits.json").read_text())["configurations"]["real"]
    assert "Q4_1" in fits["ceilings"]["flops_withheld"] and not (fits["ceilings"].get("measured") or {}).get("flops")
    assert all(b is None or b["class"] not in ("latency", "compute") for b in fits["bounds"].values())
    flat = " ".join(pdf_text(work).split())
    assert "K (f16), V (f16)" in flat and "Q4_1" in flat and "8,192" in flat, flat[:3000]
    assert "matmul PyTorch ran" not in flat and "FP8" not in flat
    assert not re.search(r"(prefill|decode) is (latency|compute)-bound", flat)
    assert "not compared: the weights are Q4_1" in flat  # the hardware section, beside the matmul it timed
    # a fit that failed its gate is marked in its table, in the twin as in the PDF (llama.cpp's decode step hardly
    # grows over 256 to 1,024 tokens: its fit's R² was near 0 in every run here)
    md = (work / "report" / "longctx.md").read_text()
    # (a phase with no fit at all, quality None, has no row to mark: on a loaded machine its trials may all be
    # flagged as contended and left out)
    gated = [kind for kind in ("prefill", "decode") if fits["quality"][kind] and not fits["quality"][kind]["usable"]]
    assert md.count("| real‡ |") == len(gated), gated


# --- the needle's answers in the report and its twin ---------------------------------------------------------------

@pytest.mark.alone(False)  # it reads what its workflow measured (alone: run_workflow)
def test_the_pdf_shows_each_needle_answer(llamacpp_workflow):
    work = llamacpp_workflow["work"]
    flat = " ".join(pdf_text(work).split())
    for length in LENGTHS:
        assert " ".join(raw(work, length)["needle"]["answer"].split()) in flat


@pytest.mark.alone(False)  # it reads what its workflow measured (alone: run_workflow)
def test_the_markdown_twin_shows_each_needle_verdict_and_answer(llamacpp_workflow):
    work = llamacpp_workflow["work"]
    md = (work / "report" / "longctx.md").read_text()
    assert re.search(r"needle", md, re.I)
    flat = " ".join(md.split())
    for length in LENGTHS:
        needle = raw(work, length)["needle"]
        assert " ".join(needle["answer"].split()) in flat and needle["status"] in flat
