"""A training launch decided once, pure: `train`'s options resolved against the nodes it runs on (the paths on
the nodes, the GPU type's configuration, the checkpoint copy, the spot notice), then the plan the leader runs:
the processes, the ranks' environment, horovodrun's elastic options and the trainer's argv.

    TrainOptions (the user's)  -> resolve: + node paths, + train/config.py's row, + copy node, + spot poll
                               -> (the input pipeline chosen on the leader: train/start.py)
                               -> plan: TrainPlan (np, env, elastic, argv)  -> train/start.py runs it
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Mapping

from clusterctl.errors import UsageError
from clusterctl.workloads import horovod, launch
from clusterctl.workloads.train import config as train_config
from clusterctl.workloads.train.log import MARK
from clusterctl.workloads.train.options import ELASTIC_TIMEOUT_S, TrainOptions, horovod_env, trainer_argv

if TYPE_CHECKING:
    from clusterctl.hostsfile import HostsFile
    from clusterctl.remote.jobfolder import JobFolder
    from clusterctl.types import Cluster
    from clusterctl.workloads.train.config import TrainConfig

DISCOVERY = (
    "live_hosts"  # the node package's program for an elastic job's host discovery, run by horovodrun on the leader
)
SPOT_POLL_S = 5.0  # EC2 gives two minutes' notice; AWS suggests checking every 5 seconds


def resolve(
    opts: TrainOptions,
    cluster: Cluster | None,
    hosts: HostsFile,
    *,
    data: str | None,
    model_dir: str,
    np: int,
    checkpoint_copy: bool,
) -> tuple[TrainOptions, TrainConfig]:
    """The options as the trainer gets them (but for --input, chosen on the leader), and the GPU type's
    configuration they were filled from: the user's flags over train/config.py's row, what bench measures too."""
    # An elastic job's size changes by design: no --expect-size.
    opts = replace(opts, data=data, model_dir=model_dir, expect_size=None if opts.elastic else np)
    opts, config = train_config.for_train(opts, cluster)
    if checkpoint_copy and opts.checkpoint_copy is None and len(hosts.entries) > 1:
        opts = replace(opts, checkpoint_copy=hosts.entries[1].host)
    if opts.spot_poll is None and cluster is not None and cluster.facts.spot:
        opts = replace(opts, spot_poll=SPOT_POLL_S)
    return opts, config


@dataclass(frozen=True)
class TrainPlan:
    """What the leader runs: the trainer's options, resolved, as its argv under horovodrun."""

    opts: TrainOptions
    np: int  # processes horovodrun starts (an elastic job's first size)
    env: Mapping[str, str]  # every rank's environment
    elastic: horovod.Elastic | None
    argv: tuple[str, ...]  # the trainer's command line

    @property
    def model_dir(self) -> str:
        return self.opts.model_dir or ""  # resolve sets it: the checkpoints' folder on the nodes

    def leader_command(self, job: JobFolder, python: str) -> str:
        return launch.leader_command(job, self.np, self.argv, python, self.env, elastic=self.elastic)


def plan(
    opts: TrainOptions, config: TrainConfig, cluster: Cluster | None, np: int, python: str, job_dir: str, pyz: str
) -> TrainPlan:
    """The plan of a launch of `np` slots from the resolved options (`pyz`: the node package on the nodes)."""
    env = {
        **launch.job_env(cluster, python, opts.allow_socket_transport),
        **train_config.gpu_env(config),
        **horovod_env(opts),
    }
    elastic = None
    if opts.elastic:
        elastic = elastic_args(opts, np, python, job_dir, pyz)
        np = min(np, elastic.max_np)
        env["CLUSTERCTL_EVENT_MARK"] = MARK  # horovodrun's line when too few nodes are left
        # Horovod's own fusion buffer and cycle time: with HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME
        # set, horovod 0.28.1's re-init after a lost peer segfaults (measured on local nodes, gloo).
        for name in horovod_env(opts):
            env.pop(name, None)
    return TrainPlan(opts, np, env, elastic, tuple(trainer_argv(python, pyz, opts)))


def elastic_args(opts: TrainOptions, np: int, python: str, job_dir: str, pyz: str) -> horovod.Elastic:
    """horovodrun's elastic options for a job of `np` slots: --min-np (default 1), --max-np (default the
    slots at launch), the discovery (the node package `pyz`'s program, given the job's hosts file),
    --elastic-timeout."""
    max_np = opts.max_np or np
    min_np = opts.min_np or 1
    if min_np > min(np, max_np):
        raise UsageError(
            f"--min-np {min_np} is more than the {min(np, max_np)} process(es) the job can start with",
            "lower --min-np, or bring more nodes up",
        )
    discovery = shlex.join([python, pyz, DISCOVERY, f"{job_dir}/hosts"])
    timeout = opts.elastic_timeout or ELASTIC_TIMEOUT_S
    return horovod.Elastic(min_np, max_np, discovery, timeout)
