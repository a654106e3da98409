"""Real text for prompts (longctx.measure.text): cut to exact token counts as a real Hugging Face tokenizer (the
`tokenizers` library: a byte-level BPE trained in tests/openai_servers.py) counts them, readable (the text is the
source's own, checked against the source read here independently), no two requests sharing a head, a user's
directory read in path order with what is not text left out, and every misconfiguration named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from longctx import config as lcfg
from longctx.core.errors import ConfigError
from longctx.measure.prompts import Tokenizer, text_words
from longctx.measure.text import HEAD_TOKENS, DocumentText, TextSourceError
from longctx.refengine.tokenizer import ByteTokenizer

from .openai_servers import make_tokenizer


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Tokenizer:
    return Tokenizer(make_tokenizer(tmp_path_factory.mktemp("bpe")))


def pydoc_text() -> str:
    """The built-in source's first documents, read here as the stdlib has them."""
    from pydoc_data.topics import topics

    return "".join(topics[k] + "\n\n" for k in sorted(topics))


@pytest.mark.parametrize("n", [1, 17, 100, 1000, 4096])
def test_text_has_exactly_the_tokens_asked_and_reads_as_the_source(bpe, n):
    doc = DocumentText(bpe, "stdlib")
    text = doc.text(n, 0, f"run/conf/{n}/0")
    assert len(bpe.encode(text)) == n  # the tokenizer's own count
    ids = doc.ids(n, 0, f"run/conf/{n}/0")
    assert len(ids) == n
    if n > HEAD_TOKENS + 50:  # after the head, the source's own words, as the stdlib has them
        body = bpe.decode(ids[HEAD_TOKENS:])
        assert body in pydoc_text() and pydoc_text().startswith(body)
        assert 'The "assert" statement' in body


def test_no_two_requests_share_a_head_and_a_lead_parts_extensions_at_once(bpe):
    doc = DocumentText(bpe, "stdlib")
    heads = {tuple(doc.ids(64, 0, f"run/conf/1024/{i}")[:HEAD_TOKENS]) for i in range(500)}
    assert len(heads) == 500
    firsts = {doc.ids(64, 0, "one key", lead=lead)[0] for lead in range(8)}
    assert len(firsts) == 8


def test_the_reference_engines_bytes_are_the_texts_utf8():
    doc = DocumentText(ByteTokenizer(), "stdlib")
    ids = doc.ids(3000, 0, "k")
    assert bytes(ids[HEAD_TOKENS:]) == pydoc_text().encode()[:3000 - HEAD_TOKENS]
    assert set(ids[:HEAD_TOKENS]) <= set(pydoc_text()[:2048].encode())  # the head: bytes of the text's own


def test_a_directory_of_documents_is_read_in_path_order_leaving_out_what_is_not_text(bpe, tmp_path):
    docs = tmp_path / "docs"
    (docs / "b").mkdir(parents=True)
    (docs / "a.md").write_text("# Alpha\n\nThe first document talks about paged attention. " * 20)
    (docs / "b" / "code.py").write_text("def beta():\n    return 'the second document'\n" * 20)
    (docs / "image.bin").write_bytes(b"\x89PNG\0\0\x01" * 100)
    (docs / ".git").mkdir()
    (docs / ".git" / "HEAD").write_text("ref: refs/heads/main secret history\n" * 50)
    (docs / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 50)
    doc = DocumentText(bpe, str(docs))
    body = bpe.decode(doc.body(len(doc.ids_), 0))
    assert body.index("Alpha") < body.index("beta") and "PNG" not in body and "secret history" not in body
    assert "caf" not in body
    info = doc.describe(len(doc.ids_) + HEAD_TOKENS)
    assert (info["documents"], info["first"], info["last"]) == (2, "a.md", "b/code.py")
    assert "the documents at" in text_words(info) and "2 documents" in text_words(info)
    with pytest.raises(TextSourceError, match=r"holds [\d,]+ tokens \(2 documents\).*needs [\d,]+ of them: add documents"):
        doc.ids(len(doc.ids_) + 100, 0, "k")


def test_a_single_file_is_a_source_too(bpe, tmp_path):
    f = tmp_path / "paper.txt"
    f.write_text("Long context inference reads the whole cache for every token. " * 50)
    doc = DocumentText(bpe, str(f))
    assert len(bpe.encode(doc.text(200, 0, "k"))) == 200
    assert doc.describe(200)["first"] == str(f)


