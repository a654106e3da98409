"""The two request/stream formats longctx speaks: SGLang's native /generate and OpenAI /v1/completions."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Api:
    kind: str  # "sglang" | "openai"
    generate_path: str
    health_paths: tuple[str, ...]  # health probes in order of preference (server.health_path replaces them)
    info_paths: tuple[str, ...]  # every one that answers is merged into server_info
    flush_path: str | None  # None: the server has no cache flush; unique prompt prefixes still apply


SGLANG = Api("sglang", "/generate", ("/health", "/health_generate", "/get_model_info", "/v1/models"),
             ("/server_info", "/get_server_info"), "/flush_cache")
OPENAI = Api("openai", "/v1/completions", ("/health", "/health_generate", "/v1/models"), ("/version", "/v1/models"), None)
APIS = {a.kind: a for a in (SGLANG, OPENAI)}
