"""Can the cores feed the GPUs: train_feed's arithmetic and line (pure), and the probe `train` runs on the leader
before a GPU run (the node package's input_rate, the trainer's own pipeline) on a real node with the node runtime."""

from __future__ import annotations

import re

import pytest

from clusterctl.workloads.train import feed as train_feed


def test_the_arithmetic_and_the_lines():
    # p3.16xlarge: 32 physical cores delivering 6,080 img/s all together, 8 V100s needing 10,160
    f = train_feed.feed(32, 6080.0, 8, "V100")
    assert f is not None and (f.supply, f.demand, f.path) == (6080.0, 10160.0, "tf.data")
    assert f.starves and f.ratio == pytest.approx(0.5984, abs=1e-4)
    probe = train_feed.Probe(6080.0, ranks=8, threads=8, cores=32, cpus=64)
    assert probe.per_core == 190.0  # per physical core, both hardware threads busy
    assert train_feed.input_line(probe, f) == "input: tf.data on 32 cores, 6,080 img/s for 10,160 needed"
    assert train_feed.warning(f) == (
        "the input pipeline cannot feed the GPUs: tf.data on 32 cores, 6,080 img/s for 10,160 needed "
        "(8 V100 x 1,270 img/s) (NVIDIA's ResNet-50 v1.5 rate, "
        f"{train_feed.EXPECTED['V100'].source}); they would run at most at 60% of their speed: {train_feed.ADVICE}"
    )
    enough = train_feed.feed(24, 4560.0, 4, "T4")  # 4,560 decoded against 2,000
    assert enough is not None and not enough.starves and train_feed.warning(enough) is None
    edge = train_feed.feed(10, 1270.0, 1, "V100")  # exactly enough: no warning
    assert edge is not None and edge.ratio == 1.0 and train_feed.warning(edge) is None
    # Nothing to judge: a CPU node, a GPU without an expected rate, a probe that measured nothing.
    assert train_feed.feed(8, 95.0, 0, "V100") is None
    assert train_feed.feed(8, 95.0, 1, "K80") is None
    assert train_feed.feed(8, 0.0, 1, "V100") is None
    cpu = train_feed.Probe(310.4, ranks=1, threads=2, cores=1, cpus=2)
    assert train_feed.input_line(cpu, None) == (
        "input: tf.data on 1 core, 310 img/s (1 rank(s) here; no GPU rate to compare with)"
    )
    assert all(e.per_gpu > 0 and e.source for e in train_feed.EXPECTED.values())
    assert set(train_feed.EXPECTED) == {"V100", "T4", "A10G", "L4", "A100", "H100"}


def test_cores_from_describe_instance_types_else_the_catalog():
    from clusterctl.providers.aws import catalog

    info = {"DefaultVCpus": 64, "DefaultCores": 32, "DefaultThreadsPerCore": 2}
    assert catalog.cpus_of(info, "x9.big") == catalog.Cpus(64, 32, 2)
    assert catalog.cpus_of({"DefaultVCpus": 8, "DefaultCores": 8}, "x9.big") == catalog.Cpus(8, 8, 1)
    assert catalog.cpus_of({"DefaultVCpus": 64}, "p3.16xlarge") == catalog.Cpus(64, 32, 2)  # the table's
    assert catalog.cpus_of({}, "x9.big") is None
    # every row: vCPUs are cores x threads, and every GPU type of the table has its cores
    assert all(c.vcpus == c.cores * c.threads_per_core for c in catalog.CPUS.values())
    assert {t for t, n in catalog.GPUS.items() if n} >= set(catalog.CPUS)


