"""docs/reference.md names everything a user can set or read: users rely on the reference being true.

Each test collects one kind of name from the code (the generated CRDs, the metrics the package
registers, the operator's settings, the chart's values) and fails with the exact names missing from
the reference, so whoever adds a field, a metric, a setting or a value knows which rows to write.
Metrics and CRD field rows are also checked the other way: a row naming something that no longer
exists is stale documentation.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import pkgutil
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import prometheus_client
import yaml

import loadline
from loadline.agent import _metrics as agent_metrics
from loadline.cli import build_parser
from loadline.handlers import OperatorSettings

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference.md"
CRDS = sorted((ROOT / "crds").glob("*.yaml"))
VALUES = ROOT / "charts" / "loadline" / "values.yaml"

#: A chart value key is a camelCase identifier; a mapping with any other key (a label map such as
#: agent.nodeSelector's ``nvidia.com/gpu.present``) is itself one value, not a group of values.
VALUE_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
#: A backquoted metric name in the reference.
METRIC_IN_TEXT = re.compile(r"`(loadline_[a-z0-9_]+)`")
#: The first cell of a CRD field row: | `spec.x.y` | ...
FIELD_ROW = re.compile(r"^\| `((?:spec|status)[A-Za-z0-9_.\[\]*]*)` \|", re.MULTILINE)


def reference_text() -> str:
    return REFERENCE.read_text(encoding="utf-8")


def _missing_message(kind: str, missing: list[str], how: str) -> str:
    lines = "\n".join(f"  {name}" for name in missing)
    return f"docs/reference.md lacks {len(missing)} {kind} ({how}):\n{lines}"


# --- CRD fields ----------------------------------------------------------------------------------


def _schema_fields(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every field under ``path`` with its schema, as ``kubectl explain`` reads paths; ``[]`` for a
    list of objects (a list of scalars is one field)."""
    if path:
        yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _schema_fields(sub, f"{path}.{name}" if path else name)
    items = schema.get("items")
    if isinstance(items, Mapping) and items.get("properties"):
        yield from _schema_fields(items, f"{path}[]")


def _row(path: str, schema: Mapping[str, Any]) -> str:
    """The reference's row for a field: type (with its values when an enum) and the CRD's description."""
    raw_items = schema.get("items")
    items: Mapping[str, Any] = raw_items if isinstance(raw_items, Mapping) else {}
    kind = str(schema.get("type") or ("object" if "properties" in schema else "any"))
    if kind == "array":
        kind = f"array of {items.get('type') or ('object' if 'properties' in items else 'any')}"
    values = schema.get("enum") or items.get("enum")
    if values:
        kind += ": " + ", ".join(f"`{v}`" for v in values)
    meaning = str(schema.get("description") or "").replace("\n", " ").replace("|", "\\|")
    return f"| `{path}` | {kind} | {meaning} |"


def crd_field_rows() -> dict[str, dict[str, str]]:
    """Per kind, every field under ``spec`` and ``status`` of every version in crds/, with its row."""
    out: dict[str, dict[str, str]] = {}
    for file in CRDS:
        crd = yaml.safe_load(file.read_text(encoding="utf-8"))
        rows = out.setdefault(crd["spec"]["names"]["kind"], {})
        for version in crd["spec"]["versions"]:
            for path, schema in _schema_fields(version["schema"]["openAPIV3Schema"], ""):
                if path.split(".")[0] in ("spec", "status"):
                    rows[path] = _row(path, schema)
    return out


def crd_field_paths() -> dict[str, set[str]]:
    return {kind: set(rows) for kind, rows in crd_field_rows().items()}


def test_the_crds_are_read() -> None:
    paths = crd_field_paths()
    assert set(paths) >= {"InferenceModel", "FleetPolicy"}
    assert "spec.model.name" in paths["InferenceModel"]
    assert "status.conditions[].reason" in paths["InferenceModel"]
    assert "spec.restarts.windows[].timezone" in paths["FleetPolicy"]


def test_every_crd_field_is_in_the_reference_as_the_crd_describes_it() -> None:
    """A row per field, with the type and description ``kubectl explain`` shows: a field added, or a
    description changed in the API models, fails here with the row to write."""
    lines = set(reference_text().splitlines())
    missing = sorted(
        f"{kind}: {row}"
        for kind, rows in crd_field_rows().items()
        for row in rows.values()
        if row not in lines
    )
    assert not missing, _missing_message(
        "CRD field rows",
        missing,
        "add each row below, made from crds/*.yaml, to its kind's table under 'Custom resources', "
        "replacing the field's old row if it has one",
    )


def test_every_crd_field_row_in_the_reference_exists() -> None:
    every = set().union(*crd_field_paths().values())
    stale = sorted(set(FIELD_ROW.findall(reference_text())) - every)
    assert not stale, f"docs/reference.md has rows for CRD fields that crds/*.yaml no longer has: {stale}"


# --- metrics -------------------------------------------------------------------------------------


#: prometheus_client's metric constructors; counters are scraped with ``_total``.
METRIC_CALLS = {
    "Counter": True,
    "CounterMetricFamily": True,
    "Gauge": False,
    "GaugeMetricFamily": False,
    "Histogram": False,
    "HistogramMetricFamily": False,
    "Summary": False,
    "SummaryMetricFamily": False,
    "Info": False,
    "InfoMetricFamily": False,
    "Enum": False,
}


