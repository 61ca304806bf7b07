"""The docs against the tree: every `.venv/bin/python -m MODULE` the README, docs/*.md and bench/README.md
write names a module whose `--help` exits 0, and no command block runs a bare `python` (the set-up does not
activate .venv); every `bash PATH`, repository path and dotted module they name exists; the configuration
page lists every server flag and no other; and, where MkDocs is installed, the site builds with
`mkdocs build --strict` (a dead link, a missing page or a bad anchor fails it).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from drafter.server.cli import OPTIONS, SWITCHES

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# First folders of the repository's tracked paths; `out/`, `build/` and placeholders are not checked.
ROOTS = ("engine", "drafter", "export", "bench", "tests", "docs", ".ci")
ROOT_FILES = ("serve.sh", "pyproject.toml", "mkdocs.yml", "README.md")
PACKAGES = ("engine", "drafter", "export", "bench")
FILE_SUFFIXES = {"py", "sh", "md", "json", "jsonl", "toml", "yml", "png", "safetensors", "xml", "log"}

# `bench.<name>` is a placeholder, not a module: a name followed by `.<` is not taken.
MODULE_COMMAND = re.compile(r"\.venv/bin/python -m ([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?![\w.<])")
BARE_PYTHON = re.compile(r"^\s*(?:[A-Z_]+=\S+\s+)*(python3?)\s+(?!-m venv\b)", re.M)
BASH_COMMAND = re.compile(r"\bbash (\S+)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")
FOLDERS, FILES = ("|".join(re.escape(name) for name in names) for names in (ROOTS, ROOT_FILES))
PATH = re.compile(rf"(?:\./)?(?:(?:{FOLDERS})/[\w.{{}},/-]*|{FILES})")
DOTTED = re.compile(rf"(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+")


def page_name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def code_text(text: str) -> str:
    """Fenced blocks and inline code spans: where the pages write commands, paths and names."""
    blocks = FENCE.findall(text)
    return "\n".join([*blocks, *INLINE.findall(FENCE.sub("", text))])


def words(code: str) -> list[str]:
    return [word.strip("\"'()[]<>,;:") for word in code.split()]


def expand_braces(path: str) -> list[str]:
    """`bench/device/{plan,report}.py` -> both paths, as a shell expands them."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    head, tail = path[: match.start()], path[match.end() :]
    return [expanded for part in match.group(1).split(",") for expanded in expand_braces(head + part + tail)]


def module_commands() -> dict[str, list[str]]:
    """Module -> the pages that run it as `.venv/bin/python -m MODULE`."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for module in sorted(set(MODULE_COMMAND.findall(page.read_text()))):
            found.setdefault(module, []).append(page_name(page))
    return found


def named_paths() -> list[tuple[str, str]]:
    """(page, path) for every `bash PATH` and every repository path in the pages' code."""
    found = set()
    for page in PAGES:
        text = page.read_text()
        code = code_text(text)
        candidates = BASH_COMMAND.findall(code)
        candidates += [word for word in words(code) if PATH.fullmatch(word)]
        for candidate in candidates:
            if not any(mark in candidate for mark in "*$"):
                found.update((page_name(page), path) for path in expand_braces(candidate))
    return sorted(found)


def named_modules() -> list[tuple[str, str]]:
    """(page, dotted name) for every `drafter.x.y`-style name in the pages' code."""
    found = set()
    for page in PAGES:
        for word in words(code_text(page.read_text())):
            if DOTTED.fullmatch(word) and word.rsplit(".", 1)[1] not in FILE_SUFFIXES:
                found.add((page_name(page), word))
    return sorted(found)


MODULES = module_commands()


def test_pages_exist_and_run_commands():
    assert (ROOT / "docs" / "index.md").is_file()
    assert "pytest" in MODULES and "drafter.client" in MODULES  # the scan finds what is there


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_docs_commands_use_the_venv(page):
    lines = [line.strip() for line in code_text(page.read_text()).splitlines()]
    bare = [line for line in lines if BARE_PYTHON.match(line)]
    assert bare == [], f"{page_name(page)} runs a bare python (use .venv/bin/python): {bare}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_docs_module_exists(module):
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        spec = None
    assert spec is not None, f"`.venv/bin/python -m {module}` ({', '.join(MODULES[module])}): no such module"


@functools.cache
def help_results() -> dict[str, subprocess.CompletedProcess]:
    """`python -m MODULE --help` for every module the pages run, a few at a time (most import torch)."""

    def run(module: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", module, "--help"]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 2)) as pool:
        return dict(zip(MODULES, pool.map(run, MODULES), strict=True))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_docs_module_help_runs(module):
    result = help_results()[module]
    tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
    assert result.returncode == 0, (
        f"`.venv/bin/python -m {module} --help` ({', '.join(MODULES[module])}) exited {result.returncode}: "
        + " / ".join(tail)
    )


@pytest.mark.parametrize(("page", "path"), named_paths())
def test_docs_path_exists(page, path):
    assert (ROOT / path).exists(), f"{page} names {path}, which is not in the repository"


@pytest.mark.parametrize(("page", "name"), named_modules())
def test_docs_dotted_name_exists(page, name):
    parts = name.split(".")
    for split in range(len(parts), 0, -1):  # the longest prefix that is a module or package
        base = ROOT.joinpath(*parts[:split])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            break
    else:
        pytest.fail(f"{page} names {name}: no such module")
    attributes = parts[split:]
    assert len(attributes) <= 1, f"{page} names {name}: no module {'.'.join(parts[: split + 1])}"
    if attributes:
        assert re.search(rf"\b{attributes[0]}\b", module.read_text()), f"{page} names {name}: not in {module}"


def test_docs_configuration_lists_every_server_flag():
    text = (ROOT / "docs" / "configuration.md").read_text()
    flags = {f"--{name}" for name in OPTIONS} | {f"--{name}" for name in SWITCHES}
    flags |= {f"--no-{name}" for name in SWITCHES}
    rows = [line for line in text.splitlines() if line.startswith("| `--")]
    listed = {flag for row in rows for flag in re.findall(r"`(--[a-z-]+)`", row.split("|")[1])}
    assert flags - listed == set(), "server flags missing from docs/configuration.md"
    assert listed - flags == set(), "docs/configuration.md lists flags the server does not have"


def test_docs_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="MkDocs is not installed: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="mkdocs-material is not installed: pip install -e '.[docs]'")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(warnings or [result.stderr])


def test_the_api_page_lists_every_error_the_server_answers():
    """Every (status, type) an ApiError is raised with, Starlette's own 404 and 405, and Hypercorn's 431."""
    from drafter.server.errors import HTTP_TYPES

    raised = set()
    for path in (ROOT / "drafter").rglob("*.py"):
        found = re.findall(r"ApiError\(\s*(\d{3}),\s*\"(\w+)\"", path.read_text())
        raised.update((int(status), kind) for status, kind in found)
    raised.update(HTTP_TYPES.items())
    assert len(raised) >= 12, raised
    api = (ROOT / "docs" / "api.md").read_text()
    for status, kind in sorted(raised):
        assert f"| `{status}` | `{kind}` |" in api, f"docs/api.md does not list {status} {kind}"
    assert "`431`" in api
