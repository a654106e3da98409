"""Imported results (longctx.measure.imports): how requests another tool recorded become lengths and trials,
checked against figures worked out by hand from the inputs written here."""

import json
from pathlib import Path

import pytest

from longctx import config as lcfg
from longctx.core.errors import ConfigError
from longctx.measure import imports
from longctx.measure.imports.records import Request, Run

ROOT = Path(__file__).resolve().parents[1]
VLLM_FILES = ROOT / "tests" / "data" / "imports" / "vllm-bench"


def run(requests, **kw) -> Run:
    return Run(tool="t", tool_version=None, version_source="none", path="f.json", record=0, label="", requests=requests, **kw)


def test_a_run_of_one_length_is_that_length_and_a_distribution_is_binned_with_its_edges_stated():
    one = run([Request(ok=True, prompt_tokens=n, ttft_s=0.1) for n in (1000, 1010, 1040)], requested_input_tokens=1024)
    spread = run([Request(ok=True, prompt_tokens=n, ttft_s=0.1) for n in (300, 500, 700, 1500, 3000)]
                 + [Request(ok=False, reason="timeout")])
    groups, unplaced = imports.group([one, spread])
    # by hand: 1040 <= 1000 x 1.05, so one length: the configured 1024 (it lies within 5% of them);
    # the spread is binned by powers of two: [256, 512) holds 300 and 500 (median 400), [512, 1024) holds 700,
    # [1024, 2048) holds 1500 and [2048, 4096) holds 3000; the failed request without a length goes to the bin of
    # the run's median (700: [512, 1024))
    assert [(g.length, len(g.members)) for g in groups] == [(400, 2), (700, 2), (1024, 3), (1500, 1), (3000, 1)]
    assert unplaced == []
    assert "prompts of 256 to 511 tokens" in groups[0].how[0] and "a bin of a distribution" in groups[0].how[0]
    assert groups[2].how == ["f.json (run 0): one length, prompts of 1000-1040 tokens"]
    # given edges: 3000 lies outside them and is said to
    groups, unplaced = imports.group([spread], bins=[256, 1024, 2048])
    assert [(g.length, len(g.members)) for g in groups] == [(500, 4), (1500, 1)]
    assert len(unplaced) == 1 and "3000 prompt tokens, outside the bins 256-2048" in unplaced[0]


def test_a_request_becomes_a_trial_with_the_tools_times_and_per_token_gaps_only_where_a_chunk_is_a_token():
    # TTFT 0.5 s, then chunks 0.1, 0.1 and 0.2 s apart: the last token at 0.9 s; 4 tokens, 4 chunks
    t = imports.trial(Request(ok=True, prompt_tokens=100, completion_tokens=4, ttft_s=0.5, e2e_s=0.9, itl_s=[0.1, 0.1, 0.2]))
    assert t["status"] == "ok" and t["chunks"] == 4
    assert t["tpot_s"] == pytest.approx(0.4 / 3) and t["decode_tok_s"] == pytest.approx(3 / 0.4)
    assert t["itl_median_s"] == pytest.approx(0.1) and t["itl_max_s"] == pytest.approx(0.2)
    # the same chunks carrying 7 tokens: TPOT over the 6 after the first, and no per-token gaps (the file does not
    # say how a chunk's tokens divide its gap)
    t = imports.trial(Request(ok=True, completion_tokens=7, ttft_s=0.5, token_times_s=[0.5, 0.6, 0.7, 0.9]))
    assert t["tpot_s"] == pytest.approx(0.4 / 6) and t["itl_median_s"] is None and t["itl_max_s"] is None
    # only the tool's TPOT
    assert imports.trial(Request(ok=True, ttft_s=0.2, tpot_s=0.05))["decode_tok_s"] == pytest.approx(20)
    # the tool's failure stays one, with its words
    t = imports.trial(Request(ok=False, reason="Bad Request", prompt_tokens=2100))
    assert (t["status"], t["reason"], t["prompt_tokens"], t["ttft_s"]) == ("failed", "Bad Request", 2100, None)


def test_concurrency_is_what_the_tool_set_or_what_its_times_show():
    def at(start, latency):
        return Request(ok=True, ttft_s=0.1, start_s=start, e2e_s=latency)

    # one after another (each ends before the next starts), though the tool set no limit
    assert imports.concurrency(run([at(0, 1), at(1.5, 1), at(3, 1)])) == (1, "no two requests overlapped in the tool's times")
    # by hand: [0, 2], [1, 3], [1.5, 2.5]: three in flight at 1.5 s
    assert imports.concurrency(run([at(0, 2), at(1, 2), at(1.5, 1)]))[0] == 3
    assert imports.concurrency(run([at(0, 2), at(1, 2)], concurrency=4))[0] == 4
    assert imports.concurrency(run([at(0, 2), at(1, 2)], concurrency=1))[0] == 1


def tiny_with(extra: dict) -> dict:
    raw = lcfg.read(ROOT / "tests" / "configs" / "tiny.yaml")
    raw["configurations"] = {"page1": raw["configurations"]["page1"], **extra}
    return raw


