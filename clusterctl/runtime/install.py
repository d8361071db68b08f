"""`up`'s runtime step: every node gets the same verified runtime, and the cluster record says which.

    probe every node (OS, arch, python3, CUDA: all alike, or stop) -> id -> nodes that already have it
    are left alone -> a pack: this machine's cache (local clusters), the S3 cache (`--runtime-cache`),
    or built on the leader (AWS: it reaches the package index) -> relayed to the nodes with sync's
    pipelined chain (sha256-checked) -> unpacked and verified on every node, marker written last.

The S3 cache is filled and read through presigned URLs, so whoever sees one within its hour could replace a
pack and its runtime.json together: a pack from the cache is taken only when it has the sha256 this machine
recorded when it cached it (s3cache.S3Cache.held, in CLUSTERCTL_HOME, out of reach of any URL), checked on the leader
before anything unpacks it; a replaced one stops `up` with one line naming it. A pack this machine never
cached (a teammate's) vouches for nothing here: the leader builds instead.

A node never runs the operator's interpreter: the record keeps the runtime's Python (NodeRuntime; or
the user's own `--python`), and remote/jobfolder.node_python reads it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, Mapping, Sequence

from clusterctl import resources, s3uri
from clusterctl.errors import ProvisionError, UnreachableError, UsageError
from clusterctl.providers.base import ImageFacts
from clusterctl.remote.ssh import SshPool
from clusterctl.remote.targets import SshTarget
from clusterctl.runtime import gpu as gpu_build, spec as rt
from clusterctl.runtime.s3cache import MISMATCH_EXIT, S3Cache, digest_command, fetch_command, parse_digests, put_command
from clusterctl.types import Cluster, ClusterFacts, NodeRuntime, OnStep, Step, step_lines

if TYPE_CHECKING:
    from clusterctl.data import outcome as sync_outcome

Report = Callable[[str], None]
Mode = Literal["install", "none", "own"]
WORK = ".clusterctl/runtime"  # under the login home: the scripts
# The pack lands beside the runtime (same file system: on local nodes a tmpfs, never the slow home disk) and is
# removed once installed.
INCOMING = f"{rt.ROOT}/.incoming"
INSTALL_TIMEOUT_S = 1800.0
BUILD_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class RuntimeRequest:
    """What `up` was asked for: install the runtime (default), none (`--runtime none`), or the user's own
    interpreter (`--python PATH`, checked by `doctor`)."""

    mode: Mode = "install"
    python: str = ""  # mode "own"
    cache: str = ""  # s3://bucket/prefix: AWS clusters fetch a built runtime from there, or put theirs there
    wheels: str = ""  # a complete wheel folder URL the leader installs from instead of the index (--no-index)
    dali: bool = False  # `--runtime dali`: NVIDIA DALI on CPU nodes too (GPU runtimes always carry it)

    def __post_init__(self) -> None:
        if self.mode == "own" and not self.python.startswith("/"):
            raise UsageError(f"--python {self.python!r} must be an absolute path on the nodes", "e.g. /usr/bin/python3")
        if self.cache:
            try:
                s3uri.parse(self.cache)
            except ValueError as exc:
                raise UsageError(f"--runtime-cache {self.cache!r} is not an S3 location ({exc})") from None


def record(request: RuntimeRequest) -> NodeRuntime:
    """What the cluster's record says of a request that installs nothing."""
    if request.mode == "own":
        return NodeRuntime("own", request.python)
    return NodeRuntime("none")


def kept(facts: ClusterFacts) -> RuntimeRequest:
    """The request that finds the runtime a cluster's record names on its nodes again (`start`): none, the
    user's own python, or the same install (found where the disks kept it, put back where they did not)."""
    if facts.runtime == "own":
        return RuntimeRequest("own", python=facts.python)
    if facts.runtime in ("", "none"):
        return RuntimeRequest("none")
    return RuntimeRequest("install", dali=facts.runtime_dali)


def plan_line(request: RuntimeRequest, image: ImageFacts | None) -> str:
    """`up`'s plan line for the runtime; an image it could not be built on (a python3 without TensorFlow
    wheels, no CUDA 12 toolkit for the type's GPUs) is refused here, before anything is launched."""
    if request.mode == "none":
        return "none (--runtime none): jobs need a Python with TensorFlow and Horovod on the nodes"
    if request.mode == "own":
        return f"your own Python {request.python} (`clusterctl doctor` checks it has TensorFlow and Horovod)"
    s = rt.RuntimeSpec()
    gpu = gpu_build.planned(image.python, image.cuda_toolkits, image.default_cuda, image.compute_caps) if image else ""
    where = f"; cache {request.cache}" if request.cache else ""
    dali = f" + DALI {rt.DALI_VERSION}" if request.dali or (image and image.compute_caps) else ""
    return f"TensorFlow {s.tensorflow} + Horovod {s.horovod}{dali} at {rt.ROOT}/<id> on every node{gpu}{where}"


