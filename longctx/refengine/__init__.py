"""The embedded reference engine: a small MLA decoder behind SGLang's HTTP API.

Real attention over a real paged latent KV cache, on the CPU (or a GPU where torch has one).
Start it with ``python -m longctx.refengine --help``.
"""
