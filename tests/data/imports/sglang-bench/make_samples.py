"""Write bench_serving.jsonl: sample lines in the shape SGLang 0.5.23's bench_serving writes with
`--output-file FILE --output-details`, timed against longctx's reference engine (see README.md).

SGLang's bench_serving could not be installed beside the pinned torch, so this script stands in for it.
It is written from sglang 0.5.23's sglang/benchmark/serving.py (async_request_sglang_generate, calculate_metrics,
benchmark's `result` and `result_details` dicts), without its code: each request is timed with
time.perf_counter from the post; the TTFT is the first chunk with text; a later chunk's gap is split evenly
over the tokens it added (meta_info.completion_tokens); the latency is the last line read ([DONE]
included); input_lens is the server's meta_info.prompt_tokens where it reported one, else the dataset's
length; a non-200 reply is `success=False` with error "<reason>: <body>"; a failed request's output_len
is 0 in output_lens; the summary figures are numpy's mean/median/std/percentile over the successful
requests, in ms. Usage: python make_samples.py PORT_4096 PORT_300 OUT
"""

import asyncio
import json
import random
import sys
import time

import aiohttp
import numpy as np


async def one(session, url, prompt, prompt_len, output_len):
    out = {"prompt_len": prompt_len, "output_len": output_len, "ttft": 0.0, "itl": [], "text": "",
           "error": "", "success": False, "latency": 0.0}
    payload = {"text": prompt, "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len,
               "ignore_eos": True}, "stream": True, "lora_path": None, "return_logprob": False,
               "return_routed_experts": False, "logprob_start_len": -1}
    st = time.perf_counter()
    out["start"] = st
    recent, last_len = st, 0
    async with session.post(url, json=payload) as resp:
        if resp.status != 200:
            out["error"] = (resp.reason or "") + ": " + (await resp.text())
            return out
        async for raw in resp.content:
            raw = raw.strip()
            if not raw:
                continue
            data = raw[6:] if raw.startswith(b"data: ") else raw
            latency = time.perf_counter() - st
            if data == b"[DONE]":
                continue
            d = json.loads(data)
            meta = d.get("meta_info") or {}
            if meta.get("prompt_tokens"):
                out["prompt_len"] = meta["prompt_tokens"]
            if d.get("text"):
                now = time.perf_counter()
                n = meta["completion_tokens"]
                if out["ttft"] == 0.0:
                    out["ttft"] = now - st
                else:
                    if n == last_len:
                        continue
                    out["itl"].extend([(now - recent) / (n - last_len)] * (n - last_len))
                recent, last_len = now, n
                out["text"] = d["text"]
                out["output_len"] = n
        out["success"], out["latency"] = True, latency
    return out


def metrics(outs, prompt_lens, dur):
    ok = [o for o in outs if o["success"]]
    ttfts = [o["ttft"] for o in ok]
    e2e = [o["latency"] for o in ok]
    tpots = [(o["latency"] - o["ttft"]) / (o["output_len"] - 1) for o in ok if o["output_len"] > 1]
    itls = [x for o in ok for x in o["itl"]]
    out_lens = [o["output_len"] if o["success"] else 0 for o in outs]
    total_in = sum(p for p, o in zip(prompt_lens, outs) if o["success"])
    retok = sum(len(o["text"]) for o in ok)  # the one-character tokenizer: one token a character
    t0 = min(o["start"] for o in ok)
    t1 = max(o["start"] + o["latency"] for o in ok)
    nsec = int(np.ceil(t1 - t0)) + 1
    tok_s, conc_s = np.zeros(nsec), np.zeros(nsec)
    for o in ok:
        t = o["start"] + o["ttft"]
        times = [t]
        for g in o["itl"]:
            t += g
            times.append(t)
        for t in times:
            if 0 <= int(t - t0) < nsec:
                tok_s[int(t - t0)] += 1
        for s in range(int(o["start"] - t0), min(int(o["start"] + o["latency"] - t0) + 1, nsec)):
            conc_s[s] += 1
    ms = {}
    for name, xs in (("e2e_latency", e2e), ("ttft", ttfts), ("tpot", tpots), ("itl", itls)):
        xs = xs or 0
        ms[name] = {"mean": np.mean(xs) * 1000, "median": np.median(xs) * 1000, "std": np.std(xs) * 1000,
                    "p90": np.percentile(xs, 90) * 1000, "p95": np.percentile(xs, 95) * 1000,
                    "p99": np.percentile(xs, 99) * 1000}
    return {"completed": len(ok), "total_input": total_in, "total_output": sum(out_lens), "retok": retok,
            "out_lens": out_lens, "ms": ms, "concurrency": float(np.sum(e2e) / dur),
            "max_tok_s": float(np.max(tok_s)), "max_conc": int(np.max(conc_s))}