def test_config_of_an_imported_configuration_names_the_key_and_the_allowed_values(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError, match=r"configurations.x.format': 'nope' is not allowed; allowed values: vllm-bench"):
        lcfg.validate(tiny_with({"x": {"engine": "imported", "format": "nope", "files": ["a"]}}))
    with pytest.raises(ConfigError, match=r"configurations.x.files' is required"):
        lcfg.validate(tiny_with({"x": {"engine": "imported", "format": "aiperf"}}))
    with pytest.raises(ConfigError, match=r"configurations.x.url' is for a server"):
        lcfg.validate(tiny_with({"x": {"engine": "imported", "format": "aiperf", "files": ["a"], "url": "http://h:1"}}))
    with pytest.raises(ConfigError, match=r"configurations.page1.files' is for imported results"):
        raw = tiny_with({})
        raw["configurations"]["page1"]["files"] = ["a"]
        lcfg.validate(raw)
    config = lcfg.validate(tiny_with({"x": {"engine": "imported", "format": "vllm-bench", "files": [str(tmp_path / "none-*.json")]}}))
    with pytest.raises(ConfigError, match=r"configurations.x.files': .*none-\*.json' matches no file"):
        imports.lengths_of(lcfg.configuration_spec(config, "x"))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"benchmarks": []}))
    config = lcfg.validate(tiny_with({"x": {"engine": "imported", "format": "vllm-bench", "files": [str(wrong)]}}))
    with pytest.raises(ConfigError, match=r"wrong.json cannot be read as format 'vllm-bench' \(vllm bench serve\): .*not a "
                                          r"vllm bench serve result file"):
        imports.lengths_of(lcfg.configuration_spec(config, "x"))


def test_the_raw_files_of_an_import_are_the_sweeps_with_the_provenance_of_every_file(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = lcfg.validate(tiny_with({"vllm-bench": {
        "engine": "imported", "format": "vllm-bench", "files": ["tests/data/imports/vllm-bench/*.json"],
        "tool_version": "0.32.0", "device": "gpu", "hardware": {"gpu": "NVIDIA H200", "count": 1}, "kv_pool_tokens": 4096}}))
    spec = lcfg.configuration_spec(config, "vllm-bench")
    lengths = imports.import_configuration(spec, tmp_path)
    assert lengths == [64, 128, 256, 512, 2100]
    raw = json.loads((tmp_path / "512.json").read_text())
    assert raw["engine"] == "imported" and raw["status"] == "ok" and len(raw["trials"]) == 3
    doc = json.loads((VLLM_FILES / "vllm-bench-512.json").read_text())
    assert [t["ttft_s"] for t in raw["trials"]] == doc["ttfts"]  # the tool's own figures, as it wrote them
    prov = raw["provenance"]["imported"]
    assert prov["tool"] == "vllm bench serve" and prov["tool_version"] == "0.32.0"
    assert prov["version_source"] == "config key tool_version"
    assert {Path(f["path"]).name for f in prov["files"]} == {f"vllm-bench-{n}.json" for n in lengths}
    assert set(prov["lacks"]) == {"exact_prompt_lengths", "cache_busting", "server_counts"}
    failed = json.loads((tmp_path / "2100.json").read_text())
    assert failed["status"] == "failed" and [t["reason"] for t in failed["trials"]] == ["Bad Request"] * 3
    for what in ("load", "prefix"):
        assert json.loads((tmp_path / f"{what}.json").read_text())["status"] == "not configured"
    assert raw["provenance"]["kv_pool"]["given"]["tokens"] == 4096
    assert raw["provenance"]["hardware"] == {"source": "config", "gpus": [{"name": "NVIDIA H200"}], "cpu": None}


@pytest.mark.parametrize("fmt, files, lengths, failed, tool", [
    # lengths and failures as each directory's README says the files were made
    ("vllm-bench", "vllm-bench/*.json", [64, 128, 256, 512, 2100], {2100: 3}, "vllm bench serve"),
    # a run of 4 prompts drawn around 296 tokens (290-300, within 5%: one length), 2 of them over the 300-token context
    ("aiperf", "aiperf/*/profile_export.jsonl", [64, 128, 256, 296, 400], {296: 2, 400: 3}, "AIPerf"),
    # prompts drawn around 2,040 tokens (one of them, 2,053 tokens, over the 2,048-token context) and a run cut short
    ("guidellm", "guidellm/*.json", [64, 128, 256, 512, 2032], {512: 1, 2032: 1}, "GuideLLM"),
    # the fourth run draws 221, 252 and 368 tokens: bins [128, 256) and [256, 512); the 368-token one failed
    ("sglang-bench", "sglang-bench/*.jsonl", [64, 128, 236, 256, 368], {368: 1}, "sglang bench_serving"),
])
def test_every_formats_files_import_into_the_lengths_they_hold(fmt, files, lengths, failed, tool, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = lcfg.validate(tiny_with({"x": {"engine": "imported", "format": fmt, "files": [f"tests/data/imports/{files}"]}}))
    spec = lcfg.configuration_spec(config, "x")
    assert imports.import_configuration(spec, tmp_path) == lengths == imports.lengths_of(spec)
    lost = {}
    for n in lengths:
        raw = json.loads((tmp_path / f"{n}.json").read_text())
        rows = raw["trials"] + [r for b in raw["batches"] for r in b["requests"]]
        lost.update({n: k for k in [sum(r["status"] != "ok" for r in rows)] if k})
        assert all(r["reason"] for r in rows if r["status"] != "ok")
    assert lost == failed
    prov = raw["provenance"]["imported"]
    assert prov["tool"] == tool and prov["lacks"] and "cache_busting" in prov["lacks"]
    assert all(len(f["sha256"]) == 64 for f in prov["files"])