def test_a_source_that_is_not_there_or_holds_no_text_is_a_config_error(bpe, tmp_path):
    with pytest.raises(ConfigError, match=r"protocol.text_source.*neither a file nor a directory.*random.*stdlib"):
        DocumentText(bpe, str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no text"):
        DocumentText(bpe, str(tmp_path / "empty"))


def test_documents_without_a_tokenizer_to_cut_them_are_refused_before_any_server_starts(tmp_path):
    """An external server with no tokenizer known (no model.tokenizer, no model.path): its prompts cannot be cut
    from the user's documents, and longctx says so at once; with stdlib (the default) they are random, and said."""
    from longctx.engines import get_adapter
    from longctx.measure.probe import text_source
    from longctx.measure.session import Session

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("some text " * 100)
    config = lcfg.validate({"lengths": [64], "protocol": {"text_source": str(tmp_path / "docs")}, "model": {"name": "m"},
                            "configurations": {"ext": {"engine": "external", "url": "http://127.0.0.1:9", "api": "openai"}}})
    spec = lcfg.configuration_spec(config, "ext")
    with pytest.raises(ConfigError, match=r"protocol.text_source.*cannot cut prompts.*tokenizer is not known.*random"):
        Session(get_adapter("external"), spec, tmp_path / "server.log", {})
    source, said = text_source({"text_source": "stdlib"}, None)
    assert source is None and said["kind"] == "random" and "tokenizer is not known" in said["why"]
    assert lcfg.validate({"lengths": [64], "model": {"name": "m"}, "configurations": {
        "ext": {"engine": "external", "url": "http://x", "api": "openai"}}})["protocol"]["text_source"] == "stdlib"


@pytest.mark.parametrize("n", [2857, 2858, 2859, 2860])
def test_a_cut_inside_a_character_still_gives_the_exact_count(n):
    """The byte tokenizer spells a non-ASCII character in several tokens (the stdlib's first is near byte 2,841):
    no end of the text gives n there, and a shorter head does."""
    tok = ByteTokenizer()
    text = DocumentText(tok, "stdlib").text(n, 0, "k")
    assert len(tok.encode(text)) == n


def test_an_extension_reads_on_where_the_prompt_before_it_stopped(bpe):
    """The reused-context workloads (a shared head, then turns): each extension's text continues the document,
    not the same passage again, and two leads part at their first new token."""
    from longctx.measure.prompts import Prompter, PromptPlan

    doc = DocumentText(bpe, "stdlib")
    p = Prompter("openai", "m", {"seed": 0, "token_id_range": [0, 10]}, PromptPlan(), doc, bpe)
    head = p.head(300, "h")
    one, two = p.extend(head, 200, "e1", lead=1), p.extend(head, 200, "e2", lead=2)
    assert one[:300] == two[:300] == head and one[300] != two[300]
    source = pydoc_text()
    first, then = bpe.decode(head[HEAD_TOKENS:]), bpe.decode(one[300 + HEAD_TOKENS:])
    assert source.index(then) > source.index(first) + len(first) - 1


def test_a_negative_seed_is_a_config_error(bpe):
    with pytest.raises(ConfigError, match=r"protocol.seed.*allowed values: 0 or more"):
        DocumentText(bpe, "stdlib").ids(100, -1, "k")


def test_the_reference_engine_reads_your_documents_and_a_source_too_short_is_said_before_any_length(tmp_path):
    """The reference engine (its byte tokenizer, the adapter's) with prompts cut from a file of the user's: the
    lengths it holds are measured from it (the provenance names it); with a longest length beyond it, the prompt
    probe says so, naming how much the file holds and the fix, and no length is measured half."""
    import json

    from longctx.measure.sweep import run_configuration

    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n\nPaged attention keeps the cache in pages; a long prompt fills many of them. " * 8)
    def spec(lengths):
        config = lcfg.validate({
            "lengths": lengths, "protocol": {"warmup": 0, "trials": 1, "output_tokens": 2, "text_source": str(notes),
                                             "request_timeout_s": 60},
            "server": {"startup_timeout_s": 60}, "telemetry": {"enabled": False},
            "model": {"architecture": {"num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 2,
                                       "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16}},
            "configurations": {"ref": {"engine": "reference", "args": {"context-length": 4096, "max-total-tokens": 4096}}}})
        return lcfg.configuration_spec(config, "ref")

    assert run_configuration(spec([64, 256]), tmp_path / "ok", tmp_path / "ok.log") == 0
    raw = json.loads((tmp_path / "ok" / "256.json").read_text())
    said = raw["provenance"]["prompt_probe"]["text_source"]
    assert (said["source"], said["documents"], said["first"], said["tokens"]) == (str(notes), 1, str(notes), 256 - HEAD_TOKENS)
    assert raw["trials"][0]["prompt_tokens"] == 256
    assert run_configuration(spec([64, 2048]), tmp_path / "short", tmp_path / "short.log") == 2
    for length in (64, 2048):
        raw = json.loads((tmp_path / "short" / f"{length}.json").read_text())
        assert raw["status"] == "failed" and re.search(r"holds [\d,]+ tokens \(1 document\).*a prompt of 2,048 tokens needs 2,032 of them: add documents", raw["reason"]), raw["reason"]


def test_a_tokenizer_that_cannot_spell_the_text_falls_back_to_random_for_stdlib_and_is_said_for_yours(tmp_path):
    """A word-level vocabulary of made-up words (as the suite's tiny random Llama has) spells the standard library
    as unknown tokens: the built-in source falls back to random prompts, saying why; a user's documents are refused."""
    from tokenizers import Tokenizer as HF, models, pre_tokenizers

    from longctx.measure.probe import PromptError, text_source

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 1024)}}
    hf = HF(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.add_special_tokens(["[UNK]"])
    (tmp_path / "tok").mkdir()
    hf.save(str(tmp_path / "tok" / "tokenizer.json"))
    tok = Tokenizer(tmp_path / "tok")
    source, said = text_source({"text_source": "stdlib"}, tok)
    assert source is None and said["kind"] == "random" and re.search(r"spells (9\d|100)% of .* as special or unknown", said["why"])
    (tmp_path / "doc.txt").write_text("plain words the vocabulary has never seen " * 100)
    with pytest.raises(PromptError, match="cannot spell this text"):
        text_source({"text_source": str(tmp_path / "doc.txt")}, tok)
