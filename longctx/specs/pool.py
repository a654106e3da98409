"""SGLang's KV pool sizing rule, without torch: the reference engine sizes its pool with it and
the memory planner (longctx.analysis.memory) tabulates it. And the pool a server did allocate, as a
measurement recorded it (observed_pool): the sweep refuses what cannot fit it, the analysis plans
and extrapolates with it."""

from __future__ import annotations

from dataclasses import dataclass


class PoolError(RuntimeError):
    pass


@dataclass(frozen=True)
class PoolSizing:
    """SGLang's rule (ModelRunner.profile_max_num_token): with M the memory free before loading,
    rest = (M - weights) - M * (1 - mem_fraction_static); tokens = rest // cell bytes, then
    capped by --max-total-tokens and rounded down to the page size (init_memory_pool)."""

    memory_total_bytes: int
    mem_fraction_static: float
    weights_bytes: int
    cell_bytes: int  # bytes per token over all layers
    page_size: int
    max_total_tokens: int | None

    def tokens(self) -> int:
        m = self.memory_total_bytes
        rest = (m - self.weights_bytes) - m * (1 - self.mem_fraction_static)
        tokens = int(rest) // self.cell_bytes
        if self.max_total_tokens is not None:
            tokens = min(tokens, self.max_total_tokens)
        tokens = tokens // self.page_size * self.page_size
        if tokens <= 0:
            raise PoolError(
                "Not enough memory. Please try to increase --mem-fraction-static. "
                f"({self.mem_fraction_static} of {m / 2**30:.2f} GiB leaves {rest / 2**30:.3f} GiB after "
                f"{self.weights_bytes / 2**30:.3f} GiB of weights: not one page of {self.page_size} tokens "
                f"x {self.cell_bytes} bytes)"
            )
        return tokens


def observed_pool(entry: dict) -> tuple[int | None, str | None]:
    """The KV pool's tokens as the server allocated it, from a provenance entry, and where the figure came
    from: what the server reports ("the server's info": the adapter's pool_tokens, SGLang's
    max_total_num_tokens), else its log ("the server's log": the adapter's kv_pool_from_log, vLLM's
    "CPU/GPU KV cache size: N tokens", SGLang's "KV Cache is allocated. #tokens: N", the line in
    kv_pool.log.line); (None, None) where neither was recorded."""
    pool = entry.get("kv_pool") or {}
    given = pool.get("given") or {}
    if given.get("tokens"):  # imported results: the config says what the server allocated
        return int(given["tokens"]), f"the config ({given.get('key', 'kv_pool_tokens')})"
    if pool.get("tokens"):
        return int(pool["tokens"]), "the server's info"
    log = pool.get("log") or {}
    if log.get("tokens"):
        return int(log["tokens"]), "the server's log"
    return None, None
