"""Servers as they are (issue 15, item 2): text prompts of exact lengths built with the model's own
tokenizer, and the probe that decides token ids or text, the tokens a server adds, where the counts
come from and which stream events are tokens. Checked against the `tokenizers` library's own counts
and the test servers' own accounting (tests/openai_servers.py), over real HTTP on loopback."""

import json

import httpx
import pytest

from longctx import config as lcfg
from longctx.measure.transport import timed_client
from longctx.measure.probe import probe
from longctx.measure.prompts import PromptError, TextPrompts, Tokenizer
from longctx.measure.sweep import run_configuration

from .openai_servers import BEHAVIOURS, DECODE_S, make_tokenizer, openai_server

PROTO = {"seed": 0, "token_id_range": [3, 300], "prompt": "auto"}


@pytest.fixture(scope="module")
def tokdir(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizers")


def test_text_prompts_have_exactly_the_tokens_asked_by_the_tokenizers_own_count(tokdir):
    from tokenizers import Tokenizer as HF

    path = make_tokenizer(tokdir / "plain")
    hf = HF.from_file(str(path / "tokenizer.json"))  # the library's count, not ours
    text = TextPrompts(Tokenizer(path))
    for n in (1, 16, 17, 100, 1000, 5000):
        a, b = text.text(n, 0, f"a/{n}"), text.text(n, 0, f"b/{n}")
        assert len(hf.encode(a, add_special_tokens=False).ids) == n
        assert len(hf.encode(b, add_special_tokens=False).ids) == n
        if n > 16:  # a unique prefix, the same body
            ids_a, ids_b = hf.encode(a).ids, hf.encode(b).ids
            assert ids_a[:16] != ids_b[:16] and ids_a[16:] == ids_b[16:]


# (prompt, tokens added, usage, event rule, rule checked against the server's count): derived from each
# server's behaviour by hand, not from the probe
EXPECTED = {
    "no-health": ("token_ids", 0, "stream", "every", True),
    "text-only": ("text", 0, "stream", "every", True),
    "bos": ("text", 1, "stream", "every", True),
    "no-usage": ("token_ids", 0, "none", "every", False),
    "response-usage": ("text", 0, "response", "every", True),
    "empty-text": ("token_ids", 0, "stream", "every", True),
    "final-event": ("token_ids", 1, "stream", "every-but-final", True),
}


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
def test_the_probe_decides_as_each_server_behaves(tmp_path, behaviour):
    with openai_server(behaviour, tmp_path) as (base, seen), timed_client() as client:
        plan, _ = probe(client, base + "/v1/completions", "openai", "m", PROTO, {"tokenizer": str(tmp_path / behaviour)}, 30)
    got = (plan.prompt, plan.added_tokens, plan.usage, plan.events, plan.events_exact)
    assert got == EXPECTED[behaviour], plan.answers
    assert len(seen) <= 3 and all(a for a in plan.answers)


@pytest.mark.parametrize("code", [422, 500], ids=["refused", "refused-with-500"])
def test_a_text_only_server_without_a_tokenizer_says_what_to_set(tmp_path, code):
    """A server that refuses token ids says what to set, whether it refuses them as FastAPI does (422) or with a
    server error (500, as llama-cpp-python's does): a short text prompt that goes through tells the second from a
    server that fails every request (tests/test_terminal.py), which is a server error."""
    from longctx.measure.health import ServerError

    with openai_server("text-only", tmp_path, refuse_ids_with=code) as (base, seen), timed_client() as client:
        with pytest.raises(PromptError, match=rf"HTTP {code}.*valid string.*set model.tokenizer") as err:
            probe(client, base + "/v1/completions", "openai", "m", PROTO, {}, 30)
    assert not isinstance(err.value, ServerError)
    assert ("a short text prompt: HTTP 200" in str(err.value)) == (code == 500) and len(seen) == 1 + (code == 500)


def external(url: str, tokenizer: str, lengths=(64, 300), **protocol) -> dict:
    return lcfg.validate({
        "lengths": list(lengths),
        "protocol": {"warmup": 1, "trials": 2, "output_tokens": 9, "token_id_range": [3, 300], **protocol},
        "model": {"name": "bpe", "tokenizer": tokenizer}, "telemetry": {"enabled": False},
        "server": {"startup_timeout_s": 30},
        "configurations": {"ext": {"engine": "external", "url": url, "api": "openai"}},
    })


@pytest.mark.alone  # under -n (tests/conftest.py): decode rates are held to the server's decode time
@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
def test_every_length_is_measured_exactly_against_each_server(tmp_path, behaviour):
    from tokenizers import Tokenizer as HF

    with openai_server(behaviour, tmp_path) as (base, seen):
        config = external(base, str(tmp_path / behaviour))
        assert run_configuration(lcfg.configuration_spec(config, "ext"), tmp_path / "raw", tmp_path / "x.log") == 0
    hf = HF.from_file(str(tmp_path / behaviour / "tokenizer.json"))
    prompt, added, usage, rule, exact = EXPECTED[behaviour]
    sent = [r for r in seen if r["max_tokens"] == 9]  # the sweep's requests, not the probe's
    # what the server itself received: its tokenizer's count (BOS included) or the ids, plus BOS
    counted = [len(hf.encode(r["prompt"]).ids) if isinstance(r["prompt"], str) else len(r["prompt"]) + added for r in sent]
    assert sorted(set(counted)) == [64, 300] and len(counted) == 2 * 3
    assert all(isinstance(r["prompt"], str) == (prompt == "text") for r in sent)
    for length in (64, 300):
        raw = json.loads((tmp_path / "raw" / f"{length}.json").read_text())
        assert raw["status"] == "ok", raw["reason"]
        assert raw["provenance"]["prompt_probe"]["added_tokens"] == added
        for t in raw["trials"]:
            assert t["prompt_tokens"] == length and t["completion_tokens"] == 9 and not t["early_stop"]
            assert t["usage_source"] == ("server" if usage == "stream" else "client")
            assert t["tokens_estimated"] is (not exact)
            assert len(t["itl_s"]) == 8 and t["decode_tok_s"] < 1.1 / DECODE_S  # never faster than the server's pace
        # at its pace: the median trial, as the report takes it (one trial on a busy machine can lose 20 ms to a stall)
        rates = sorted(t["decode_tok_s"] for t in raw["trials"])
        assert rates[len(rates) // 2] > 0.5 / DECODE_S, rates


def test_a_server_that_stops_early_is_flagged(tmp_path):
    """A server that ignores ignore_eos and stops after 4 tokens: the trials say so."""
    with openai_server("no-health", tmp_path) as (base, seen):
        config = external(base, str(tmp_path / "no-health"), lengths=(64,), output_tokens=9)
        real = httpx.Client.stream

        def short(self, method, url, content=None, **kw):
            body = json.loads(content)
            if body.get("stream") and body["max_tokens"] == 9:
                content = json.dumps({**body, "max_tokens": 4}).encode()
            return real(self, method, url, content=content, **kw)

        pytest.MonkeyPatch.setattr(mp := pytest.MonkeyPatch(), httpx.Client, "stream", short)
        try:
            run_configuration(lcfg.configuration_spec(config, "ext"), tmp_path / "raw", tmp_path / "x.log")
        finally:
            mp.undo()
    raw = json.loads((tmp_path / "raw" / "64.json").read_text())
    for t in raw["trials"]:
        assert t["early_stop"] and t["completion_tokens"] == 4 and t["reason"] == "stopped after 4 of 9 output tokens"


@pytest.mark.alone  # under -n (tests/conftest.py): decode rates are held to the server's decode time
@pytest.mark.slow
def test_the_whole_workflow_reports_every_kind_of_server(tmp_path):
    """One configuration per behaviour, through every stage (real Snakemake, real TeX) to the PDF."""
    import contextlib

    import pandas as pd
    import yaml

    from .conftest import CORES, copy_workflow, share_the_machine, snakemake
    from .test_report import pdftotext

    import subprocess
    import sys

    import psutil

    from .conftest import ROOT

    (tmp_path / "wf").mkdir()
    work = copy_workflow(tmp_path / "wf")
    # and one in a process of its own on this machine's CPU (device: cpu): its telemetry is that process's
    own = subprocess.Popen([sys.executable, "-m", "tests.openai_servers", "text-only", str(tmp_path / "own")], cwd=ROOT,
                           stdout=subprocess.PIPE, text=True)
    with contextlib.ExitStack() as stack:
        stack.callback(own.wait)
        stack.callback(own.kill)
        urls = {b: stack.enter_context(openai_server(b, tmp_path / "tok"))[0] for b in sorted(BEHAVIOURS)}
        own_url = next(line.strip() for line in own.stdout if line.startswith("http"))  # after the trainer's blank lines
        config = {
            "lengths": [64, 256], "protocol": {"warmup": 0, "trials": 2, "output_tokens": 8, "token_id_range": [3, 300]},
            "model": {"name": "bpe-gqa", "random_weights": True,
                      "architecture": {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 128,
                                       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                                       "torch_dtype": "bfloat16"}},
            "configurations": {**{b: {"engine": "external", "url": url, "api": "openai"} for b, url in urls.items()},
                               "own-cpu": {"engine": "external", "url": own_url, "api": "openai", "device": "cpu"}},
            "calibration": {"copy_mib": 16, "matmul_size": 256, "repeats": 3},
        }
        # the servers' tokenizers share one vocabulary (the same training); a BOS server's adds <s>, which the
        # probe measures: model.tokenizer names the plain one, as a user's names the model's
        config["model"]["tokenizer"] = str(make_tokenizer(tmp_path / "tok" / "plain"))
        (work / "servers.yaml").write_text(yaml.safe_dump(config))
        # the measuring alone on the machine under -n; the report of it beside the other worker's tests
        snakemake(work, *CORES, "report/longctx.pdf", "--configfile", "servers.yaml", "--until", "bench_configuration",
                  "calibrate_hardware")
        share_the_machine()
        snakemake(work, *CORES, "report/longctx.pdf", "--configfile", "servers.yaml")
        own_rss = psutil.Process(own.pid).memory_info().rss / 1e9  # the kernel's count for that process, read here
    df = pd.read_csv(work / "data" / "results.csv")
    assert set(df["configuration"]) == {*BEHAVIOURS, "own-cpu"} and (df["status"] == "ok").all(), df[["configuration", "reason"]]
    assert (df["prompt_tokens"] == df["length"]).all() and (df["completion_tokens"] == 8).all()
    rates = df.groupby("configuration")["decode_tok_s"].median()  # counted tokens at the servers' own pace
    assert ((rates > 0.5 / DECODE_S) & (rates < 1.1 / DECODE_S)).all(), rates
    raw = json.loads((work / "data" / "raw" / "own-cpu" / "256.json").read_text())
    scope = raw["provenance"]["telemetry_scope"]
    assert scope["over"] == "process" and scope["pid"] == own.pid and raw["provenance"]["device"] == "cpu"
    samples = [s for _, s in raw["telemetry"]["samples"]]
    assert samples and all(abs(s["rss_gb"] - own_rss) < 0.2 * own_rss for s in samples)  # that process's, not the machine's
    calibration = json.loads((work / "data" / "calibration.json").read_text())
    assert calibration["devices"]["cpu"]["status"] == "ok" and calibration["devices"]["cpu"]["configurations"] == ["own-cpu"]
    assert sorted(calibration["remote"]) == sorted(BEHAVIOURS)  # the others are remote by default: not calibrated
    fits = json.loads((work / "data" / "fits.json").read_text())["configurations"]
    assert fits["own-cpu"]["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 2  # K and V, 2 layers, 2 KV heads of 64, bf16
    assert fits["own-cpu"]["ceilings"]["measured"]["bandwidth_Bps"] > 0
    text = " ".join(pdftotext(work / "report" / "longctx.pdf").split())
    for b in BEHAVIOURS:
        assert b in text
    assert "GQA" in text and "1,024 KV bytes per token" in text and "MLA" not in text


def test_estimated_counts_stay_out_of_the_fits_unless_nothing_else_exists():
    """Counted trials follow TTFT = 0.1 s + 1e-7 s x L^2 and a 10 ms + 1 us x L step exactly (figures set
    here); estimated ones (and an early stop for decode) are off by 10x: the fits must not see them, unless nothing
    else was measured (then the fits stand on them and list where)."""
    import pandas as pd

    from longctx.analysis.fits import fit_all

    rows = []
    for length in (1000, 2000, 4000, 8000):
        ttft, tpot = 0.1 + 1e-7 * length**2, 0.01 + 1e-6 * length
        rows += [dict(configuration="c", length=length, concurrency=1, status="ok", ttft_s=ttft, tpot_s=tpot,
                      tokens_estimated=False, early_stop=False) for _ in range(2)]
        rows.append(dict(configuration="c", length=length, concurrency=1, status="ok", ttft_s=10 * ttft, tpot_s=10 * tpot,
                         tokens_estimated=True, early_stop=False))
        rows.append(dict(configuration="c", length=length, concurrency=1, status="ok", ttft_s=ttft, tpot_s=10 * tpot,
                         tokens_estimated=False, early_stop=True))
    out = fit_all(pd.DataFrame(rows), settings={"bootstrap": 50})["configurations"]["c"]
    assert out["trials_estimated"] == 4 and out["trials_early_stop"] == 4
    assert out["prefill"]["c_s_per_token2"] == pytest.approx(1e-7, rel=1e-6) and out["prefill"]["on_flagged_lengths"] == []
    assert out["decode"]["beta_s_per_token"] == pytest.approx(1e-6, rel=1e-6) and out["decode"]["on_flagged_lengths"] == []
    only = pd.DataFrame([r for r in rows if r["tokens_estimated"]])
    out = fit_all(only, settings={"bootstrap": 50})["configurations"]["c"]
    assert out["prefill"]["on_flagged_lengths"] == out["decode"]["on_flagged_lengths"] == [1000, 2000, 4000, 8000]
    assert out["prefill"]["c_s_per_token2"] == pytest.approx(1e-6, rel=1e-6)


def test_a_length_beyond_what_the_server_reports_is_not_sent(tmp_path):
    """The server reports max_model_len 8192 in /v1/models: 8190 + 9 output tokens is refused without a request."""
    with openai_server("no-health", tmp_path) as (base, seen):
        config = external(base, str(tmp_path / "no-health"), lengths=(64, 8190))
        assert run_configuration(lcfg.configuration_spec(config, "ext"), tmp_path / "raw", tmp_path / "x.log") == 1
    raw = json.loads((tmp_path / "raw" / "8190.json").read_text())
    assert raw["status"] == "failed" and raw["trials"] == []
    assert raw["reason"] == "not sent: 8190 prompt and 9 output tokens exceed the context length of 8192 tokens the server reports"
    assert all(len(r["prompt"]) < 8000 for r in seen)
    assert json.loads((tmp_path / "raw" / "64.json").read_text())["status"] == "ok"


@pytest.mark.parametrize("behaviour", ["text-only", "bos"])
def test_a_conversation_in_text_carries_the_generated_text_and_every_turn_is_counted_exactly(tmp_path, behaviour):
    """A text-only server (one that adds a BOS too): each turn sends the conversation so far as text, the
    text the server generated included, and the server's own count of every turn (its tokenizer) is the
    length longctx sent; these servers keep no prefix cache and report no cached count ("unreported")."""
    with openai_server(behaviour, tmp_path) as (base, seen):
        config = lcfg.validate({**external(base, str(tmp_path / behaviour), lengths=(64,)), "prefix": {
            "conversation": {"max_context": 200, "turn_tokens": 40, "output_tokens": 9, "control": False}}})
        assert run_configuration(lcfg.configuration_spec(config, "ext"), tmp_path / "raw", tmp_path / "x.log") == 0
    (conv,) = json.loads((tmp_path / "raw" / "prefix.json").read_text())["conversations"]
    turns = conv["turns"]
    assert conv["status"] == "ok" and len(turns) >= 3, conv["reason"]
    assert all(t["status"] == "ok" and t["cached_check"] == "unreported" for t in turns)
    assert [t["generated"] for t in turns] == [None] + ["text"] * (len(turns) - 1)
    sent = [r["prompt"] for r in seen if r["max_tokens"] == 9 and isinstance(r["prompt"], str)][-len(turns):]
    for before, after in zip(sent, sent[1:]):  # each turn's text starts with the whole previous one
        assert after.startswith(before) and len(after) > len(before)
    # each turn: the previous turn's tokens as the server counted them, its generated text, and 40 new tokens
    for prev, turn in zip(turns, turns[1:]):
        assert turn["previous_tokens"] >= prev["prompt_tokens"] and turn["prompt_tokens"] == turn["previous_tokens"] + 40


def test_a_count_the_server_did_not_give_is_not_checked_and_is_said_to_be_not_checked():
    """Issue 32: with no usage from the server the prompt count is taken as the length asked; comparing it with that
    length could not fail, so it is marked not checked (and the report says how many trials were), where a count the
    server gave is compared and fails when it differs."""
    from longctx.measure.prompts import check_counts
    from longctx.report.wording import trial_flags

    def summary(prompt_tokens, source):
        return {"status": "ok", "reason": None, "prompt_tokens": prompt_tokens, "completion_tokens": 8,
                "usage_source": source}

    assert check_counts(summary(1000, "server"), 1000, 8)["prompt_count_checked"] is True
    wrong = check_counts(summary(1001, "server"), 1000, 8)
    assert wrong["status"] == "failed" and "counted 1001 prompt tokens, expected 1000" in wrong["reason"]
    unchecked = check_counts(summary(1000, "client"), 1000, 8)
    assert unchecked["status"] == "ok" and unchecked["prompt_count_checked"] is False
    import pandas as pd

    rows = pd.DataFrame([summary(1000, "client"), summary(1000, "server"), summary(1000, "client")])
    assert "2 of 3 trials' prompt counts were not checked: the server gave no count" in " ".join(trial_flags(rows))
