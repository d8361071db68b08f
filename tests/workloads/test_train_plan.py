"""train/plan.py: `train`'s options resolved once against the nodes, then the launch's plan (pure, no ssh)."""

from __future__ import annotations

from clusterctl.hostsfile import HostsFile
from clusterctl.workloads.train import plan as train_plan
from clusterctl.workloads.train.log import MARK
from clusterctl.workloads.train.options import TrainOptions, horovod_env, trainer_argv

HOSTS = HostsFile.parse("10.0.0.1 slots=2\n10.0.0.2 slots=2\n")


def test_resolve_fills_the_node_paths_the_gpu_row_and_the_copy_node():
    opts, config = train_plan.resolve(
        TrainOptions(data="~/imagenet"),
        None,
        HOSTS,
        data="/root/imagenet",
        model_dir="/root/clusterctl-train/model",
        np=4,
        checkpoint_copy=True,
    )
    assert (opts.data, opts.model_dir, opts.expect_size) == ("/root/imagenet", "/root/clusterctl-train/model", 4)
    assert opts.checkpoint_copy == "10.0.0.2"  # the second node keeps a copy of every checkpoint
    assert (opts.precision, opts.batch_size) == (config.precision, config.batch_size)  # the row, filled in
    assert opts.spot_poll is None  # no cluster: no spot notice to poll
    again, _ = train_plan.resolve(
        opts, None, HOSTS, data=opts.data, model_dir="/m", np=4, checkpoint_copy=False
    )  # idempotent but for what is given again
    assert (again.batch_size, again.checkpoint_copy, again.model_dir) == (opts.batch_size, "10.0.0.2", "/m")


def test_the_plan_is_the_trainer_s_argv_under_horovod_s_environment():
    opts, config = train_plan.resolve(
        TrainOptions(synthetic=True), None, HOSTS, data=None, model_dir="/m", np=4, checkpoint_copy=False
    )
    plan = train_plan.plan(opts, config, None, 4, "/opt/py", "/root/clusterctl-jobs/train-1", "/root/n.pyz")
    assert plan.argv == tuple(trainer_argv("/opt/py", "/root/n.pyz", opts))
    assert plan.np == 4 and plan.elastic is None and plan.model_dir == "/m"
    assert {k: plan.env[k] for k in horovod_env(opts)} == horovod_env(opts)
    assert "--expect-size" in plan.argv and "CLUSTERCTL_EVENT_MARK" not in plan.env


def test_an_elastic_plan_has_no_fixed_size_no_fusion_settings_and_starts_at_most_max_np():
    opts, config = train_plan.resolve(
        TrainOptions(synthetic=True, elastic=True, max_np=3),
        None,
        HOSTS,
        data=None,
        model_dir="/m",
        np=4,
        checkpoint_copy=False,
    )
    plan = train_plan.plan(opts, config, None, 4, "/opt/py", "/j", "/p.pyz")
    assert opts.expect_size is None and "--expect-size" not in plan.argv
    assert plan.elastic is not None and (plan.np, plan.elastic.min_np, plan.elastic.max_np) == (3, 1, 3)
    assert plan.env["CLUSTERCTL_EVENT_MARK"] == MARK
    assert not set(horovod_env(opts)) & set(plan.env)  # horovod 0.28.1's re-init segfaults with them set
    assert "/opt/py /p.pyz live_hosts /j/hosts" == plan.elastic.discovery
