"""What a training run costs, as lines for the CLI (bench.cost_lines is the same for the ladder): the estimate
when it starts, from the img/s `bench` measured on this cluster for the same configuration (train/config.py:
model, precision, batch, XLA, compression) and the images to train (the
dataset's count x epochs, or --max-steps), and what the run cost when it ends."""

from __future__ import annotations

from typing import Any

from clusterctl.cluster import costs
from clusterctl.state import StateStore
from clusterctl.units import duration, money


def estimate_line(store: StateStore, inv: Any, job: Any, opts: Any) -> str:
    """`inv`: the job's inventory (the leader first: the dataset's count is read there, over ssh); `job`: the
    launched job, whose options carry the configuration it runs (train/config.py). Only a rate `bench`
    measured for that same configuration is used; without one the line says so and how to measure it."""
    from clusterctl.workloads.train import config as train_config

    per_hour = costs.hourly(inv.cluster)
    _, config = train_config.for_train(job.options, inv.cluster)
    measured = costs.load_measured(store, inv.cluster.name, config.key()) if inv.cluster is not None else None
    if measured is None:
        return (
            f"cost: {money(per_hour)}/hour; no img/s measured on this cluster for this configuration "
            f"({config.key()}) yet (`clusterctl bench --synthetic {bench_flags(config)}` measures it; "
            "`clusterctl status` shows the cost to finish once the job runs)"
        )
    images, what = None, ""
    if opts.max_steps:
        images, what = opts.max_steps * config.batch_size * job.np, f"{opts.max_steps} step(s)"
    elif job.options.data:
        from clusterctl.workloads.train import job as train_job

        per_epoch = train_job.dataset_examples(inv, job.options.data)
        if per_epoch:
            images, what = int(per_epoch * opts.epochs), f"{opts.epochs:g} epoch(s) of {per_epoch:,} images"
    if images is None:
        images, what = int(costs.IMAGENET_TRAIN_IMAGES * opts.epochs), f"{opts.epochs:g} ImageNet-sized epoch(s)"
    rate = float(measured["img_per_sec"]) * job.np / max(1, int(measured.get("np") or job.np))
    return (
        f"cost: estimated {costs.epoch_line(rate, per_hour, images, 1.0, what)} (from the "
        f"{float(measured['img_per_sec']):,.0f} img/s `bench` measured at {measured.get('np')} process(es) "
        f"for {config.key()}, scaled linearly; `clusterctl status` shows the cost to finish from the job's "
        "own rate)"
    )


def bench_flags(config: Any) -> str:
    """The `bench` flags that measure `config` on its GPU type (the table's fields need none)."""
    from clusterctl.workloads.train import config as train_config

    flags = [f"--model {config.model}"]
    if config.precision != train_config.choose(config.gpu).precision:
        flags.append(f"--precision {config.precision}")
    row = train_config.choose(config.gpu, precision=config.precision)  # what bench runs with those flags
    if config.batch_size != row.batch_size:
        flags.append(f"--batch-size {config.batch_size}")
    if config.xla != row.xla:
        flags.append("--xla" if config.xla else "--no-xla")
    if config.fp16_allreduce != row.fp16_allreduce:
        flags.append("--fp16-allreduce" if config.fp16_allreduce else "--no-fp16-allreduce")
    return " ".join(flags)


def run_line(seconds: float, per_hour: float | None) -> str:
    """After `train --wait`: how long the run took and, on a priced cluster, what it cost."""
    return f"cost: this run took {duration(seconds)}" + (
        f" on a {money(per_hour)}/hour cluster: about {money(costs.run_cost(seconds, per_hour))}"
        if per_hour is not None
        else ""
    )
