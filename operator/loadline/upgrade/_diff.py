"""What a new render would change in the pods a workload runs, field by field, in words.

The live workload is compared with the rendered one on what the render sets: every field of the
rendered pod template must hold the same value live. Fields only the live object has are the API
server's defaults (``terminationMessagePath``, a probe's ``successThreshold``) or another field
manager's, and are not differences, except for what the render owns as a whole: the container's
``args``, its environment variables, the volumes and mounts by name, and labels and annotations under
loadline's prefixes. Resource quantities are compared as quantities (the API server may store
``0.5`` as ``500m``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from kubernetes.utils.quantity import parse_quantity as _untyped_parse_quantity

from loadline.upgrade._stamp import pod_templates

__all__ = ["Difference", "DifferenceKind", "template_differences"]

DifferenceKind = Literal["image", "flag", "env", "probe", "label", "annotation", "resources", "field"]

#: Lists the render owns whole, keyed by each item's ``name``: an item only live was removed.
_OWNED_LISTS = frozenset({"containers", "initContainers", "env", "volumes", "volumeMounts"})
#: Label and annotation prefixes the render owns: a key only live under these was removed.
_OWNED_PREFIXES = ("loadline.dev/", "app.kubernetes.io/")
_PROBES = frozenset({"startupProbe", "readinessProbe", "livenessProbe"})

Path = tuple[str, ...]
parse_quantity: Callable[[object], Decimal] = _untyped_parse_quantity  # the client ships no types


@dataclass(frozen=True)
class Difference:
    """One change the new render makes to the pods. ``before``/``after`` None: absent."""

    kind: DifferenceKind
    #: The flag, variable, probe, label or field it concerns (``--max-model-len``, ``HF_HOME``).
    name: str
    before: str | None
    after: str | None
    #: Which pod template, for a LeaderWorkerSet (``leader``/``worker``); empty for a Deployment.
    template: str = ""

    @property
    def words(self) -> str:
        """The change in a phrase: ``env PYTORCH_ALLOC_CONF added (expandable_segments:True)``."""
        where = f"{self.template}: " if self.template else ""
        subject = f"{self.kind} {self.name}" if self.kind != "image" else "image"
        if self.before is None:
            return f"{where}{subject} added ({self.after})"
        if self.after is None:
            return f"{where}{subject} removed (was {self.before})"
        return f"{where}{subject} {self.before} → {self.after}"


def _text(value: Any) -> str:
    if isinstance(value, Mapping) and "name" in value:  # a removed item: what it held, not its name
        value = {k: v for k, v in value.items() if k != "name"}
        value = value["value"] if set(value) == {"value"} else value
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def _named(items: Sequence[Any]) -> bool:
    return bool(items) and all(isinstance(i, Mapping) and "name" in i for i in items)


def _leaves(node: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """``(path, value)`` of every leaf; a list of named items is keyed by name (``env[HF_HOME]``),
    any other list is one leaf (compared whole)."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _leaves(value, (*path, str(key)))
    elif isinstance(node, list) and _named(node):
        for item in node:
            yield from _leaves({k: v for k, v in item.items() if k != "name"}, (*path, f"[{item['name']}]"))
            if len(item) == 1:  # a named item with nothing but its name is still there
                yield (*path, f"[{item['name']}]"), {}
    else:
        yield path, node


def _get(node: Any, path: Path) -> tuple[bool, Any]:
    for key in path:
        if key.startswith("[") and isinstance(node, list):
            node = next((i for i in node if isinstance(i, Mapping) and f"[{i.get('name')}]" == key), None)
            if node is None:
                return False, None
        elif isinstance(node, Mapping) and key in node:
            node = node[key]
        else:
            return False, None
    return True, node


def _same(path: Path, live: Any, rendered: Any) -> bool:
    if live == rendered:
        return True
    if (
        "resources" in path
        and isinstance(live, str | int | float)
        and isinstance(rendered, str | int | float)
    ):
        try:
            return bool(parse_quantity(live) == parse_quantity(rendered))
        except ValueError:
            return False
    return False


