"""longctx.measure."""
