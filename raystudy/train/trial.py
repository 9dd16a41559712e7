"""One trial on a Ray worker: the Tune function trainable for every condition.

``run_trial`` runs the finetuning loop in the trial itself (one GPU, or a fraction, or CPU), or,
when the trial asks for several workers (ViT-H), launches a ``TorchTrainer`` with DDP workers
from inside the trial, the interop pattern of Ray 2.5x/2.60 (``Tuner(TorchTrainer)`` is gone).
The same loop, ``engine.train``, runs in both. Checkpoints go through Tune (or Train) to the
run's storage path, so a retried trial continues from its last evaluation, not from step 0.

Workers never touch MLflow: the driver records what they report (``raystudy.driver.records``).
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

from ray import tune

from raystudy.train.config import from_dict
from raystudy.train.report import Reporter

# torch and the loop are imported where a trial runs: the driver imports this module for
# ``run_trial`` and needs neither (seconds of CPU in every grid and search).

STATE_FILE = "state.pt"


def _save_state(state: dict, folder: str) -> None:
    import torch

    torch.save(state, Path(folder) / STATE_FILE)


def _load_state(checkpoint) -> dict | None:
    """A checkpoint's state: tensors and plain types only (``weights_only``), so a file planted
    in shared storage cannot run code when a trial resumes from it."""
    import pickle

    import torch

    if checkpoint is None:
        return None
    with checkpoint.as_directory() as d:
        path = Path(d) / STATE_FILE
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise RuntimeError(
                f"checkpoint {checkpoint.path}/{STATE_FILE} holds more than tensors and "
                f"plain types; refusing to load it ({str(e).splitlines()[0]})"
            ) from None


# A preemption notice: SIGTERM to the worker (a spot node's shutdown reaches every process).
NOTICE = threading.Event()
_TRAINING = threading.Event()
_ray_handler = None


def _on_sigterm(signum, frame):
    NOTICE.set()
    if not _TRAINING.is_set() and callable(_ray_handler):  # no trial to save: exit as Ray would
        _ray_handler(signum, frame)


class _Notice:
    """Mixed into the trainable: in the worker's main thread (the only one that may set a signal
    handler; the trial itself runs in another), SIGTERM asks the running trial to checkpoint its
    current step and stop (``engine.train``'s ``stop``), instead of Ray's immediate exit."""

    def setup(self, config):
        """Install the SIGTERM handler (main thread only), then set the trainable up."""
        global _ray_handler
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is not _on_sigterm
        ):
            _ray_handler = signal.signal(signal.SIGTERM, _on_sigterm)
        super().setup(config)


def run_trial(tune_config: dict[str, Any]) -> None:
    """The Tune trainable: ``tune_config["trial"]`` is one trial (``key``, the flat ``finetune``
    config, resources); the rest says how to run it (threads, checkpoint interval, storage).

    It never touches MLflow: the driver launches only keys not yet done, and if a restored
    experiment reruns a trial that had already finished, the driver's callback finds the key
    done and records nothing (compute spent twice, never a second run). Keeping MLflow out of
    the workers saves each of them the import and the store's start-up.
    """
    import torch

    from raystudy.train import engine
    from raystudy.train.plan import resolve

    trial = tune_config["trial"]
    torch.set_num_threads(max(1, int(tune_config.get("threads", 1))))
    cfg = from_dict(trial["finetune"])
    if trial.get("workers", 1) > 1:
        _run_ddp(trial, tune_config)  # rank 0's final results reach Tune through TuneReportCallback
        return
    # What the trial is (model, inputs, data, condition, optimizer), resolved once for the loop.
    plan = resolve(cfg)
    resume = _load_state(tune.get_checkpoint())
    reporter = Reporter(tune.report, tune.Checkpoint, float(tune_config.get("checkpoint_every_s", 0)), _save_state)
    _TRAINING.set()
    try:
        results = engine.train(plan, report=reporter, resume=resume, stop=NOTICE.is_set)
    finally:
        _TRAINING.clear()
    reporter.final({**results, "resumed_from": resume["step"] if resume else 0})


run_trial.__mixins__ = (_Notice,)


def _ddp_loop(loop_config: dict[str, Any]) -> None:
    """Each DDP worker of the TorchTrainer: the same engine.train, reporting through Ray Train."""
    import ray.train

    from raystudy.train import engine
    from raystudy.train.plan import resolve

    plan = resolve(from_dict(loop_config["finetune"]))
    resume = _load_state(ray.train.get_checkpoint())
    rank = ray.train.get_context().get_world_rank()
    workers_at = _workers_at()

    def report(metrics, **kw):  # where every worker runs travels with rank 0's reports (the run's worker tag)
        ray.train.report({**metrics, "workers_at": workers_at}, **kw)

    # Every worker reports (Train's collective); only rank 0 saves and carries the checkpoint
    # (the others' copies of a ViT-H state would be written to disk and dropped).
    reporter = Reporter(
        report,
        ray.train.Checkpoint if rank == 0 else None,
        float(loop_config.get("checkpoint_every_s", 0)),
        _save_state,
    )
    results = engine.train(plan, report=reporter, resume=resume)
    reporter.final({**results, "resumed_from": resume["step"] if resume else 0})


def _workers_at() -> str:
    """``ip:pid`` of every DDP worker in rank order, comma-separated (gathered over the process group)."""
    import os

    import ray
    import torch.distributed as dist

    everyone: list[str | None] = [None] * dist.get_world_size()
    # over gloo whatever the trial's backend: NCCL gathers objects through a CUDA device per rank
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    dist.all_gather_object(everyone, f"{ray.util.get_node_ip_address()}:{os.getpid()}", group=group)
    if group is not None:
        dist.destroy_process_group(group)
    return ",".join(map(str, everyone))


# How a multi-worker trial's DDP workers are placed (Ray Train's default): soft, each worker on one
# node, the workers on as many nodes as it takes. The driver's placement check reads it.
WORKER_PLACEMENT = "PACK"


def worker_bundle(trial: dict[str, Any]) -> dict[str, float]:
    """One DDP worker's Ray resources: its ``cpu`` CPUs, and a whole GPU where the trial asks for GPUs."""
    if trial.get("gpu", 0) > 0:
        return {"CPU": float(trial["cpu"]), "GPU": 1.0}
    return {"CPU": float(trial["cpu"])}


def _run_ddp(trial: dict[str, Any], tune_config: dict[str, Any]) -> None:
    """Launch a TorchTrainer from inside the Tune trial; its reports become the trial's.

    The run is named by the trial key under the grid's storage path, so a retried trial's
    TorchTrainer finds its own earlier checkpoints and resumes from them.
    """
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from raystudy.train import network

    use_gpu = trial.get("gpu", 0) > 0
    trainer = TorchTrainer(
        _ddp_loop,
        train_loop_config={
            "finetune": trial["finetune"],
            "checkpoint_every_s": tune_config.get("checkpoint_every_s", 0),
        },
        scaling_config=ray.train.ScalingConfig(
            num_workers=trial["workers"],
            use_gpu=use_gpu,
            resources_per_worker=worker_bundle(trial),
            placement_strategy=WORKER_PLACEMENT,
        ),
        run_config=ray.train.RunConfig(
            name=f"ddp-{trial['key']}",
            storage_path=tune_config["storage_path"],
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=0),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1),
        ),
        # on several hosts the workers' process group forms over each node's Ray address
        torch_config=network.torch_config(),
    )
    trainer.fit()
