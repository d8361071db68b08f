#!/usr/bin/env python3
"""Core-seconds per GB per hop of the chain relay, and the variants that could lower it, measured.

Builds a local cluster of 2 namespace nodes (real sshd, links unshaped: CPU is what is measured), makes a
dataset of --size-mb in 100 files, and streams it as the chain does: this machine's tar | ssh into node 0's
relay script (clusterctl's own, from node_scripts.relay_script, with the node package as its agent), which
extracts it and forwards it over one node-to-node ssh hop to node 1, which extracts it. The CPU is the
bench's own cgroup (owncpu.OwnCpu: source tar, both ssh hops, sshds, relay, recv and tar on the
nodes), per GB and per receiving node (2 hops). Variants, interleaved in every round (the machine is
shared: best and spread are reported):

    base        clusterctl's defaults: splice/tee(2) relay, ciphers as openssh.HOP_OPTIONS (aes128-gcm
                first), tar records of 10 KB (-b 20), the relay's pipes at 1 MB, recv hashing every file
    tee         `tee -p` forwards instead of the agent's relay
    chacha      chacha20-poly1305 on both hops
    src-b256    the source tar writes records of 128 KB (-b 256); the nodes' tar as base
    b256        -b 256 at the source and -B -b 256 on the nodes' extracting tar
    pipe64k     the relay leaves the pipes at the kernel's 64 KB (no F_SETPIPE_SZ)
    nohash      no recv before tar (sync --verify disk's stream)

A variant is made from clusterctl's own script and agent by one textual change (asserted to apply), so
what is measured is what clusterctl runs. Needs root. Example:

    python bench/hop_cost.py --size-mb 1000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]  # this checkout
from clusterctl.data import node_scripts  # noqa: E402
from clusterctl.remote import nodepkg  # noqa: E402
from clusterctl.remote.openssh import node_ssh  # noqa: E402
from owncpu import OwnCpu  # noqa: E402
from sync_bench import make_dataset  # noqa: E402
from sync_methods import CIPHER, Bench  # noqa: E402

WORK = ".clusterctl-hopcost"
DST = "/tmp/hop-cost"
VARIANTS = ("base", "tee", "chacha", "src-b256", "b256", "pipe64k", "nohash")
PYZ = f'"$HOME"/{WORK}/node.pyz'  # the node package, as the relay scripts run it


def replaced(text: str, old: str, new: str) -> str:
    if old not in text:
        raise SystemExit(f"Error: the variant's change no longer applies (not found: {old!r})")
    return text.replace(old, new)


def build(variant: str, b: Bench) -> tuple[dict[int, bytes], str, list[str]]:
    """(node index -> relay.sh, the node package, the source tar's extra options) for one variant."""
    hop = node_ssh("root", 22, True)
    if variant == "chacha":
        hop[hop.index("-c") + 1] = CIPHER["chacha"]
    hashing = variant != "nohash"
    scripts = {
        0: node_scripts.relay_script(0, DST, [b.hosts[1]], hop, WORK, hash_stream=hashing, pyz=PYZ),
        1: node_scripts.relay_script(1, DST, [], hop, WORK, hash_stream=hashing, pyz=PYZ),
    }
    agent, tar_opts = nodepkg.package().data, []
    if variant == "tee":
        s = scripts[0].decode()
        s = re.sub(r'"\$P" "\$A" sync relay --index 0 --out ("\$W/fifo.0")', r"tee -p \1", s)
        scripts[0] = replaced(s, "tee -p", "tee -p").encode()
    if variant in ("src-b256", "b256"):
        tar_opts = ["-b", "256"]
    if variant == "b256":
        scripts = {i: replaced(s.decode(), "tar -C ", "tar -B -b 256 -C ").encode() for i, s in scripts.items()}
    if variant == "pipe64k":
        agent = _package_with("sync/relay.py", lambda text: replaced(text, "fcntl.fcntl(fd, 1031, 1 << 20)", "pass"))
    return scripts, agent, tar_opts


def _package_with(module: str, change: Callable[[str], str]) -> bytes:
    """The node package with one module's text changed."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "node"
        shutil.copytree(nodepkg.SOURCE, copy, ignore=shutil.ignore_patterns("__pycache__"))
        (copy / module).write_text(change((copy / module).read_text()))
        return nodepkg.build(copy).data


def one(b: Bench, src: Path, variant: str, own: OwnCpu) -> dict:
    scripts, agent, tar_opts = build(variant, b)
    cipher = CIPHER["chacha"] if variant == "chacha" else CIPHER["aes"]
    for i, h in enumerate(b.hosts):
        b.on(h, f"rm -rf {DST} && mkdir -p {WORK} {DST}")
        for name, body, mode in (("relay.sh", scripts[i], "700"), ("node.pyz", agent, "600")):
            subprocess.run([*b.ssh, h, f"cat > {WORK}/{name} && chmod {mode} {WORK}/{name}"], input=body, check=True)
    subprocess.run(["sync"])
    o0, t0 = own.seconds(), time.perf_counter()
    tar = subprocess.Popen(["tar", "-C", str(src), *tar_opts, "-cf", "-", "."], stdout=subprocess.PIPE)
    ssh = [*b.ssh, "-o", "Compression=no", "-c", cipher, b.hosts[0], f"bash {shlex.quote(WORK + '/relay.sh')}"]
    p = subprocess.run(ssh, stdin=tar.stdout, capture_output=True, text=True)
    tar.wait()
    secs, cpu = time.perf_counter() - t0, own.seconds() - o0
    rcs = dict(re.findall(r"CCSYNC-RC (\d+) ([\d ]+)", p.stderr))
    ok = (
        p.returncode == 0
        and tar.returncode == 0
        and len(rcs) == 2
        and all(set(v.split()) == {"0"} for v in rcs.values())
    )
    if variant != "nohash":  # recv kept its hashes only when recv and tar both ended well
        ok = ok and all(b.on(h, f"test -s {WORK}/recv.json", check=False).returncode == 0 for h in b.hosts)
    if not ok:
        print(f"  {variant}: FAILED rc={p.returncode} {rcs} {p.stderr[-400:]}", flush=True)
    return {"variant": variant, "seconds": round(secs, 2), "core_s": round(cpu, 2), "ok": ok}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mb", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3, help="rounds; every round runs every variant once")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hop-cost-", dir="/var/tmp"))
    own = OwnCpu()  # before the cluster: its sshds (and all they start) count as ours
    results: list[dict] = []
    b = Bench(2, 0.0, work / "home", work)
    try:
        size, _ = make_dataset(work / "dataset", args.size_mb, 100)
        gb = size / 1e9
        b.up()
        print(f"{size / 1e6:.0f} MB, this machine -> node 0 (relay) -> node 1, links unshaped", flush=True)
        for rnd in range(args.repeat):
            order = args.variants if rnd % 2 == 0 else args.variants[::-1]  # neither end always first
            for v in order:
                r = one(b, work / "dataset", v, own)
                r["core_s_per_gb_hop"] = round(r["core_s"] / gb / 2, 3)
                results.append(r)
                print(
                    f"  round {rnd + 1} {v:<9} {r['seconds']:6.2f} s  {size / 1e6 / r['seconds']:6.0f} MB/s  "
                    f"{r['core_s']:6.2f} core-s  {r['core_s_per_gb_hop']:5.2f} core-s/GB/hop  ok={r['ok']}",
                    flush=True,
                )
        print(f"best of {args.repeat} (the machine is shared; spread = min-max over the rounds):")
        base = (
            min(r["core_s_per_gb_hop"] for r in results if r["variant"] == "base" and r["ok"])
            if "base" in args.variants
            else None
        )
        for v in args.variants:
            rows = [r for r in results if r["variant"] == v and r["ok"]]
            if not rows:
                print(f"  {v:<9} no good round")
                continue
            c = [r["core_s_per_gb_hop"] for r in rows]
            s = [r["seconds"] for r in rows]
            print(
                f"  {v:<9} {min(c):5.2f} core-s/GB/hop (spread {min(c):.2f}-{max(c):.2f})"
                + (f"  {min(c) / base:5.2f}x base" if base else "")
                + f"  {min(s):6.2f} s (spread {min(s):.2f}-{max(s):.2f})"
            )
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")
    finally:
        b.down()
        shutil.rmtree(work, ignore_errors=True)
        own.close()


if __name__ == "__main__":
    main()