def describe(extra: Mapping[str, str]) -> str:
    """The record's runtime, for `status`."""
    facts = ClusterFacts(extra)
    rid, python = facts.runtime, facts.python
    if rid == "own":
        return f"runtime: your own Python {python}"
    if rid in ("", "none"):
        return "runtime: none (`up --runtime none`, or made before the node runtime existed)"
    return f"runtime: {rid}, {python} on every node"


def install(
    cluster: Cluster,
    pool: SshPool,
    targets: Sequence[SshTarget],
    addresses: Sequence[str],
    known_hosts: str,
    request: RuntimeRequest,
    report: Report,
    *,
    s3: S3Cache | None = None,
    build_here: bool = False,
    on_step: OnStep | None = None,
) -> NodeRuntime:
    """Install (or find) the runtime on every node; what the record keeps of it: runtime id, python and the
    CUDA toolkit of a GPU build.
    build_here: the provider's builds_runtime_locally (the nodes have this machine's OS).
    on_step: the relay as a step (a progress bar); without it, its start and end as report lines."""
    if request.mode != "install":
        return record(request)
    steps = on_step or step_lines(report)
    names = [n.name for n in cluster.nodes]
    platform = probe(pool, targets, names)
    spec = rt.RuntimeSpec.for_platform(platform, request.dali)  # refuses a python3 or toolkit it cannot build on
    rid = rt.runtime_id(spec, platform)
    fields = NodeRuntime(rid, rt.python_of(rid), spec.cuda_build.home if spec.cuda_build else "", request.dali)
    have = prepare(pool, targets, names, rid)
    need = [i for i, has in enumerate(have) if not has]
    if not need:
        report(f"node runtime {rid} is already on every node")
        return fields
    report(
        f"node runtime {rid}: {platform.os} {platform.arch}, python {platform.python}, "
        f"CUDA {platform.cuda}; {spec.describe()}; {len(need)} node(s) need it"
    )
    incoming = f"{INCOMING}/{rid}"
    if build_here:  # the nodes have this machine's base OS: it builds for them
        from clusterctl.runtime import cache

        folder, built = cache.ensure(spec, platform, report)
        report(f"node runtime {rid}: {'built and cached' if built else 'from the cache'} at {folder}")
        # Only the nodes without it: a re-run after a partial `up` sends nothing twice.
        relay(
            pool,
            [targets[i] for i in need],
            [addresses[i] for i in need],
            known_hosts,
            str(folder),
            incoming,
            report,
            steps,
            leader_source=False,
        )
    else:  # the leader is the relay's source, so it stays in the chain
        _on_leader(pool, targets, rid, spec, platform, incoming, request, report, s3)
        relay(pool, targets, addresses, known_hosts, incoming, incoming, report, steps, leader_source=True)
    unpack(pool, [targets[i] for i in need], [names[i] for i in need], rid, incoming, report, steps)
    return fields


def probe(pool: SshPool, targets: Sequence[SshTarget], names: Sequence[str]) -> rt.Platform:
    results = pool.run(targets, rt.PLATFORM_PROBE, timeout=60)
    platforms: dict[str, rt.Platform] = {}
    for name, r in zip(names, results):
        if not r.ok:
            raise UnreachableError(f"cannot read {name}'s platform: {r.error or r.stderr.strip()[-200:]}")
        p = rt.parse_platform(r.stdout)
        if p is None:
            raise ProvisionError(
                f"{name} has no python3, which the node runtime is built on",
                "use an image with python3, or --runtime none",
            )
        platforms[name] = p
    first = platforms[names[0]]
    odd = [n for n in names if platforms[n] != first]
    if odd:
        p = platforms[odd[0]]
        raise ProvisionError(
            f"nodes differ: {names[0]} is {first.os}/{first.arch}/python {first.python}/CUDA "
            f"{first.cuda}, {odd[0]} is {p.os}/{p.arch}/python {p.python}/CUDA {p.cuda}",
            "one runtime serves identical nodes only: use one image and type",
        )
    return first


