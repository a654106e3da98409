"""The needle probe: not applicable on random weights; pass and fail judged on a server whose
answers are known (a small real HTTP server written for the test, because no model here can read)."""

import json

import httpx
import pytest
from starlette.responses import JSONResponse

from longctx.measure.sweep import run_configuration
from longctx.measure.needle import haystack, probe

from .conftest import serve_generate, tiny_spec

CFG = {"enabled": True, "depth": 0.5, "needle": "The secret password is Dog.",
       "question": "What is the secret password?", "answer": "Dog", "output_tokens": 8}


def test_haystack_puts_the_needle_at_its_depth():
    text = haystack(4000, CFG["needle"], 0.25, CFG["question"])
    at = text.index(CFG["needle"])
    assert 0.2 < at / 4000 < 0.3 and text.endswith(CFG["question"])
    assert haystack(1000, CFG["needle"], 0.0, "q?").startswith(CFG["needle"])


@pytest.fixture(scope="module")
def reader():
    """Answers from the text it is given: 'Dog.' when the needle is in it; 4 characters a token."""

    async def generate(request):
        # as a FastAPI server parses a body (llama.cpp's, vLLM's): by its Content-Type, HTTP 500 without one
        if request.headers.get("content-type") != "application/json":
            return JSONResponse({"error": "body is not JSON"}, status_code=500)
        text = (await request.json())["text"]
        return JSONResponse({"text": " Dog." if "password is Dog" in text else " Cat.",
                             "meta_info": {"prompt_tokens": len(text) // 4, "completion_tokens": 2}})

    with serve_generate(generate) as base:
        yield base


@pytest.fixture(scope="module")
def stubborn():
    """Counts every prompt as 3,000 tokens, whatever its length: a server whose count of a haystack
    never comes within the tolerance of the length asked, however the probe resizes it."""

    async def generate(request):
        text = (await request.json())["text"]
        return JSONResponse({"text": " Dog.", "meta_info": {"prompt_tokens": 3000, "completion_tokens": 2}})

    with serve_generate(generate) as base:
        yield base


def test_a_prompt_whose_length_could_not_be_matched_is_flagged(stubborn, reader):
    with httpx.Client() as client:
        off = probe(client, stubborn, "sglang", "m", 1000, CFG, 30, random_weights=False)
        assert off["status"] == "pass" and off["length_matched"] is False and off["prompt_tokens"] == 3000
        assert off["reason"] == f"its prompt had {off['prompt_tokens']} tokens, not the 1000 asked, after 3 tries"
        near = probe(client, reader, "sglang", "m", 1000, CFG, 30, random_weights=False)
        assert near["length_matched"] is True and "reason" not in near


def test_pass_and_fail_are_judged_from_the_answer(reader):
    with httpx.Client() as client:
        ok = probe(client, reader, "sglang", "m", 5000, CFG, 30, random_weights=False)
        assert ok["status"] == "pass" and abs(ok["prompt_tokens"] - 5000) <= 100 and ok["answer"] == "Dog."
        wrong = probe(client, reader, "sglang", "m", 5000, {**CFG, "needle": "The secret password is Cow."}, 30, False)
        assert wrong["status"] == "fail" and wrong["answer"] == "Cat."
        assert probe(client, reader, "sglang", "m", 5000, CFG, 30, random_weights=True)["status"] == "not applicable"


def test_the_reference_engine_says_its_weights_are_random(tmp_path):
    spec = tiny_spec("page1", lengths=[64])
    spec.protocol.update(warmup=0, trials=1, output_tokens=3)
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 0
    needle = json.loads((tmp_path / "raw" / "64.json").read_text())["needle"]
    assert needle == {"status": "not applicable", "reason": "the model's weights are random"}
