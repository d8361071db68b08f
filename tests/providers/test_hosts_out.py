"""`up` writes its hosts file (./hosts by default) only where none is, or over one it wrote and nobody changed;
a user's file there (an Ansible inventory, /etc/hosts when run from /etc) stops `up` before anything is made."""

from __future__ import annotations

import os
import uuid

import pytest

from clusterctl.cluster import hosts_out
from clusterctl.errors import ConfigError
from clusterctl.hostsfile import HostsFile

INVENTORY = "[webservers]\nweb1.example.com\n\n# the user's own\n"


def test_absent_or_clusterctls_own_is_written_anything_else_refused(tmp_path):
    path = tmp_path / "hosts"
    assert hosts_out.problem(path) is None
    assert hosts_out.write(path, "10.0.0.1 slots=8\n", "c1")
    assert path.read_text() == "10.0.0.1 slots=8\n" and oct(path.stat().st_mode & 0o777) == "0o644"
    assert hosts_out.write(path, "10.0.0.2 slots=8\n", "c2")  # its own, unchanged: written again
    assert path.read_text() == "10.0.0.2 slots=8\n"
    # No marker in the file (horovodrun's parser raises on `#` lines); clusterctl's own parser reads it as it is.
    assert HostsFile.parse(path.read_text()).hosts == ("10.0.0.2",)
    assert hosts_out.sidecar(path).read_text().startswith("sha256 ")
    path.write_text("10.0.0.2 slots=8\n10.0.0.3 slots=8\n")  # the user edited it: theirs now
    with pytest.raises(ConfigError) as info:
        hosts_out.check(path)
    assert "clusterctl did not write it (or it was changed since)" in info.value.one_line()
    assert not hosts_out.write(path, "x slots=1\n", "c3") and path.read_text().endswith("10.0.0.3 slots=8\n")
    link = tmp_path / "linked"
    link.symlink_to(tmp_path / "elsewhere")
    assert hosts_out.problem(link) is not None
    inventory = tmp_path / "inventory" / "hosts"
    inventory.parent.mkdir()
    inventory.write_text(INVENTORY)
    assert hosts_out.problem(inventory) is not None


@pytest.mark.integration
def test_up_refuses_over_a_users_hosts_file_and_makes_nothing(cli):
    from clusterctl.providers.local import netns
    from conftest import require_root

    require_root()
    users = cli.cwd / "hosts"
    users.write_text(INVENTORY)
    os.chmod(users, 0o640)
    name = "h" + uuid.uuid4().hex[:8]
    args = ("up", "--provider", "local", "--name", name, "--nodes", "2", "--yes", "--runtime", "none")
    try:
        proc = cli(*args, timeout=120)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
        assert proc.returncode == 3 and len(errors) == 1, proc.stderr
        assert errors[0].startswith("Error: hosts exists and clusterctl did not write it"), errors
        assert "--hosts-file PATH" in errors[0]
        assert users.read_text() == INVENTORY and users.stat().st_mode & 0o777 == 0o640
        assert netns.leftovers(name).empty and not (cli.home / "clusters" / name / "cluster.json").exists()
        assert "launching" not in proc.stderr
        # The way out the error names, followed: the cluster's hosts file elsewhere; the user's stays.
        proc = cli(*args, "--hosts-file", "cluster-hosts", timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert len((cli.cwd / "cluster-hosts").read_text().splitlines()) == 2
        assert users.read_text() == INVENTORY
    finally:
        cli("down", name, "--yes", timeout=120)  # also what an old `up` made over the user's file
    assert netns.leftovers(name).empty