def prepare(pool: SshPool, targets: Sequence[SshTarget], names: Sequence[str], rid: str) -> list[bool]:
    """ROOT made and owned by the login user on every node (sudo where it is not root); which nodes hold
    the runtime already (its marker)."""
    root, marker = shlex.quote(rt.ROOT), shlex.quote(f"{rt.prefix(rid)}/{rt.MARKER}")
    command = (
        f'S=""; [ "$(id -u)" = 0 ] || S="sudo -n"; $S mkdir -p {root} && $S chown "$(id -u):$(id -g)" {root} '
        f"&& {{ test -f {marker} && echo yes || echo no; }}"
    )
    results = pool.run(targets, command, timeout=60)
    bad = [f"{n}: {r.error or r.stderr.strip()[-200:]}" for n, r in zip(names, results) if not r.ok]
    if bad:
        raise ProvisionError(
            f"cannot make {rt.ROOT} on {len(bad)} node(s): {'; '.join(bad[:3])}",
            "the login user needs root or passwordless sudo (as on the DLAMI)",
        )
    return [r.stdout.strip() == "yes" for r in results]


def relay(
    pool: SshPool,
    targets: Sequence[SshTarget],
    addresses: Sequence[str],
    known_hosts: str,
    src: str,
    dst: str,
    report: Report,
    on_step: OnStep,
    leader_source: bool,
) -> None:
    """The pack onto every node with sync's relay: checked against its sha256 on every node."""
    from clusterctl.data import plan as syncplan, sync as transfer

    source = syncplan.Source("leader", path=src) if leader_source else syncplan.Source("local", path=src)
    syncer = transfer.Syncer(
        targets,
        addresses,
        known_hosts,
        pool,
        source,
        dst,
        managed=True,
        events=_progress(report, on_step, f"relaying the node runtime to {len(targets)} node(s)"),
        node_python="python3",
    )
    result = syncer.run()
    err = result.error()
    if err is not None:
        raise ProvisionError(f"the node runtime did not reach every node: {err.message}", "run `clusterctl up` again")
    report(f"node runtime relayed to {len(targets)} node(s) in {result.seconds:.1f}s, sha256 checked on each")


def unpack(
    pool: SshPool,
    targets: Sequence[SshTarget],
    names: Sequence[str],
    rid: str,
    incoming: str,
    report: Report,
    on_step: OnStep,
) -> None:
    script = f"{WORK}/runtime_install.sh"
    put = pool.put(targets, {script: (resources.template_bytes("runtime_install.sh"), 0o700)})
    bad = [f"{n}: {r.error}" for n, r in zip(names, put) if not r.ok]
    if bad:
        raise UnreachableError(f"could not send the runtime installer: {'; '.join(bad)}")
    step = f"unpacking the node runtime on {len(targets)} node(s)"
    on_step(Step(step))
    results = pool.run(targets, rt.shell(rt.install_argv(script, rid, incoming)), timeout=INSTALL_TIMEOUT_S)
    on_step(Step(step, "end", detail=f"{sum(r.ok for r in results)} of {len(targets)} installed"))
    failed = [
        f"{n}: {r.error or (r.stderr.strip().splitlines() or [f'exit {r.exit_code}'])[-1]}"
        for n, r in zip(names, results)
        if not r.ok
    ]
    if failed:
        raise ProvisionError(
            f"the node runtime did not install on {len(failed)} node(s): {'; '.join(failed[:3])}",
            "run `clusterctl up` again: it resumes where it stopped",
        )
    report(f"node runtime {rid} unpacked and verified on {len(targets)} node(s) at {rt.prefix(rid)}")


