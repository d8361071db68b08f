"""The node scripts' pre-connected hops (issue 18: a chain's hops opened at once, not one after another)."""

import shlex
import subprocess

from clusterctl.data import node_scripts
from clusterctl.remote import openssh


def test_preconnected_hops_go_through_their_master_and_close_it():
    hop = openssh.node_ssh("root", 22, managed=True)
    kids = ["10.0.0.3", "odd 'host'"]
    work = ".clusterctl/sync/a b"
    pre = node_scripts.preconnect_script(kids, hop, work)
    for i, kid in enumerate(kids):  # one master per child, pinned like every hop, backgrounded once logged in
        assert f'-M -S "$W/mux.{i}" -o ControlPersist={node_scripts.MUX_IDLE} -f -N -- {shlex.quote(kid)}' in pre
    assert "StrictHostKeyChecking=yes" in pre and "UserKnownHostsFile=~/.ssh/known_hosts" in pre
    assert f'W="$HOME"/{shlex.quote(work)}' in pre
    subprocess.run(["bash", "-n"], input=pre, text=True, check=True)
    text = node_scripts.relay_script(0, "/data", kids, hop, work, mux=True).decode()
    for i, kid in enumerate(kids):
        assert f'-S "$W/mux.{i}" -- {shlex.quote(kid)} ' in text  # the relay's hop: a session on the master
        assert f'-S "$W/mux.{i}" -O exit -- {shlex.quote(kid)}' in text  # and the master goes with the relay
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    plain = node_scripts.relay_script(0, "/data", kids, hop, work).decode()
    assert "mux" not in plain  # two nodes: no master (its round trip would cost more than it saves)
