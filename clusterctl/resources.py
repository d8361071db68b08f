"""Where the shipped templates/ and playbooks/ are: inside the wheel (clusterctl/_data/...) when
installed, or the repository's top-level folders in a source checkout or editable install."""

from __future__ import annotations

from pathlib import Path

from clusterctl.errors import ConfigError

_PKG = Path(__file__).resolve().parent


def folder(kind: str) -> Path:
    """kind: "templates" or "playbooks"."""
    for candidate in (_PKG / "_data" / kind, _PKG.parent / kind):
        if candidate.is_dir():
            return candidate
    raise ConfigError(f"the shipped {kind}/ folder is missing from this installation", "reinstall clusterctl")


def source_checkout() -> Path | None:
    """The repository folder when clusterctl runs from a checkout (editable install), else None."""
    top = _PKG.parent
    return top if (top / "pyproject.toml").is_file() and (top / "templates").is_dir() else None


def template_path(name: str) -> Path:
    path = folder("templates") / name
    if not path.is_file():
        raise ConfigError(f"no template named {name!r}", f"see {folder('templates')}")
    return path


def template_bytes(name: str) -> bytes:
    return template_path(name).read_bytes()


def render(name: str, **variables: object) -> str:
    """A jinja2 template from templates/, rendered strictly (an unknown variable is an error)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder("templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    try:
        return env.get_template(name).render(**variables)
    except jinja2.UndefinedError as exc:
        raise ConfigError(f"template {name}: {exc.message}", "pass that variable") from None
