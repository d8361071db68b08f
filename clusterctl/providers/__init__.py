"""Provider registry. Imports are lazy, so `clusterctl --help` never loads boto3."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Iterable

from clusterctl.errors import ConfigError

if TYPE_CHECKING:
    from clusterctl.providers.base import Provider
    from clusterctl.types import Cluster

_PROVIDERS = {
    "local": ("clusterctl.providers.local.provider", "LocalProvider"),
    "aws": ("clusterctl.providers.aws.provider", "AwsProvider"),
}


def names() -> list[str]:
    return sorted(_PROVIDERS)


def provider_class(name: str) -> type[Provider]:
    """The provider's class (its capabilities and option schema are class attributes), by name."""
    from clusterctl.providers.base import Provider

    try:
        module, cls = _PROVIDERS[name]
    except KeyError:
        raise ConfigError(f"unknown provider {name!r}", f"use one of: {', '.join(names())}") from None
    found = getattr(importlib.import_module(module), cls)
    if not (isinstance(found, type) and issubclass(found, Provider)):
        raise TypeError(f"{module}.{cls} does not subclass providers.base.Provider")
    return found


def get(name: str, **kwargs: Any) -> Provider:
    return provider_class(name)(**kwargs)


def of(cluster: Cluster) -> Provider:
    """The provider of a recorded cluster, in its region: what workloads ask the cluster's facts of (price, GPUs,
    whether its nodes share this machine) without naming a provider."""
    return get(cluster.provider, region=cluster.region or None)


def shares_this_machine(cluster: Cluster) -> bool:
    """The capability workloads ask of a cluster's nodes (providers/base.py): one kernel, these cores, no GPUs."""
    return provider_class(cluster.provider).shares_this_machine


def refuse_foreign_flags(name: str, given: Iterable[str]) -> None:
    """`up --provider NAME` with flags only another provider takes: one line, exit 2 (base.refuse_foreign_flags)."""
    from clusterctl.providers import base

    base.refuse_foreign_flags(provider_class(name), given, [provider_class(n) for n in names()])
