"""raystudy: which components of a pretrained Vision Transformer to finetune, and why.

Modules, lowest layer first (a module imports only its own layer or lower ones): errors, paths;
components, models, datasets, batches, augment, plasticity; config; engine (the finetuning
loop), tracking (the MLflow run record), spaces (YAML spaces to trials); trial (the Ray Tune
trainable), pretrain (weights raystudy builds); driver (the package that runs grids and searches
on Ray and writes MLflow from the driver), cli (the argument toolkit); the command lines grid,
search, finetune, probe, prefetch; and __main__, the ``raystudy`` command that runs them by name.
Importing raystudy does nothing else: no Ray, no MLflow, no seeding.
"""

__version__ = "0.1.0"