def _on_leader(
    pool: SshPool,
    targets: Sequence[SshTarget],
    rid: str,
    spec: rt.RuntimeSpec,
    platform: rt.Platform,
    out: str,
    request: RuntimeRequest,
    report: Report,
    s3: S3Cache | None,
) -> None:
    """The pack in the leader's `out` folder: fetched from the S3 cache, else built there (and cached)."""
    leader = targets[0]
    cached = s3 is not None and s3.has(rid)
    want = s3.held_digests(rid) if s3 is not None else None
    if s3 is not None and cached and want is None:
        report(f"node runtime {rid}: {s3.url(rid)} holds it, but this machine did not cache it (no digest of it here)")
    elif s3 is not None and cached and want is not None:
        report(f"node runtime {rid}: fetching from the cache {s3.url(rid)}")
        r = pool.run_one(leader, fetch_command(s3.get_urls(rid), out, want), timeout=BUILD_TIMEOUT_S)
        if r.ok:
            return
        if r.exit_code == MISMATCH_EXIT:
            said = [line for line in r.stderr.splitlines() if line.startswith("runtime: ")]
            raise ProvisionError(
                f"node runtime {rid}: the cache {s3.url(rid)} is not what this machine put there: "
                + (said[-1][len("runtime: ") :] if said else "a file's sha256 differs"),
                f"remove {s3.url(rid)} and run `clusterctl up` again: the leader builds the runtime anew",
            )
        report(
            f"node runtime {rid}: the cache could not be read ({(r.stderr.strip() or r.error or '')[-200:]}); "
            "building instead"
        )
    script = f"{WORK}/runtime_build.sh"
    put = pool.put_one(leader, {script: (resources.template_bytes("runtime_build.sh"), 0o700)})
    if not put.ok:
        raise UnreachableError(f"cannot reach the leader {leader.label}: {put.error}")
    # A wheel mirror is used alone (air-gapped VPCs; install.sh's wheelhouse served over HTTP is one).
    build = rt.Build(rid, spec, platform, out, find_links=request.wheels, no_index=bool(request.wheels))
    report(
        f"node runtime {rid}: building on the leader {leader.label}"
        + (f" with wheels from {request.wheels}" if request.wheels else " from the package index")
    )

    def on_line(_host: str, _stream: str, line: str) -> None:
        if line.startswith("runtime: "):
            report(f"  {leader.label}: {line[len('runtime: ') :]}")

    r = pool.run_one(leader, rt.shell(rt.build_argv(script, build)), timeout=BUILD_TIMEOUT_S, on_line=on_line)
    if not r.ok:
        lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("runtime: ")]
        for line in lines[-15:]:
            report(f"  {leader.label}: {line}")
        last = lines[-1] if lines else (r.error or f"exit {r.exit_code}")
        raise ProvisionError(f"building the node runtime on the leader failed: {last}", "see the lines above")
    if s3 is not None:
        # the digests of what the leader built, taken before anything goes through a URL: what a later fetch
        # must find in the cache
        sums = pool.run_one(leader, digest_command(out), timeout=BUILD_TIMEOUT_S)
        digests = parse_digests(sums.stdout) if sums.ok else {}
        r = pool.run_one(leader, put_command(s3.put_urls(rid), out), timeout=BUILD_TIMEOUT_S) if digests else sums
        if r.ok:
            s3.hold(rid, digests)
        report(
            f"node runtime {rid}: "
            + (f"cached at {s3.url(rid)}" if r.ok else f"not cached ({(r.stderr.strip() or r.error or '')[-200:]})")
        )


def _progress(report: Report, on_step: OnStep, name: str) -> sync_outcome.Events:
    """sync's events as one step: the bytes of every node together (a progress bar), begun when the first node
    says what it needs, ended when every node is verified; a node that fails, and each phase, a report line.
    Built here because sync is imported only when a runtime is relayed (it costs `up` 80 ms otherwise)."""
    from clusterctl.data import outcome as sync_outcome

    class Progress(sync_outcome.Events):
        def __init__(self) -> None:
            self.need_bytes: dict[str, int] = {}
            self.done: dict[str, int] = {}
            self.finished_ok: dict[str, bool] = {}
            self.ended = False

        def phase(self, text: str) -> None:
            report(f"  relay: {text}")

        def need(self, host: str, total: int) -> None:
            if not self.need_bytes:
                on_step(Step(name, total=total, unit="bytes"))
            self.need_bytes[host], self.done[host] = total, 0
            self._advance()

        def progress(self, host: str, done: int) -> None:
            if host in self.need_bytes and done > self.done[host]:
                self.done[host] = done
                self._advance()

        def finished(self, outcome: sync_outcome.NodeOutcome) -> None:
            self.finished_ok[outcome.host] = outcome.status == "ok"
            if outcome.status != "ok":
                report(f"  relay: {outcome.host} {outcome.status}" + (f": {outcome.detail}" if outcome.detail else ""))
            elif outcome.host in self.need_bytes:
                self.done[outcome.host] = self.need_bytes[outcome.host]
                self._advance()
            if self.need_bytes and not self.ended and set(self.finished_ok) >= set(self.need_bytes):
                self.ended = True
                ok = sum(self.finished_ok[h] for h in self.need_bytes)
                on_step(Step(name, "end", detail=f"{ok} of {len(self.need_bytes)} node(s) verified"))

        def _advance(self) -> None:
            on_step(Step(name, "advance", sum(self.done.values()), sum(self.need_bytes.values()), "bytes"))

    return Progress()
