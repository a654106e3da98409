"""longctx.report."""
