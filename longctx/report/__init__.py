"""longctx.report: the last stage, the report from the data files (PDF, its Markdown twin, a plan's Results section).

- context: what every rendering shares: `ReportInputs` (the data files, baseline, configuration),
  `context` (what the report shows), the version record, and rendering a template in a Jinja environment.
- dialect: `Dialect`, how a rendering writes values (escaping, missing values, numbers, intervals), and
  the Jinja filters and finalize hook built from it.
- latex: the TeX dialect and environment, `render_report` (the .tex), `build_pdf` (latexmk), and
  tracing a LaTeX error to its template line.
- markdown: the Markdown dialect, `render_twin` (report/longctx.md) and `plan_section`.
- numbers: how each kind of number is written (digits, grouping, intervals), in every rendering alike.
- diagnosis, headline: the sentences and the headline table the summary shows.
- versions: report versions (hash, number, log, comparison with the previous one).
- plans: attaching the Results section to a plan document.
- figures: the figures (measured, analysis; style: what they share); its __init__ only names them and
  their formats, for the workflow to read when it parses its rules.

Kept light: importing this package imports none of its modules.
"""