def _scraped(name: str, counter: bool) -> str:
    return f"{name.removesuffix('_total')}_total" if counter else name


def metric_names_in_source() -> set[str]:
    """``loadline_*`` names passed as a literal to a metric constructor anywhere in the package.

    Reading the source finds a metric wherever it is made (at import, or in an object built at start).
    """
    names = set()
    for file in Path(loadline.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if (
                called in METRIC_CALLS
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and first.value.startswith("loadline_")
            ):
                names.add(_scraped(first.value, METRIC_CALLS[called]))
    return names


def registered_metric_names() -> set[str]:
    """Every ``loadline_*`` series family the package exports, as a scrape shows its name.

    The union of three sources: the metrics made with a literal name (the source), those registered
    in prometheus_client's default registry once every module is imported, and the agent collector's
    METRIC_NAMES (its gauges are made from a table of names).
    """
    for module in pkgutil.walk_packages(loadline.__path__, prefix="loadline."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    names = set(agent_metrics.METRIC_NAMES) | metric_names_in_source()
    for family in prometheus_client.REGISTRY.collect():
        if family.name.startswith("loadline_"):
            names.add(_scraped(family.name, family.type == "counter"))
    return names


def test_the_metrics_are_found() -> None:
    names = registered_metric_names()
    assert {"loadline_oom_incidents_total", "loadline_lane_wait_seconds", "loadline_gpu_info"} <= names
    in_source = metric_names_in_source()
    assert {"loadline_api_requests_total", "loadline_agent_nvml_errors_total"} <= in_source


def test_every_metric_is_in_the_reference() -> None:
    text = reference_text()
    missing = sorted(name for name in registered_metric_names() if f"| `{name}` |" not in text)
    assert not missing, _missing_message(
        "metrics", missing, "add a row `| `name` | type | labels | what |` under 'Metrics'"
    )


def test_every_metric_in_the_reference_exists() -> None:
    stale = sorted(set(METRIC_IN_TEXT.findall(reference_text())) - registered_metric_names())
    assert not stale, f"docs/reference.md names metrics the package does not export: {stale}"


# --- operator settings ---------------------------------------------------------------------------


def test_every_operator_setting_is_in_the_reference() -> None:
    text = reference_text()
    missing = sorted(
        f"| `LOADLINE_{name.upper()}` | `{field.default}` | — | {field.description} |"
        for name, field in OperatorSettings.model_fields.items()
        if f"| `LOADLINE_{name.upper()}` |" not in text
    )
    assert not missing, _missing_message(
        "operator settings",
        missing,
        "add each row below, from settings.py, under 'Operator settings', with the chart "
        "value that sets it (charts/loadline/templates/deployment.yaml) instead of —",
    )


# --- chart values --------------------------------------------------------------------------------


def _values(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value and all(VALUE_KEY.match(str(k)) for k in value):
            yield from _values(value, path)
        else:
            yield path, value


def chart_values() -> dict[str, Any]:
    """Every value of the chart with its default, by dotted key."""
    return dict(_values(yaml.safe_load(VALUES.read_text(encoding="utf-8"))))


def chart_value_keys() -> list[str]:
    return list(chart_values())


def test_the_chart_values_are_read() -> None:
    keys = chart_value_keys()
    assert {"replicas", "settings.restarts.windowMinutes", "agent.nodeSelector", "webhook.rotate"} <= set(
        keys
    )
    assert not any(key.startswith("agent.nodeSelector.") for key in keys)


def test_every_chart_value_is_in_the_reference() -> None:
    text = reference_text()
    missing = [
        f"| `{key}` | `{json.dumps(default)}` | … |"
        for key, default in chart_values().items()
        if f"| `{key}` |" not in text
    ]
    assert not missing, _missing_message(
        "chart values",
        missing,
        "add each row below under 'Helm chart values', its meaning as values.yaml comments it",
    )


# --- the README's layout -------------------------------------------------------------------------


def test_the_readme_layout_names_every_top_level_directory_and_package() -> None:
    """The README's layout table is where a newcomer finds their way: every directory must be in it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    top = [p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")]
    packages = [p.name for p in (ROOT / "operator" / "loadline").iterdir() if (p / "__init__.py").is_file()]
    missing = sorted(
        [f"{name}/" for name in top if f"`{name}/" not in layout]
        + [f"operator/loadline/{name}/" for name in packages if f"`operator/loadline/{name}/`" not in layout]
    )
    assert not missing, f"README.md's layout table lacks {missing}: add a row `| `path/` | what |` for each"


# --- CLI verbs -----------------------------------------------------------------------------------


def test_every_cli_verb_is_in_the_reference() -> None:
    parser = build_parser()
    [verbs] = [a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    text = reference_text().split("## `loadline` command", 1)[1]
    missing = sorted(verb for verb in verbs if f"| `{verb}` |" not in text)
    assert not missing, _missing_message(
        "CLI verbs", missing, "add a row `| `verb` | what | e.g. |` under '`loadline` command'"
    )
