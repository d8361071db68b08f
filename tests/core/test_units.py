"""Money and durations: the one formatting every table, estimate and status line uses."""

from __future__ import annotations

import pytest

from clusterctl import units


@pytest.mark.parametrize(
    "usd, text",
    [
        (None, "unknown"),
        (0, "$0.00"),
        (0.004, "$0.00"),
        (0.005, "$0.01"),
        (2.449, "$2.45"),
        (48.96, "$48.96"),
        (1234.5, "$1,234.50"),
        (1_000_000, "$1,000,000.00"),
    ],
)
def test_money(usd, text):
    assert units.money(usd) == text


@pytest.mark.parametrize(
    "seconds, text",
    [
        (None, "-"),
        (-30, "0s"),
        (0, "0s"),
        (5, "5s"),
        (59.4, "59s"),
        (61, "61s"),
        (119, "119s"),
        (119.6, "2m"),
        (150, "2m30s"),
        (540, "9m"),
        (599, "9m59s"),
        (600, "10m"),
        (1000.1, "16m"),
        (3599, "59m"),
        (3600, "60m"),
        (5400, "90m"),
        (7199, "119m"),
        (7200, "2h00m"),
        (3600 * 3 + 420, "3h07m"),
        (90000, "25h00m"),
        (172799, "47h59m"),
        (172800, "2d00h"),
        (86400 * 2 + 3600 * 4, "2d04h"),
        (86400 * 30 + 59, "30d00h"),
    ],
)
def test_duration(seconds, text):
    assert units.duration(seconds) == text
