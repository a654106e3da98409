"""Engine adapters: one per engine, all behind the interface in engines.base."""

from __future__ import annotations

from .base import EngineAdapter
from .configuration import ConfigurationSpec
from .external import ExternalAdapter
from .imported import ImportedAdapter
from .reference import ReferenceAdapter
from .sglang import SGLangAdapter
from .vllm import VLLMAdapter

_ADAPTERS: dict[str, EngineAdapter] = {a.name: a for a in (ReferenceAdapter(), SGLangAdapter(), VLLMAdapter(), ExternalAdapter(), ImportedAdapter())}
ENGINES = tuple(_ADAPTERS)


def get_adapter(engine: str) -> EngineAdapter:
    try:
        return _ADAPTERS[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; allowed values: {', '.join(_ADAPTERS)}") from None


__all__ = ["ENGINES", "ConfigurationSpec", "EngineAdapter", "get_adapter"]
