"""longctx.specs: what is served and on what, as plain facts every later stage shares.

- model: ModelSpec (MHA, GQA, MLA): KV bytes and attention FLOPs per token, from a config.json or
  model.architecture; engine-free (the adapters pass the tensor-parallel size and KV dtype).
- hardware: the datasheet table (hardware.yaml, with units and sources) and a device's ceilings,
  datasheet and measured.
- pool: SGLang's KV pool sizing rule, which the reference engine allocates by and the planner tabulates.
"""
