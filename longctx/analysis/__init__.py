"""longctx.analysis."""
