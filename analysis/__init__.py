"""The study's analysis: runs from MLflow (or a CSV) to tables, tests, figures and best configs.

    load      runs → one tidy DataFrame (one row per run); step metrics; plasticity artifacts
    stats     pure functions: best lr, mean ± std over seeds, ranks, lr robustness, tests
    tables    Markdown, CSV and LaTeX writers
    figures   matplotlib figures as PNG and PDF
    report    ``python -m analysis.report``: everything above into one folder (and MLflow)
    export_best  ``python -m analysis.export_best``: the best config of each condition as YAML

Nothing happens at import: no tracking URI, no backend selection.
"""


class AnalysisError(ValueError):
    """Bad or incomplete input; the message is one line that says what is missing."""


__all__ = ["AnalysisError"]
