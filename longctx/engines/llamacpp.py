"""The schedulers of llama.cpp's servers, for an external configuration that says it runs one
(configurations.<name>.scheduler: {engine: llama.cpp | llama-cpp-python, args: its flags}), as
longctx.analysis.simulate's Rules fields (EngineAdapter.scheduler_rules' form).

- llama.cpp's own server (llama-server, tools/server/server.cpp, update_slots): requests take slots (--parallel);
  with continuous batching (--cont-batching, its default) every step's batch of at most --batch-size tokens (2,048)
  holds each generating slot's next token first, then the prompts of the slots still processing theirs, in slot
  order, as far as the batch goes: a token budget per step, running requests first (TOKEN_BUDGET, chunk = the batch
  size, at most --parallel running). Its KV cache holds --ctx-size cells (the pool); where the slots do not share it
  (--no-kv-unified) each has a share, which the model does not split. Without continuous batching a prompt waits
  for every slot to stop generating: not in the model.
- llama-cpp-python's server (llama_cpp.server) started with interrupt_requests False: one model behind a lock held
  for a whole completion, so one request at a time and the next waits; its prompt evaluated in batches of n_batch
  tokens (512), a forward pass each, then a token a step (PREFILL_FIRST, at most 1 running, chunk = n_batch). Its
  context, n_ctx (2,048), is the pool. With interrupt_requests (its default) a request that arrives ends the one
  streaming (three of four in a closed loop of 2 stopped after their first token here): not simulated.

A rule set the simulation does not have comes back as {"not_simulated": why}.
"""

from __future__ import annotations

from .base import arg_value

LLAMA_SERVER, LLAMA_CPP_PYTHON = "llama.cpp", "llama-cpp-python"


def llama_server_rules(args: dict, server_info: dict, pool_tokens: int | None, device: str | None = None) -> dict | None:
    if arg_value(args, "no-cont-batching") or arg_value(args, "cont-batching") is False:
        return {"not_simulated": "llama.cpp's server without continuous batching (a prompt waits until no slot "
                                 "generates) is not in the serving model"}
    notes = []
    batch = arg_value(args, "batch-size", "b")
    if batch is None:
        batch = 2048
        notes.append("--batch-size not set: llama.cpp's default 2,048")
    slots = arg_value(args, "parallel", "np")
    if slots is None or int(slots) < 1:
        slots = 1
        notes.append("--parallel not set: 1 slot taken (llama.cpp's default depends on its version: set it in "
                     "scheduler.args)")
    ctx = arg_value(args, "ctx-size", "c")
    return {"policy": "token_budget", "chunk": int(batch), "max_running": int(slots),
            "pool_tokens": pool_tokens or (int(ctx) if ctx else None), "notes": notes,
            "source": "llama.cpp's server's (update_slots): slots, continuous batching, each step's batch the generating "
                      "slots' tokens first, then prompts as far as --batch-size goes"}


def llama_cpp_python_rules(args: dict, server_info: dict, pool_tokens: int | None, device: str | None = None) -> dict:
    if str(arg_value(args, "interrupt-requests", default=True)).lower() not in ("false", "0", "no"):
        return {"not_simulated": "llama-cpp-python's server ends the streaming request when another arrives "
                                 "(interrupt_requests, its default): start it with --interrupt_requests False and say so "
                                 "in scheduler.args to have it simulated"}
    notes = []
    batch = arg_value(args, "n-batch")
    if batch is None:
        batch = 512
        notes.append("n_batch not set: llama-cpp-python's default 512")
    ctx = arg_value(args, "n-ctx")
    if ctx is None and not pool_tokens:
        ctx = 2048
        notes.append("n_ctx not set: llama-cpp-python's default 2,048")
    return {"policy": "prefill_first", "chunk": int(batch), "max_running": 1, "one_prefill": True,
            "pool_tokens": pool_tokens or int(ctx), "notes": notes,
            "source": "llama-cpp-python's server's (llama_cpp.server): one completion at a time behind the model's lock, "
                      "its prompt in n_batch batches, then a token a step"}


RULES = {LLAMA_SERVER: llama_server_rules, LLAMA_CPP_PYTHON: llama_cpp_python_rules}
