"""The study's plan as data: space files and their schema, the grids and searches they expand
to, and the adaptive policy that decides which trials a study needs. No Ray, no MLflow."""