def _flags(args: Sequence[Any]) -> dict[str, str | None]:
    """``--flag value`` pairs of vLLM's command line (a flag with no value: None); the positional
    model name is keyed by ``model``."""
    out: dict[str, str | None] = {}
    items = [str(a) for a in args]
    for i, arg in enumerate(items):
        if arg.startswith("--"):
            name, _, inline = arg.partition("=")
            following = items[i + 1] if i + 1 < len(items) and not items[i + 1].startswith("--") else None
            out[name] = inline if inline else following
        elif i == 0 or not items[i - 1].startswith("--"):
            out.setdefault("model", arg)
    return out


def _flag_differences(live: Any, rendered: Any, template: str) -> list[Difference]:
    before, after = _flags(live or []), _flags(rendered or [])
    out = []
    for flag in sorted(before.keys() | after.keys()):
        if flag not in after:
            out.append(Difference("flag", flag, before[flag] or "set", None, template))
        elif flag not in before:
            out.append(Difference("flag", flag, None, after[flag] or "set", template))
        elif before[flag] != after[flag]:
            out.append(Difference("flag", flag, before[flag] or "set", after[flag] or "set", template))
    if not out and list(map(str, live or [])) != list(map(str, rendered or [])):
        out.append(Difference("flag", "order", " ".join(map(str, live or [])), " ".join(map(str, rendered))))
    return out


def _classify(path: Path, before: Any, after: Any, template: str) -> Difference:
    """The difference at ``path`` (inside one pod template) under the name a person knows it by."""
    b = None if before is None else _text(before)
    a = None if after is None else _text(after)
    tail = [p for p in path if not p.startswith("[")]
    keys = [p.strip("[]") for p in path if p.startswith("[")]
    if path[:2] == ("metadata", "labels"):
        return Difference("label", path[2], b, a, template)
    if path[:2] == ("metadata", "annotations"):
        return Difference("annotation", path[2], b, a, template)
    if "env" in path:
        return Difference("env", keys[-1], b, a, template)
    probe = next((p for p in path if p in _PROBES), None)
    if probe is not None:
        rest = ".".join(path[path.index(probe) + 1 :])
        return Difference("probe", f"{probe} {rest}".strip(), b, a, template)
    if tail[-1:] == ["image"]:
        return Difference("image", keys[-1] if keys else "", b, a, template)
    if "resources" in path:
        return Difference("resources", ".".join(path[path.index("resources") + 1 :]), b, a, template)
    return Difference("field", ".".join(path), b, a, template)


def _one_template(live: Any, rendered: Any, template: str) -> list[Difference]:
    out: list[Difference] = []
    for path, value in _leaves(rendered):
        if path[-1:] == ("args",):
            found, old = _get(live, path)
            out.extend(_flag_differences(old if found else [], value, template))
            continue
        found, old = _get(live, path)
        if not found:
            out.append(_classify(path, None, value, template))
        elif not _same(path, old, value):
            out.append(_classify(path, old, value, template))
    for path, _value in _leaves(live):
        owned_item = any(
            path[i].startswith("[") and i > 0 and path[i - 1] in _OWNED_LISTS for i in range(len(path))
        )
        owned_key = path[:2] in (("metadata", "labels"), ("metadata", "annotations")) and path[2].startswith(
            _OWNED_PREFIXES
        )
        if not (owned_item or owned_key):
            continue
        # Removed: the owned item (or key) is not rendered at all; a default inside a rendered item is not.
        cut = (
            path[:3] if owned_key else path[: max(i for i in range(len(path)) if path[i].startswith("[")) + 1]
        )
        if not _get(rendered, cut)[0]:
            out.append(_classify(cut, _get(live, cut)[1], None, template))
    return out


def template_differences(live: Mapping[str, Any], rendered: Mapping[str, Any]) -> list[Difference]:
    """What applying ``rendered`` over the ``live`` workload (same kind and name) changes in its pod
    templates, in order; empty: the pods would not roll."""
    live_templates, rendered_templates = pod_templates(live), pod_templates(rendered)
    out: list[Difference] = []
    for path, template in rendered_templates.items():
        label = "" if path == "spec.template" else path.rsplit(".", 1)[-1].removesuffix("Template")
        out.extend(_one_template(live_templates.get(path) or {}, template, label))
    unique: dict[tuple[str, str, str], Difference] = {}
    for difference in out:  # one line per variable or item (a removed env var is one change)
        unique.setdefault((difference.kind, difference.name, difference.template), difference)
    return list(unique.values())
