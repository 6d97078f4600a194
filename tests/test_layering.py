"""The architecture's one-way rule: only ``loadline.handlers`` (and the node agent's own process) talks to
kopf and the Kubernetes API; the pure core is tested without a cluster because it cannot reach one.

Read from the source, not from what happens to be imported: an import inside a function counts too.
``kubernetes.utils`` (quantity parsing) is a library of pure functions, not the API, and is allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "operator" / "loadline"

#: The pure core (the developers' guide's list, with the packages split out of the glue since).
PURE = [
    "api",
    "election",
    "maintenance",
    "observe",
    "oom",
    "pacing",
    "policy",
    "render",
    "risk",
    "sharding",
    "sizing",
    "state",
    "status",
    "upgrade",
    "windows",
]

#: Imports that reach kopf, the API server, or the glue.
FORBIDDEN = ("kopf", "kubernetes.client", "kubernetes.config", "kubernetes.dynamic", "kubernetes.watch")


def _imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            if node.module == "kubernetes":  # from kubernetes import client
                found += [(node.lineno, f"kubernetes.{alias.name}") for alias in node.names]
    return found


def _reaches_out(module: str) -> bool:
    if module == "loadline.handlers" or module.startswith("loadline.handlers."):
        return True
    return any(module == banned or module.startswith(banned + ".") for banned in FORBIDDEN)


@pytest.mark.parametrize("package", PURE)
def test_a_pure_package_imports_neither_kopf_nor_the_kubernetes_api_nor_the_handlers(package: str) -> None:
    files = sorted((PACKAGE / package).rglob("*.py"))
    assert files, f"loadline.{package} is gone: update the list of pure packages"
    offending = [
        f"{path.relative_to(PACKAGE)}:{line} imports {module}"
        for path in files
        for line, module in _imports(path)
        if _reaches_out(module)
    ]
    assert offending == []


def test_the_rule_sees_a_nested_import_of_the_client_and_allows_quantities(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from kubernetes.utils.quantity import parse_quantity\n"
        "def f():\n    from kubernetes import client\n    import kopf\n",
        encoding="utf-8",
    )
    assert [m for _, m in _imports(probe) if _reaches_out(m)] == ["kubernetes.client", "kopf"]
