"""ImageNet-format TFRecords written here (`data tfrecords`, `data synthetic`) and read back: the node package's
dataset code (node/dataset/tfrecords.py and synthetic.py, the one copy; a leader runs it too), its refusals raised as ConfigError
so they reach the user as every other error does."""

from __future__ import annotations

import functools
from typing import Callable, ParamSpec, TypeVar

from clusterctl.errors import ConfigError
from clusterctl.node.dataset import synthetic, tfrecords as records
from clusterctl.node.dataset.errors import DatasetError

P = ParamSpec("P")
R = TypeVar("R")


def _config_errors(f: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(f)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return f(*args, **kwargs)
        except DatasetError as exc:
            raise ConfigError(exc.message, exc.hint) from None

    return checked


convert_folder = _config_errors(records.convert_folder)
write_synthetic = _config_errors(synthetic.write_synthetic)
read_info = _config_errors(records.read_info)
