"""docs/ and the tool say the same: every flag of every command is documented where the command is (a
paragraph of docs/ naming the command and the flag), and every CLUSTERCTL_* setting the code reads is in docs/."""

from __future__ import annotations

import re

from conftest import REPO

DOCS = REPO / "docs"
SKIP = {"--help", "-h"}


def _paragraphs() -> list[str]:
    out: list[str] = []
    for page in sorted(DOCS.glob("*.md")):
        out += [p for p in re.split(r"\n\s*\n", page.read_text()) if p.strip()]
    return out


def _flags() -> dict[tuple[str, ...], list[str]]:
    import typer.main

    from clusterctl.cli.app import app

    found: dict[tuple[str, ...], list[str]] = {}

    def walk(cmd, prefix: tuple[str, ...]) -> None:
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            path = (*prefix, name)
            found[path] = [o for p in sub.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)]
            walk(sub, path)

    walk(typer.main.get_command(app), ())
    return found


def _names(paragraph: str, path: tuple[str, ...]) -> bool:
    return re.search(r"(clusterctl |`)" + re.escape(" ".join(path)) + r"\b", paragraph) is not None


def test_every_flag_of_every_command_is_in_docs():
    paragraphs = _paragraphs()
    missing = []
    for path, flags in _flags().items():
        about = [p for p in paragraphs if _names(p, path)]
        for flag in flags:
            if flag in SKIP or not flag.startswith("--"):
                continue
            pattern = re.compile(re.escape(flag) + r"(?![\w-])")
            if not any(pattern.search(p) for p in about):
                missing.append(f"{' '.join(path)} {flag}")
    assert missing == [], f"{len(missing)} flag(s) no paragraph of docs/ names with their command: {missing}"


def test_every_clusterctl_setting_the_code_reads_is_in_docs():
    read = set()
    for path in (REPO / "clusterctl").rglob("*.py"):
        read |= set(re.findall(r"""["'](CLUSTERCTL_[A-Z0-9_]+)["']""", path.read_text()))
    text = "\n".join(page.read_text() for page in DOCS.glob("*.md"))
    assert read, "no CLUSTERCTL_* setting found: the pattern above no longer matches the code"
    assert sorted(s for s in read if s not in text) == []


def test_every_exit_status_is_in_docs_exit_codes():
    from clusterctl.errors import ExitCode
    from clusterctl.node import horovodrun
    from clusterctl.node.train import options

    text = (DOCS / "exit-codes.md").read_text()
    cli_table, _, job_table = text.partition("## The training job's own exit statuses")
    assert job_table, "docs/exit-codes.md lost its section on the training job's statuses"
    for code in ExitCode:
        assert re.search(rf"^\| {int(code)} \|", cli_table, re.M), code
    job = [v for k, v in vars(options).items() if k.startswith("EXIT_")] + [horovodrun.EXIT_TOO_FEW]
    for status in job:
        assert re.search(rf"^\| {status} \|", job_table, re.M), status
