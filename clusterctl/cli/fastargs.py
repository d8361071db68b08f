"""Plain str/int/float/bool parameters parsed without pydantic.

typer 0.29 coerces every command-line value through a pydantic TypeAdapter: the first command
argument imports pydantic and builds adapters, about 0.1-0.15 s of CPU per invocation, which is
most of what a repeated `clusterctl run` costs. Values of the plain types need none of that, so
they get a small coercer here; everything else (paths, choices, ranges, files, custom parsers,
other types) still goes through typer's own. If typer's internals are not the ones this was written
against, nothing is patched and typer behaves as shipped.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Any


def install() -> bool:
    try:
        from typer import _coercion, core
        from typer._click.exceptions import BadParameter
    except ImportError:
        return False
    original = getattr(core, "build_runtime_param", None)
    base = getattr(_coercion, "RuntimeParam", None)
    if original is None or base is None or getattr(original, "_clusterctl_fast", False):
        return False

    scalars = (str, int, float, bool)

    @dataclass(frozen=True)
    class Plain(base):  # type: ignore[misc, valid-type]  # typer's private class, found at run time
        kind: type = str
        many: bool = False

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:  # typer's private signature
            if self.many:
                return [self._one(v, param, ctx) for v in (value if isinstance(value, (list, tuple)) else [value])]
            return self._one(value, param, ctx)

        def _one(self, v: Any, param: Any, ctx: Any) -> Any:
            kind = self.kind
            if kind is bool:
                if isinstance(v, bool):
                    return v
                text = str(v).strip().lower()
                if text in ("1", "true", "t", "yes", "y", "on"):
                    return True
                if text in ("0", "false", "f", "no", "n", "off"):
                    return False
            elif isinstance(v, kind) and not isinstance(v, bool):
                return v
            else:
                try:
                    out = kind(v)
                    if kind is not float or math.isfinite(out):
                        return out
                except (TypeError, ValueError):
                    pass
            raise BadParameter(f"{v!r} is not a valid {kind.__name__}.", ctx=ctx, param=param)

    def build(descriptor: Any) -> Any:  # typer's private descriptor and parameter
        try:
            info = descriptor.parameter_info
            plain = (
                descriptor.file_annotation is None
                and not descriptor.is_path
                and not descriptor.is_choice
                and not descriptor.is_ranged
                and getattr(info, "parser", None) is None
                and getattr(info, "click_type", None) is None
            )
            ann = descriptor.annotation
            if plain and ann in scalars:
                return Plain(info, ann, kind=ann)
            if plain and typing.get_origin(ann) is list and typing.get_args(ann) and typing.get_args(ann)[0] in scalars:
                return Plain(info, ann, kind=typing.get_args(ann)[0], many=True)
        except Exception:
            pass
        return original(descriptor)

    build._clusterctl_fast = True  # type: ignore[attr-defined]  # the mark that it is patched once
    setattr(core, "build_runtime_param", build)  # noqa: B010  # a private name (not exported, to mypy --strict)
    return True
