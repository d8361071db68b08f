"""The hosts file: parse, validate, render for each consumer (pure, no I/O beyond tmp files)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from clusterctl.errors import HostsFileError
from clusterctl.hostsfile import HostsFile, host_problem
from conftest import REPO

EXAMPLE = """\
# leader first
10.0.1.4 slots=8

10.0.1.5 slots=8   # a member
node-7.example.com slots=4
fe80::1 slots=2
"""


def test_parse_accepts_comments_blank_lines_and_names():
    hf = HostsFile.parse(EXAMPLE)
    assert hf.hosts == ("10.0.1.4", "10.0.1.5", "node-7.example.com", "fe80::1")
    assert hf.total_slots == 22


def test_render_is_strict_for_horovodrun():
    text = HostsFile.parse(EXAMPLE).render()
    assert text == "10.0.1.4 slots=8\n10.0.1.5 slots=8\nnode-7.example.com slots=4\nfe80::1 slots=2\n"
    assert "#" not in text and "\n\n" not in text


def test_formats():
    hf = HostsFile.parse("10.0.0.2 slots=2\nnode-3 slots=1\n")
    assert hf.render_as("slots") == hf.render_as("deepspeed") == "10.0.0.2 slots=2\nnode-3 slots=1\n"
    assert hf.render_as("horovod") == "10.0.0.2:2,node-3:1\n"
    assert hf.render_as("horovod-file") == "10.0.0.2 slots=2\nnode-3 slots=1\n"
    assert hf.render_as("mpi") == "10.0.0.2 slots=2 max_slots=2\nnode-3 slots=1 max_slots=1\n"
    assert hf.render_as("plain") == "10.0.0.2\nnode-3\n"
    assert json.loads(hf.render_as("json")) == [{"host": "10.0.0.2", "slots": 2}, {"host": "node-3", "slots": 1}]
    assert json.loads(hf.render_as("tf-config", task=1)) == {
        "cluster": {"worker": ["10.0.0.2:2222", "node-3:2222"]},  # one worker per node, all its GPUs
        "task": {"type": "worker", "index": 1},
    }


@pytest.mark.parametrize(
    "text, fmt, task, message",
    [
        ("fe80::1 slots=1", "horovod", None, "horovodrun splits `host:slots` at every ':' and reads no IPv6 address"),
        ("[fd00::5] slots=1", "horovod-file", None, "reads no IPv6 address"),
        ("fd00::5 slots=1", "plain", None, "pdsh reads `a:b` as rcmd type a, host b"),
        ("node-1:2222 slots=1", "plain", None, "pdsh reads"),
        ("node-1:2222 slots=1", "deepspeed", None, "a DeepSpeed or Open MPI hostfile takes one ssh port for all hosts"),
        ("node-1:2222 slots=1", "slots", None, "takes one ssh port for all hosts, so 'node-1:2222' cannot be given"),
        ("node-1 slots=1", "tf-config", None, "--format tf-config needs --task N"),
        (
            "node-1 slots=1\nnode-2",
            "tf-config",
            2,
            "--task 2 is not a node of these 2: give each node its own index, 0 to 1",
        ),
        ("node-1 slots=1", "tf-config", -1, "--task -1 is not a node"),
        ("node-1 slots=1", "mpi", 0, "--task is for --format tf-config"),
        ("node-1 slots=1", "yaml", None, "unknown format 'yaml'"),
    ],
)
def test_a_format_refuses_what_its_reader_cannot_read(text, fmt, task, message):
    from clusterctl.errors import UsageError

    with pytest.raises(UsageError) as info:
        HostsFile.parse(text).render_as(fmt, task)
    assert message in info.value.one_line() and info.value.exit_code == 2


def test_slots_default_to_one_and_hosts_file_example_parses():

    assert HostsFile.parse("node1\n").entries[0].slots == 1
    example = HostsFile.read(str(REPO / "hosts.example"))
    assert example.total_slots == 32


@pytest.mark.parametrize(
    "text, message",
    [
        ("10.0.0.1 slots=8\n-oProxyCommand=id slots=8\n", "hosts:2: host '-oProxyCommand=id' starts with '-'"),
        ("a;id slots=1\n", "hosts:1: shell metacharacter"),
        ("$(id) slots=1\n", "hosts:1: shell metacharacter"),
        ("`id` slots=1\n", "hosts:1: shell metacharacter"),
        ("10.0.0.1 slots=0\n", "hosts:1: slots must be a whole number from 1 to 1024"),
        ("10.0.0.1 slots=1025\n", "hosts:1: slots must be"),
        ("10.0.0.1 slots=x\n", "hosts:1: slots must be"),
        ("10.0.0.1\n\n10.0.0.1\n", "hosts:3: host '10.0.0.1' is listed twice (first on line 1)"),
        ("10.0.0.1 extra\n", "hosts:1: unexpected 'extra'"),
        ("ho\x07st slots=1\n", "hosts:1: control character"),
        ("ho\rst slots=1\n", "hosts:1: control character"),  # not a line break: never two hosts
        ("10.0.0.1 slots=1\r\n10.0.0.2\x0bx slots=1\r\n", "hosts:2: control character"),
        ("under_score..x\n", "hosts:1: "),
        ("# only a comment\n", "hosts: no hosts"),
    ],
)
def test_bad_entries_name_the_line(text, message):
    with pytest.raises(HostsFileError) as info:
        HostsFile.parse(text)
    assert message in info.value.one_line()


def test_error_names_the_file(tmp_path):
    path = tmp_path / "myhosts"
    path.write_text("10.0.0.1 slots=1\nbad|host slots=1\n")
    with pytest.raises(HostsFileError, match=r"^myhosts:2: shell metacharacter"):
        HostsFile.read(str(path))
    with pytest.raises(HostsFileError, match="no such hosts file"):
        HostsFile.read(str(tmp_path / "missing"))


# ---- properties -------------------------------------------------------------------------------------------
label = st.from_regex(r"[a-z0-9](?:[a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
dns = st.lists(label, min_size=1, max_size=4).map(".".join)
ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
hosts = st.one_of(dns, ipv4, st.ip_addresses(v=6).map(str))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(hosts, st.integers(1, 1024)), min_size=1, max_size=20, unique_by=lambda p: p[0]))
def test_render_parse_round_trip(pairs):
    hf = HostsFile.from_pairs(pairs)
    again = HostsFile.parse(hf.render())
    assert again == hf
    assert [(e.host, e.slots) for e in again.entries] == pairs


HOSTILE_CHARS = list(";&|$`<>()\\\"'*?[]{}!~=,%^") + [" ", "\t", "\x00", "\x1b", "\x7f"]


@settings(max_examples=300, deadline=None)
@given(prefix=st.text(max_size=8), bad=st.sampled_from(HOSTILE_CHARS), suffix=st.text(max_size=8))
def test_hostile_tokens_always_rejected(prefix, bad, suffix):
    assert host_problem(prefix + bad + suffix) is not None


@given(st.text(min_size=1, max_size=12))
def test_leading_dash_always_rejected(rest):
    assert host_problem("-" + rest) is not None


# ---- ssh ports and bracketed IPv6 (issue 16) ---------------------------------------------------------------
def test_ports_and_bracketed_ipv6_parse():
    hf = HostsFile.parse("[fd00::5]:2222 slots=8\nnode-1:2222 slots=4\n[fd00::6] slots=2\n10.0.0.9:22\nfd00::7\n")
    assert hf.hosts == (
        "[fd00::5]:2222",
        "node-1:2222",
        "[fd00::6]",
        "10.0.0.9:22",
        "fd00::7",
    )  # as written: ssh's form
    assert [(e.address, e.port) for e in hf.entries] == [
        ("fd00::5", 2222),
        ("node-1", 2222),
        ("fd00::6", None),
        ("10.0.0.9", 22),
        ("fd00::7", None),
    ]
    assert (
        hf.render()
        == "[fd00::5]:2222 slots=8\nnode-1:2222 slots=4\n[fd00::6] slots=2\n10.0.0.9:22 slots=1\nfd00::7 slots=1\n"
    )
    # the same machine on two ports is two hosts (two sshd), the same endpoint twice is one
    assert HostsFile.parse("node-1:2222\nnode-1:2223\nnode-1\n").total_slots == 3
    with pytest.raises(HostsFileError, match="hosts:2: host '\\[fd00::5\\]' is listed twice"):
        HostsFile.parse("fd00:0::5\n[fd00::5]\n")


@pytest.mark.parametrize(
    "token, message",
    [
        ("node-1:0", "port 0 of 'node-1:0' is not between 1 and 65535"),
        ("node-1:65536", "is not between 1 and 65535"),
        ("[fd00::5]:", "shell metacharacter"),
        ("[fd00::5]x", "shell metacharacter"),
        ("[10.0.0.1]:22", "shell metacharacter"),  # brackets are for IPv6 only
        ("node-1:ssh", "is neither an IPv6 address nor a DNS name"),
        ("[fd00::5]:22:1", "shell metacharacter"),
        ("-o:22", "starts with '-'"),
        ("[fd00::5;id]:22", "shell metacharacter"),
    ],
)
def test_bad_ports_name_the_line(token, message):
    with pytest.raises(HostsFileError) as info:
        HostsFile.parse(f"10.0.0.1\n{token} slots=1\n")
    assert "hosts:2: " in info.value.one_line() and message in info.value.one_line()


def test_horovodrun_cannot_take_per_host_ports():
    from clusterctl.errors import UsageError

    hf = HostsFile.parse("[fd00::5]:2222 slots=8\n10.0.0.2 slots=1\n")
    for render in (hf.horovod_arg, hf.render_mpi):
        with pytest.raises(UsageError) as info:
            render()
        assert info.value.exit_code == 2 and "one ssh port for all hosts" in info.value.one_line()
        assert "\n" not in info.value.one_line()
    assert HostsFile.parse("[fd00::5] slots=8\n").render_mpi() == "fd00::5 slots=8 max_slots=8\n"  # bare, as MPI reads


ports = st.integers(1, 65535)
endpoint = st.one_of(
    st.tuples(dns, ports).map(lambda t: (f"{t[0]}:{t[1]}", t[0], t[1])),
    st.tuples(ipv4, ports).map(lambda t: (f"{t[0]}:{t[1]}", t[0], t[1])),
    st.tuples(st.ip_addresses(v=6).map(str), ports).map(lambda t: (f"[{t[0]}]:{t[1]}", t[0], t[1])),
    st.ip_addresses(v=6).map(str).map(lambda a: (f"[{a}]", a, None)),
    hosts.map(lambda h: (h, h, None)),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(endpoint, st.integers(1, 1024)), min_size=1, max_size=20, unique_by=lambda p: (p[0][1], p[0][2]))
)
def test_ported_round_trip_and_split(items):
    hf = HostsFile.from_pairs([(tok, s) for (tok, _, _), s in items])
    assert HostsFile.parse(hf.render()) == hf
    assert [(e.host, e.address, e.port, e.slots) for e in hf.entries] == [(t, a, p, s) for (t, a, p), s in items]


@settings(max_examples=300, deadline=None)
@given(prefix=st.text(max_size=8), bad=st.sampled_from(HOSTILE_CHARS), suffix=st.text(max_size=8), port=ports)
def test_hostile_tokens_rejected_with_ports_too(prefix, bad, suffix, port):
    from clusterctl.hostsfile import entry_problem

    token = prefix + bad + suffix
    for form in (token, f"{token}:{port}", f"[{token}]:{port}", f"[{token}]"):
        assert entry_problem(form) is not None, form


# ---- each format read by its reader's own parser ------------------------------------------------------------
any_host = st.one_of(
    dns.map(lambda h: (h, h)),
    ipv4.map(lambda h: (h, h)),
    st.ip_addresses(v=6).map(str).map(lambda a: (a, a)),
    st.ip_addresses(v=6).map(str).map(lambda a: (f"[{a}]", a)),
    st.tuples(dns, ports).map(lambda t: (f"{t[0]}:{t[1]}", t[0])),
)
some_hosts = st.lists(st.tuples(any_host, st.integers(1, 64)), min_size=1, max_size=8, unique_by=lambda p: p[0][1])


def _rendered(hf: HostsFile, fmt: str) -> str | None:
    from clusterctl.errors import UsageError

    try:
        return hf.render_as(fmt)
    except UsageError:
        return None


@settings(max_examples=60, deadline=None)
@given(some_hosts)
def test_horovod_formats_read_by_horovods_own_parsers(tmp_path_factory, items):
    from horovod.runner.common.util.hosts import parse_host_files, parse_hosts, parse_hosts_and_slots

    hf = HostsFile.from_pairs([(tok, s) for (tok, _), s in items])
    want = [(address, s) for (_, address), s in items]
    arg = _rendered(hf, "horovod")
    if any(":" in tok for (tok, _), _ in items):  # a port of its own or an IPv6 address: refused
        assert arg is None
        if any(":" in address for address, _ in want):  # and rightly: Horovod cannot read an IPv6 host
            for naive in (",".join(f"{a}:{s}" for a, s in want), ",".join(f"[{a}]:{s}" for a, s in want)):
                with pytest.raises(ValueError):
                    parse_hosts_and_slots(naive)
        return
    assert arg is not None
    assert [(h.hostname, h.slots) for h in parse_hosts(arg.strip())] == want
    names, slots = parse_hosts_and_slots(arg.strip())
    assert [(n, slots[n]) for n in names] == want
    path = tmp_path_factory.mktemp("hf") / "hosts"
    path.write_text(hf.render_as("horovod-file"))
    assert parse_host_files(str(path)) == arg.strip()


def test_hosts_example_is_read_by_horovods_parse_host_files():
    from horovod.runner.common.util.hosts import parse_host_files, parse_hosts

    text = parse_host_files(str(REPO / "hosts.example"))
    assert [(h.hostname, h.slots) for h in parse_hosts(text)] == [(f"10.0.1.{i}", 8) for i in range(4, 8)]


# Open MPI's hostfile lexer (prrte src/util/hostfile/hostfile_lex.l, the same rules in ompi's
# orte/util/hostfile): flex takes the longest match, the first rule on a tie; a host must come out whole as
# one STRING, IPV4, IPV6 or HOSTNAME token (a `[` is an ERROR token).
_OMPI_HOST_RULES = [
    ("STRING", r"[A-Za-z0-9_\-,:*@]*"),
    ("IPV4", r"([A-Za-z0-9][A-Za-z0-9_\-]*@)?([0-9]{1,3}\.){3}[0-9]{1,3}"),
    ("IPV6", r"([A-Za-z0-9][A-Za-z0-9_\-]*@)?([A-Fa-f0-9]{0,4}:)+:*([A-Fa-f0-9]{0,4}:)+[A-Fa-f0-9]{1,4}"),
    ("HOSTNAME", r"(\^?[A-Za-z0-9][A-Za-z0-9_\-]*@)?[A-Za-z0-9][A-Za-z0-9_\-.]*"),
]


def _ompi_host_token(word: str) -> str | None:
    import re

    best, kind = 0, None
    for name, rule in _OMPI_HOST_RULES:
        m = re.match(rule, word)
        if m and len(m.group(0)) > best:
            best, kind = len(m.group(0)), name
    return kind if best == len(word) else None


@settings(max_examples=60, deadline=None)
@given(some_hosts)
def test_mpi_and_deepspeed_files_as_their_parsers_read_them(items):
    import re

    hf = HostsFile.from_pairs([(tok, s) for (tok, _), s in items])
    want = [(address, s) for (_, address), s in items]
    mpi, ds = _rendered(hf, "mpi"), _rendered(hf, "deepspeed")
    if any(tok != address and not tok.startswith("[") for (tok, address), _ in items):  # a port of its own
        assert mpi is None and ds is None
        return
    assert mpi is not None and ds is not None
    for line, (address, slots) in zip(mpi.splitlines(), want, strict=True):
        host, *rest = line.split()
        assert host == address and _ompi_host_token(host) is not None, line
        assert rest == [f"slots={slots}", f"max_slots={slots}"]
    # DeepSpeed's launcher/runner.py _parse_hostfile: `^(\S+)\s+slots=(\d+)` per line
    parsed = [re.search(r"^(\S+)\s+slots=(\d+)", line) for line in ds.splitlines()]
    assert [(m.group(1), int(m.group(2))) for m in parsed if m] == want


def test_the_ompi_oracle_refuses_brackets():
    assert _ompi_host_token("[fd00::5]") is None and _ompi_host_token("fd00::5") is not None
    assert _ompi_host_token("node-1.example.com") == "HOSTNAME" and _ompi_host_token("10.0.0.1") is not None


@settings(max_examples=60, deadline=None)
@given(some_hosts)
def test_plain_is_one_host_a_line_or_refused(items):
    hf = HostsFile.from_pairs([(tok, s) for (tok, _), s in items])
    plain = _rendered(hf, "plain")
    if any(":" in tok for (tok, _), _ in items):
        assert plain is None
    else:
        assert plain is not None and plain.splitlines() == [tok for (tok, _), _ in items]


def test_tf_config_is_read_by_tensorflows_resolver(monkeypatch):
    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver

    hf = HostsFile.parse("10.0.0.2 slots=8\nnode-3 slots=8\nfd00::5 slots=8\n")
    for task in range(3):
        monkeypatch.setenv("TF_CONFIG", hf.render_as("tf-config", task))
        r = TFConfigClusterResolver()
        assert r.cluster_spec().as_dict() == {"worker": ["10.0.0.2:2222", "node-3:2222", "[fd00::5]:2222"]}
        assert (r.task_type, r.task_id) == ("worker", task)
