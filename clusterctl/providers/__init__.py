"""Provider registry. Imports are lazy, so `clusterctl --help` never loads boto3."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from clusterctl.errors import ConfigError

if TYPE_CHECKING:
    from clusterctl.providers.base import Provider

_PROVIDERS = {
    "local": ("clusterctl.providers.local.provider", "LocalProvider"),
    "aws": ("clusterctl.providers.aws.provider", "AwsProvider"),
}


def names() -> list[str]:
    return sorted(_PROVIDERS)


def get(name: str, **kwargs: Any) -> Provider:
    try:
        module, cls = _PROVIDERS[name]
    except KeyError:
        raise ConfigError(f"unknown provider {name!r}", f"use one of: {', '.join(names())}") from None
    provider: Provider = getattr(importlib.import_module(module), cls)(**kwargs)
    return provider
