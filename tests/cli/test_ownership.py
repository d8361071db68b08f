"""A local cluster belongs to the CLUSTERCTL_HOME that made it: `gc`, `down --all`, `down NAME` and a failed `up` of
the same name from another home leave it alone (its namespaces, its autostop supervisor, its data), and --force
asks first, naming whose it is.

Other local clusters of this machine (other homes') show up in these listings too: they are kept like Alice's.
"""

from __future__ import annotations

import os
import uuid

import pytest

from conftest import Cli

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def alice(module_cluster_factory):
    """Alice's cluster, with autostop (so a host-side supervisor runs for it) and a file on its leader."""
    c = module_cluster_factory(2, 1, ("--idle-stop", "30m"))
    c.node_exec(0, "sh", "-c", "echo alice-data > /root/precious.txt")
    return c


def _intact(c) -> None:
    from clusterctl.providers.local import netns, supervisor

    assert len(netns.cluster_netns(c.name)) == 2
    assert supervisor.supervisors(c.name), "Alice's autostop supervisor was killed"
    proc = c.cli("run", "--cluster", c.name, "cat /root/precious.txt 2>/dev/null || hostname")
    assert proc.returncode == 0 and f"{c.hosts[0]}: alice-data" in proc.stdout, proc.stdout + proc.stderr


def test_another_home_s_gc_and_down_all_keep_alice_s_cluster(alice, tmp_path):
    from clusterctl.providers.local import netns

    home = os.path.realpath(alice.cli.home)
    bob = Cli(tmp_path / "bob-home", tmp_path)
    # Bob's gc, without --yes: it lists, keeps Alice's as another owner's (naming her home), asks for nothing of hers
    gc = bob("gc", "--provider", "local")
    row = next((line for line in gc.stdout.splitlines() if line.strip().startswith(alice.name)), "")
    assert "kept (another owner's" in row, gc.stdout + gc.stderr
    assert f"{alice.name} of " in gc.stderr and home in gc.stderr, gc.stderr
    assert "nothing of yours to remove" in gc.stderr or "needs confirmation" in gc.stderr, gc.stderr

    # Bob's own cluster, then his gc --yes and down --all --yes: his goes, Alice's stays whole
    mine = "b" + uuid.uuid4().hex[:8]
    up = bob("up", "--provider", "local", "--name", mine, "--nodes", "1", "--runtime", "none", "--yes", timeout=120)
    assert up.returncode == 0, up.stderr
    try:
        gc = bob("gc", "--provider", "local", "--yes")
        assert gc.returncode == 0, gc.stdout + gc.stderr
        assert f"cluster {mine} (local) is gone" in gc.stderr and not netns.cluster_netns(mine)
        assert f"cluster {alice.name} (local) is gone" not in gc.stderr
        _intact(alice)

        up = bob("up", "--provider", "local", "--name", mine, "--nodes", "1", "--runtime", "none", "--yes", timeout=120)
        assert up.returncode == 0, up.stderr
        down = bob("down", "--all", "--provider", "local", "--yes")
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"cluster {alice.name}: kept (local cluster {alice.name} belongs to another owner" in down.stderr
        assert home in down.stderr and not netns.cluster_netns(mine)
        _intact(alice)
    finally:
        bob("down", mine, "--yes", timeout=120)
    assert not netns.cluster_netns(mine)


def test_another_home_s_down_name_is_refused_and_force_asks_naming_the_owner(alice, tmp_path):
    home = os.path.realpath(alice.cli.home)
    bob = Cli(tmp_path / "bob-home", tmp_path)
    down = bob("down", alice.name, "--yes")
    errors = [line for line in down.stderr.splitlines() if line.startswith("Error:")]
    assert down.returncode == 2 and len(errors) == 1, down.stderr
    assert "belongs to another owner" in errors[0] and home in errors[0] and "--force" in errors[0], errors
    # --force without --yes (no terminal): the question names whose it is, and nothing is removed
    down = bob("down", alice.name, "--force")
    assert down.returncode == 2 and "needs confirmation" in down.stderr, down.stderr
    assert f"{alice.name} (owner " in down.stderr and home in down.stderr, down.stderr
    gc = bob("gc", "--provider", "local", "--force")
    assert gc.returncode == 2 and "needs confirmation" in gc.stderr, gc.stderr
    assert f"{alice.name} (owner " in gc.stderr and home in gc.stderr, gc.stderr
    _intact(alice)


def test_an_up_of_a_name_another_home_holds_rolls_back_without_touching_it(alice, tmp_path):
    bob = Cli(tmp_path / "bob-home", tmp_path)
    up = bob("up", "--provider", "local", "--name", alice.name, "--nodes", "1", "--runtime", "none", "--yes")
    assert up.returncode != 0 and "already has namespaces" in up.stderr, up.stderr
    assert "removed namespace" not in up.stderr
    _intact(alice)
