"""The study's analysis: runs from MLflow (or a CSV) to tables, tests, figures and best configs.

    load      runs → one tidy DataFrame (one row per run); step metrics; plasticity artifacts
    stats     pure functions: best lr, mean ± std over seeds, ranks, lr robustness, tests,
              effect sizes, tuning budget, variance decomposition
    intervals stratified-bootstrap intervals, probability of improvement (rliable's manner)
    bayes     Bayesian signed-rank and hierarchical tests with a ROPE (baycomp's models)
    trust     the report's sections built on intervals and bayes
    synthetic a made-up study in the runs-table layout, for tests and benchmarks
    tables    Markdown, CSV and LaTeX writers
    figures   matplotlib figures as PNG and PDF
    study     the study a report describes, built and checked once (frozen)
    sections  the report's sections: each a function of the study, returning Markdown, tables
              and figures and writing nothing
    output    a section's outputs as data, and the one writer that puts them on disk
    agreement what a set of runs concludes (lr per cell, ranking, calls) and whether another agrees
    floor     how far reseeding the full grid moves those conclusions; the verdict on a policy's replay
    recordings  a recorded grid as one compact file, so a replay runs from a clone
    scores    what the trust sections are computed from (the study holds it): scores, options
    best_config  the best config of each condition as YAML that reruns as it is
    replaying what an adaptive policy would have spent on a finished grid, and concluded
    reporting everything above into one folder (and MLflow)
    commands  the command lines: ``raystudy report``, ``raystudy export``, ``raystudy replay``

Nothing happens at import: no tracking URI, no backend selection.
"""


class AnalysisError(ValueError):
    """Bad or incomplete input; the message is one line that says what is missing."""


__all__ = ["AnalysisError"]