async def run(port, input_len, ratio, seed, out_path):
    base = f"http://127.0.0.1:{port}"
    rng = np.random.default_rng(seed)
    lens = rng.integers(max(int(input_len * ratio), 1), input_len + 1, size=3).tolist()
    out_lens = rng.integers(max(int(8 * ratio), 1), 8 + 1, size=3).tolist()  # the output lengths likewise
    prompts = ["".join(random.Random(seed + i).choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(n))
               for i, n in enumerate(lens)]
    async with aiohttp.ClientSession() as session:
        await one(session, base + "/generate", prompts[0][:64], 64, 8)  # the warm-up request, not recorded
        t0 = time.perf_counter()
        outs = []
        for p, n, o in zip(prompts, lens, out_lens):  # --max-concurrency 1
            outs.append(await one(session, base + "/generate", p, n, o))
        async with session.get(base + "/server_info") as r:  # for the accept length, before the duration
            await r.json()
        dur = time.perf_counter() - t0
        async with session.get(base + "/server_info") as r:  # the one the result holds
            server_info = await r.json()
    m = metrics(outs, lens, dur)
    ms = m["ms"]
    result = {"tag": None, "backend": "sglang", "dataset_name": "random", "request_rate": float("inf"),
              "max_concurrency": 1, "sharegpt_output_len": None, "random_input_len": input_len,
              "random_output_len": 8, "random_range_ratio": ratio, "server_info": server_info,
              "duration": dur, "completed": m["completed"], "total_input_tokens": m["total_input"],
              "total_input_text_tokens": m["total_input"], "total_input_vision_tokens": 0,
              "total_output_tokens": m["total_output"], "total_output_tokens_retokenized": m["retok"],
              "request_throughput": m["completed"] / dur, "input_throughput": m["total_input"] / dur,
              "output_throughput": m["total_output"] / dur,
              "total_throughput": (m["total_input"] + m["total_output"]) / dur}
    for name in ("e2e_latency", "ttft", "tpot", "itl"):
        for stat in ("mean", "median", "std", "p90", "p95", "p99"):
            result[f"{stat}_{name}_ms"] = ms[name][stat]
    result.update({"concurrency": m["concurrency"], "accept_length": None,
                   "max_output_tokens_per_s": m["max_tok_s"], "max_concurrent_requests": m["max_conc"]})
    result.update({"input_lens": [o["prompt_len"] for o in outs], "output_lens": m["out_lens"],
                   "ttfts": [o["ttft"] for o in outs], "itls": [o["itl"] for o in outs],
                   "generated_texts": [o["text"] for o in outs], "errors": [o["error"] for o in outs]})
    with open(out_path, "a") as f:
        f.write(json.dumps(result) + "\n")


async def main():
    port_4096, port_300, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    for n in (64, 128, 256):
        await run(port_4096, n, 1.0, n, out)
    await run(port_300, 400, 0.5, 2, out)  # lengths drawn from [200, 400]: one is over the context length


asyncio.run(main())
