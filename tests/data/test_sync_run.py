"""`sync`'s options checked into one value before anything connects (cluster/sync_run.py), each wrong value
refused with its own line, in the order the command line gives them."""

from __future__ import annotations

import pytest

from clusterctl.cluster import sync_run
from clusterctl.errors import UsageError


def test_the_options_become_one_value(tmp_path):
    opts = sync_run.options(str(tmp_path), "~/imagenet", "tree", "3", delete=True, stall_timeout=5.0, verify="disk")
    assert (opts.source.kind, opts.dst, opts.strategy, opts.fanout, opts.delete, opts.verify) == (
        "local",
        "~/imagenet",
        "tree",
        3,
        True,
        "disk",
    )
    assert sync_run.options("s3://my-bucket/data", "data").fanout is None  # auto: measured when the chain starts


@pytest.mark.parametrize(
    "given, refused",
    [
        (dict(strategy="star"), "unknown --strategy 'star'"),
        (dict(fanout="two"), "--fanout must be auto or a whole number, not 'two'"),
        (dict(fanout="0"), "--fanout"),
        (dict(stall_timeout=0.0), "--stall-timeout"),
        (dict(verify="none"), "unknown --verify 'none'"),
        (dict(dst="~"), "refusing to sync into .~.: it is the login home"),
        (dict(strategy="star", verify="none"), "--strategy"),  # the first wrong one
    ],
)
def test_a_wrong_option_is_refused_by_name(given, refused):
    args = {"src": "leader:~/imagenet", "dst": "imagenet", **given}
    with pytest.raises(UsageError, match=refused):
        sync_run.options(**args)
