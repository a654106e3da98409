"""longctx.attention."""
