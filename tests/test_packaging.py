"""What installing drafter brings and what CI runs: every runtime dependency is one the served code imports
(a target process that installs drafter for its client pulls nothing for nothing), Python 3.11 to 3.13 are
admitted, and CI's tools are pinned and its venvs made from scratch, as on a new machine."""

from __future__ import annotations

import ast
import re
import tomllib

from tests.server_process import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
IMPORT_NAMES = {"prometheus-client": "prometheus_client"}  # where a distribution's import name differs
RUNTIME_PACKAGES = ("engine", "drafter", "export")


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower()


def imported_top_level(packages: tuple[str, ...]) -> set[str]:
    names = set()
    for package in packages:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names


def test_every_runtime_dependency_is_imported_by_the_served_code():
    imported = imported_top_level(RUNTIME_PACKAGES)
    for requirement in PYPROJECT["project"]["dependencies"]:
        name = requirement_name(requirement)
        assert IMPORT_NAMES.get(name, name.replace("-", "_")) in imported, f"{name} is installed for nothing"


def test_python_3_11_to_3_13_are_admitted():
    bounds = PYPROJECT["project"]["requires-python"]
    assert bounds.startswith(">=3.11") and ("<3.14" in bounds or "<4" in bounds), bounds


def test_ci_lints_with_a_pinned_ruff_and_installs_into_fresh_venvs():
    pins = [r for extra in PYPROJECT["project"]["optional-dependencies"].values() for r in extra]
    ruff = [r for r in pins if requirement_name(r) == "ruff"]
    assert ruff and all(re.fullmatch(r"ruff==[\d.]+", r.split("#")[0].strip()) for r in ruff), ruff
    scripts = [REPO / ".ci" / "run", *REPO.glob("bench/**/install*.sh")]
    for script in scripts:
        for line in script.read_text().splitlines():
            if "-m venv" in line and not line.lstrip().startswith("#"):
                assert "--clear" in line, f"{script.name} reuses an existing venv: {line.strip()}"
