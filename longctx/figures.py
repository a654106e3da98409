"""Names of the report's figures (light: the workflow reads them when it parses its rules)."""

FIGURES = ("ttft", "decode_rate", "step_time", "acceptance", "itl_depth")
FORMATS = ("pdf", "png")
