"""longctx.specs."""
