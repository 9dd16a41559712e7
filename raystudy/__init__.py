"""raystudy: which components of a pretrained Vision Transformer to finetune, and why.

Modules: config (strict configs), components (which parameters train), models (timm ViTs),
data (datasets and splits), engine (the finetuning loop), finetune (its CLI), plasticity
(measured plasticity and its bounds), probe (its CLI), tracking (MLflow, exactly once),
trial (the Ray Tune trainable), grid (the study grid), search (Optuna searches).
Importing raystudy does nothing else: no Ray, no MLflow, no seeding.
"""

__version__ = "0.1.0"
