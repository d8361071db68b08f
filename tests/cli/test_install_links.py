"""install.sh links the venv's clusterctl and horovodrun into a bin folder only where no other program of that
name is (its own older links are replaced), and otherwise says where they are: `install.sh links` with
CLUSTERCTL_BIN_DIR and CLUSTERCTL_VENV pointed at folders of the test."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import REPO

SCRIPT = "#!/usr/bin/env python3\nimport sys\nfrom clusterctl.cli.app import main\nsys.exit(main())\n"


def _venv(root: Path) -> Path:
    """A venv's bin folder as pip leaves it: clusterctl's entry point and horovodrun."""
    bin_ = root / "bin"
    bin_.mkdir(parents=True)
    for name, text in (("clusterctl", SCRIPT), ("horovodrun", "#!/bin/sh\necho horovodrun\n")):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    return root


def _links(tmp_path: Path, venv: Path, bin_: Path, *path: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "CLUSTERCTL_VENV": str(venv),
        "CLUSTERCTL_BIN_DIR": str(bin_),
        "PATH": ":".join([str(bin_), *map(str, path), "/usr/bin", "/bin"]),
    }
    return subprocess.run(
        ["bash", str(REPO / "install.sh"), "links"], env=env, capture_output=True, text=True, timeout=60
    )


def test_links_go_where_nothing_else_is_and_replace_only_its_own(tmp_path):
    venv, bin_ = _venv(tmp_path / "venv"), tmp_path / "bin"
    bin_.mkdir()
    old = _venv(tmp_path / "old-venv")
    (bin_ / "clusterctl").symlink_to(old / "bin" / "clusterctl")  # an older install's link
    (bin_ / "horovodrun").symlink_to(tmp_path / "gone" / "horovodrun")  # a link to nothing
    proc = _links(tmp_path, venv, bin_)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    for name in ("clusterctl", "horovodrun"):
        assert os.readlink(bin_ / name) == str(venv / "bin" / name)


def test_another_program_of_that_name_is_left_alone_and_the_message_says_where_ours_is(tmp_path):
    venv, bin_, other = _venv(tmp_path / "venv"), tmp_path / "bin", tmp_path / "other"
    bin_.mkdir()
    other.mkdir()
    capi = "#!/bin/sh\necho 'clusterctl version: v1.7.0 (Cluster API)'\n"
    (bin_ / "clusterctl").write_text(capi)  # Kubernetes Cluster API's clusterctl, in the bin folder itself
    (bin_ / "clusterctl").chmod(0o755)
    (other / "horovodrun").write_text("#!/bin/sh\n")  # the user's own Horovod, elsewhere on PATH
    (other / "horovodrun").chmod(0o755)
    proc = _links(tmp_path, venv, bin_, other)
    assert proc.returncode == 0, proc.stderr
    assert (bin_ / "clusterctl").read_text() == capi and not (bin_ / "clusterctl").is_symlink()
    assert not (bin_ / "horovodrun").exists()
    lines = proc.stdout.splitlines()
    assert lines == [
        f"== clusterctl: not linked into {bin_}: another program of that name is there or on PATH "
        f"({bin_}/clusterctl); this one is {venv}/bin/clusterctl (add {venv}/bin to PATH)",
        f"== horovodrun: not linked into {bin_}: another program of that name is there or on PATH "
        f"({other}/horovodrun); this one is {venv}/bin/horovodrun (add {venv}/bin to PATH)",
    ], proc.stdout