def test_which_runs_train_checks():
    from clusterctl.workloads.train import config as train_config

    v100 = train_config.DEFAULTS[train_config.gpu_type("V100")]
    assert train_feed.gpu_to_feed(8, v100.gpu, v100.precision, "/data/imagenet") == "V100"
    assert train_feed.gpu_to_feed(4, train_config.gpu_type("A10G"), "float16", "/data") == "A10G"
    assert train_feed.gpu_to_feed(0, "CPU", "fp32", "/data") == ""  # local nodes and CPU types: no GPUs
    assert train_feed.gpu_to_feed(8, "V100", "float16", None) == ""  # --synthetic: nothing is decoded
    assert train_feed.gpu_to_feed(8, "V100", "fp32", "/data") == ""  # --fp32: slower than the rates judged by
    assert train_feed.gpu_to_feed(8, "unknown", "auto", "/data") == ""  # no expected rate to judge by


def test_the_probes_line_is_read_back():
    line = "noise\ninput-rate images_per_sec=842.5 ranks=8 threads=8 cores=32 cpus=64 images=8448 path=tf.data\n"
    assert train_feed.parse_probe(line) == train_feed.Probe(842.5, 8, 8, 32, 64, "tf.data")
    assert train_feed.parse_probe("input-rate images_per_sec=x ranks=1 threads=2 cores=1 cpus=2") is None
    assert train_feed.parse_probe("input-rate per_core=84.2 cpus=64 images=384") is None  # not this probe's
    assert train_feed.parse_probe("Traceback (most recent call last):") is None


@pytest.mark.integration
@pytest.mark.horovod
def test_the_leader_times_the_trainers_pipeline_on_the_runs_records(local_cluster_factory):
    """A node with the node runtime: `data synthetic` records synced to it, a job folder and the node package (the
    trainer and the probe) as `train` stages them, and feed_check asked as for a node of 8 V100s running 2 ranks
    (this machine's cores decode far fewer than the 10,160 img/s they would need). Without records the probe
    says nothing."""
    from clusterctl.cluster import inventory
    from clusterctl.remote import jobfolder, nodepkg
    from clusterctl.remote.ssh import SshPool
    from clusterctl.state import StateStore
    from clusterctl.workloads.train import start as train_start
    from clusterctl.workloads.train.options import TrainOptions

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
    opts = TrainOptions(data="/root/ds", batch_size=8)
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]  # the job's folder (the probe's working folder) and the package, as `train` stages
        assert pool.run_one(leader, f"mkdir -p {folder}").exit_code == 0 and nodepkg.ship(pool, [leader]).all_ok
        fed, lines = train_start.feed_check(pool, leader, folder, python, opts, 2, 8, "V100")
        assert len(lines) == 1 and fed is not None and fed.starves, (fed, lines)
        m = re.fullmatch(r"input: tf\.data on (\d+) cores?, ([\d,]+) img/s for 10,160 needed", lines[0])
        assert m and int(m.group(1)) >= 1, lines
        assert 1 < int(m.group(2).replace(",", "")) < 10_160  # a measured rate, not a default
        warning = train_feed.warning(fed) or ""
        assert warning.startswith("the input pipeline cannot feed the GPUs: tf.data on "), warning
        assert "(8 V100 x 1,270 img/s)" in warning and train_feed.ADVICE in warning
        gone = TrainOptions(data="/root/nothing")
        assert train_start.feed_check(pool, leader, folder, python, gone, 1, 8, "V100") == (None, [])


def test_without_a_gpu_rate_the_feed_is_not_timed():
    """CPU nodes (and --fp32): no rate to judge the figure by, so `train` does not spend its start timing the
    pipeline; it says which input it uses and why."""
    from clusterctl.workloads.train import start as train_start
    from clusterctl.workloads.train.options import TrainOptions

    class NoSsh:
        def __getattr__(self, name):
            raise AssertionError(f"the feed was probed over ssh ({name})")

    said: list[str] = []
    feeding = train_start.Feeding(NoSsh(), NoSsh(), "/root/job", "python3", 2, 0, "")  # type: ignore[arg-type]
    chosen = feeding.choose(TrainOptions(data="/root/ds"), "/root/ds", False, said.append)
    assert chosen == "tfdata" and said == ["input: tf.data (auto: no GPUs to decode on)"], said
