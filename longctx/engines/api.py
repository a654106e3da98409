"""The two request/stream formats longctx speaks: SGLang's native /generate and OpenAI /v1/completions."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Api:
    kind: str  # "sglang" | "openai"
    generate_path: str
    health_path: str
    info_paths: tuple[str, ...]  # every one that answers is merged into server_info
    flush_path: str | None  # None: the server has no cache flush; unique prompt prefixes still apply


SGLANG = Api("sglang", "/generate", "/health", ("/server_info", "/get_server_info"), "/flush_cache")
OPENAI = Api("openai", "/v1/completions", "/health", ("/version", "/v1/models"), None)
APIS = {a.kind: a for a in (SGLANG, OPENAI)}
