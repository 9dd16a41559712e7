"""Pure statistics, one concern a module: the lr choice and the tables (``selection``), paired
tests (``paired``), omnibus and post-hoc tests (``significance``), effect sizes (``effects``),
tuning budget (``budget``), variance (``variance``), plasticity pooled over pairs (``pooling``)."""
