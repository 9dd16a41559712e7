"""The report's sections, each a function of the ``analysis.study.Study``: the answer, its
stability, the paper's tables and tests (``paper``, which lists them all in order), and the
statistics past p-values (``trust``)."""
