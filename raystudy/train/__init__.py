"""One trial: its strict config, the finetuning loop, the Tune trainable, and the weights
raystudy builds itself."""
