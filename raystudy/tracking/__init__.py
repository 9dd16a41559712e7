"""The MLflow record of a study: its names (``tags``), the store (``connect``), the runs written
(``record``; ``recorder``: a single finetuning run as it goes), read back (``query``) and shown in
the UI (``views``)."""
