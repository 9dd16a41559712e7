"""The MLflow record of a study: its names (``tags``), the store (``connect``), the runs written
(``record``), read back (``query``) and shown in the UI (``views``)."""
