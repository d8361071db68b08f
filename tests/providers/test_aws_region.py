"""The AWS region as users configure it: AWS_REGION first (as the AWS CLI v2 and the other SDKs read it), then
AWS_DEFAULT_REGION, then the profile; and the "no region" error's advice, followed literally, works."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.integration


def _error(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_the_no_region_advice_followed_literally_works(aws, aws_cli):
    args = ("up", "--nodes", "4", "--type", "p3.16xlarge", "--dry-run")
    proc = aws_cli(*args, env={"AWS_REGION": "", "AWS_DEFAULT_REGION": ""})
    error = _error(proc)
    assert proc.returncode == 3 and error.startswith("Error: no AWS region given"), proc.stderr
    assert "set AWS_REGION" in error  # the advice this test follows
    proc = aws_cli(*args, env={"AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": ""})
    assert proc.returncode == 0, proc.stderr
    assert "plan: 4 x p3.16xlarge in us-east-1" in proc.stderr
    # The other way the advice names: --region.
    proc = aws_cli(*args, "--region", "us-east-1", env={"AWS_REGION": "", "AWS_DEFAULT_REGION": ""})
    assert proc.returncode == 0 and "plan: 4 x p3.16xlarge in us-east-1" in proc.stderr, proc.stderr


def test_aws_region_comes_before_aws_default_region(aws, aws_cli):
    env = {"AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "eu-west-1"}
    proc = aws_cli("up", "--nodes", "1", "--type", "p3.8xlarge", "--dry-run", env=env)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"plan: 1 x p3\.8xlarge in us-east-1\b", proc.stderr), proc.stderr
