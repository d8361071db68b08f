"""clusterctl's autostop watchdog: power the cluster off when it has been idle, or up, for too long.

Standard library only. On AWS every node runs it from the user data's archive (the node package's watchdog
alone, remote/nodepkg.py) as the systemd unit clusterctl-autostop, and a shutdown stops or terminates the
instance; on the local provider it runs from the node package inside the leader node and a host-side
supervisor removes the cluster.

  python3 PYZ watchdog run --dir DIR        watch; power off when idle (--idle-stop) or too old (--max-lifetime)
  python3 PYZ watchdog probe                this node's activity as one JSON line (what `run` asks every node)
  python3 PYZ watchdog status --dir DIR     settings, state and time left as one JSON line
  python3 PYZ watchdog keep --dir DIR --for S    no stop of any kind before now + S seconds
  python3 PYZ watchdog lease --dir DIR --id ID --for S [--what TEXT]   busy until now + S (renewed while it runs)
  python3 PYZ watchdog release --dir DIR --id ID                       that lease ends now
  python3 PYZ watchdog off|on --dir DIR     disable / enable

DIR holds config.json (written by clusterctl: the settings), state.json (written here at every check),
watchdog.log (why it fired), leases/ID.json (one per long clusterctl operation that runs: sync, launch)
and, once it fired, fired.json.

Busy means, when ANY of these says so (rules.py's busy_reasons decides, a pure function of the samples):
  * a live process in a tmux session clusterctl started (`run --detach`, `train`, `launch`, `sweep`, `data
    --on leader`, `tensorboard`: every one goes through clusterctl.remote.tmux.detach_command, whose pane
    shell carries `.clusterctl/jobs/NAME.exit` in its command line), whatever it runs (`sleep`, `aws s3 sync`);
  * a lease that has not expired (on the deciding node): sync, launch, data --on leader hold one;
  * an ssh command that runs, an interactive login (a shell on a terminal), or since the last check a
    command that ran (on any node of the cluster);
  * a training process (python, horovodrun, mpirun, orted ...) outside system.slice;
  * a GPU in use (nvidia-smi utilization at or above gpu_busy_percent);
  * network or disk throughput above a floor (net_busy_bytes_per_s, disk_busy_bytes_per_s: bytes per
    second between two checks, from /proc/net/dev without lo and /proc/diskstats' physical disks; None
    turns one off: a namespace node shares this machine's disks, so the local provider turns disk off).
Idle GPUs do not make a copy or a shell idle. Kept-open ssh connections with nothing running, system
daemons, and clusterctl's own checks (anything running this program: activity.is_own) do not count. The node
whose address is first in the hosts file (the leader) decides for the whole cluster: it asks every member
over ssh, and when it fires it powers the members off first, then itself. A member defers to the leader while
the leader answers on port 22, and acts alone (on its own activity) when there is no hosts file yet or the
leader is gone. What idle does (idle_action): "stop" (AWS: the instances stop, their disks kept; `clusterctl
start NAME` starts them again) or "terminate" (gone, disks included); the power-off is the same, the
instance's shutdown behaviour (set at launch) or the local supervisor makes the difference.

files.py (settings, state, log), activity.py (what runs on this node: the probe), rules.py (busy or idle,
and when it stops: pure), leases.py, peers.py (the hosts file, the members over ssh, the power-off),
main.py (the loop, firing, the commands).
"""
