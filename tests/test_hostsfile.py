"""The hosts file: parse, validate, render for each consumer (pure, no I/O beyond tmp files)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from clusterctl.errors import HostsFileError
from clusterctl.hostsfile import HostsFile, host_problem

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
    hf = HostsFile.parse("10.0.0.2 slots=2\n10.0.0.3 slots=1\n")
    assert hf.render_as("horovod") == "10.0.0.2:2,10.0.0.3:1\n"
    assert hf.render_as("mpi") == "10.0.0.2 slots=2 max_slots=2\n10.0.0.3 slots=1 max_slots=1\n"
    assert json.loads(hf.render_as("json")) == [{"host": "10.0.0.2", "slots": 2}, {"host": "10.0.0.3", "slots": 1}]
    tf = json.loads(hf.render_as("tf-config"))
    assert tf["cluster"]["ps"] == ["10.0.0.2:2222", "10.0.0.3:2222"]  # one parameter server per host
    assert tf["cluster"]["worker"] == ["10.0.0.2:2223", "10.0.0.2:2224", "10.0.0.3:2223"]  # one worker per slot
    assert HostsFile.parse("fe80::1 slots=1").horovod_arg() == "[fe80::1]:1"


def test_slots_default_to_one_and_hosts_file_example_parses():
    from pathlib import Path

    assert HostsFile.parse("node1\n").entries[0].slots == 1
    example = HostsFile.read(str(Path(__file__).resolve().parent.parent / "hosts.example"))
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
