"""Can the cores feed the GPUs: train_feed's arithmetic and line (pure), and the probe `train` runs on the leader
before a GPU run (the node package's input_rate, the trainer's own pipeline) on a real node with the node runtime."""

from __future__ import annotations

import pytest

from clusterctl.workloads import train_feed


def test_the_arithmetic_and_the_line():
    f = train_feed.feed(64, 95.0, 8, "V100")
    assert f is not None and (f.supply, f.demand) == (6080.0, 10160.0)
    assert f.starves and f.ratio == pytest.approx(0.5984, abs=1e-4)
    line = train_feed.warning(f)
    assert line == (
        "the input pipeline cannot feed the GPUs: 64 vCPUs x 95 img/s per core = 6,080 img/s decoded, "
        "8 V100 x 1,270 img/s = 10,160 img/s needed (NVIDIA's ResNet-50 v1.5 rate, "
        f"{train_feed.EXPECTED['V100'].source}); they would run at most at 60% of their speed: {train_feed.ADVICE}"
    )
    enough = train_feed.feed(48, 95.0, 4, "T4")  # 4,560 decoded against 2,000
    assert enough is not None and not enough.starves and train_feed.warning(enough) is None
    edge = train_feed.feed(10, 127.0, 1, "V100")  # exactly enough: no warning
    assert edge is not None and edge.ratio == 1.0 and train_feed.warning(edge) is None
    # Nothing to judge: a CPU node, a GPU without an expected rate, a probe that measured nothing.
    assert train_feed.feed(8, 95.0, 0, "V100") is None
    assert train_feed.feed(8, 95.0, 1, "K80") is None
    assert train_feed.feed(8, 0.0, 1, "V100") is None
    assert all(e.per_gpu > 0 and e.source for e in train_feed.EXPECTED.values())
    assert set(train_feed.EXPECTED) == {"V100", "T4", "A10G", "L4", "A100", "H100"}


def test_which_runs_train_checks():
    from clusterctl.workloads import train_config

    v100 = train_config.DEFAULTS[train_config.gpu_type("V100")]
    assert train_feed.gpu_to_feed(8, v100.gpu, v100.precision, "/data/imagenet") == "V100"
    assert train_feed.gpu_to_feed(4, train_config.gpu_type("A10G"), "float16", "/data") == "A10G"
    assert train_feed.gpu_to_feed(0, "CPU", "fp32", "/data") == ""  # local nodes and CPU types: no GPUs
    assert train_feed.gpu_to_feed(8, "V100", "float16", None) == ""  # --synthetic: nothing is decoded
    assert train_feed.gpu_to_feed(8, "V100", "fp32", "/data") == ""  # --fp32: slower than the rates judged by
    assert train_feed.gpu_to_feed(8, "unknown", "auto", "/data") == ""  # no expected rate to judge by


def test_the_probes_line_is_read_back():
    assert train_feed.parse_probe("noise\ninput-rate per_core=84.2 cpus=64 images=384\n") == (84.2, 64)
    assert train_feed.parse_probe("input-rate per_core=x cpus=2") is None
    assert train_feed.parse_probe("Traceback (most recent call last):") is None


@pytest.mark.integration
@pytest.mark.horovod
def test_the_leader_times_the_trainers_pipeline_on_the_runs_records(local_cluster_factory):
    """A node with the node runtime: `data synthetic` records synced to it, a job folder and the node package (the
    trainer and the probe) as `train` stages them, and feed_warning asked as for a node of 8 V100s (this machine's cores
    decode far fewer than the 10,400 img/s they would need). Without records the probe says nothing."""
    from clusterctl.cluster import inventory
    from clusterctl.remote import jobfolder, nodepkg
    from clusterctl.remote.ssh import SshPool
    from clusterctl.state import StateStore
    from clusterctl.workloads import train_job

    c = local_cluster_factory(1, 1, runtime=True)
    cli = c.cli
    made = cli(
        "data",
        "synthetic",
        "ds",
        "--images",
        "96",
        "--classes",
        "4",
        "--image-size",
        "256",
        "--train-shards",
        "2",
        "--validation-shards",
        "1",
    )
    assert made.returncode == 0, made.stderr
    synced = cli("sync", str(cli.cwd / "ds"), "/root/ds", timeout=300)
    assert synced.returncode == 0, synced.stderr
    inv = inventory.resolve(None, c.name, StateStore(cli.home))
    python = jobfolder.node_python(inv.cluster)
    folder = "/root/feedjob"
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]  # the job's folder (the probe's working folder) and the package, as `train` stages
        assert pool.run_one(leader, f"mkdir -p {folder}").exit_code == 0 and nodepkg.ship(pool, [leader]).all_ok
        line = train_job.feed_warning(pool, leader, folder, python, "/root/ds", 8, "V100")
        assert line is not None and line.startswith("the input pipeline cannot feed the GPUs: "), line
        assert "8 V100 x 1,270 img/s = 10,160 img/s needed" in line and train_feed.ADVICE in line
        per_core = float(line.split(" x ")[1].split(" img/s")[0].replace(",", ""))
        assert 1 < per_core < 10_000  # a measured rate, not a default
        assert train_job.feed_warning(pool, leader, folder, python, "/root/nothing", 8, "V100") is None
