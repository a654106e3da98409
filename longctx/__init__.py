"""longctx: how an LLM inference deployment behaves as the context grows, and why."""

__version__ = "0.1.0"
