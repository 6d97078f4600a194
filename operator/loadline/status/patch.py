"""JSON patches (RFC 6902) of an object's status that the API server applies only while what a decision
read still holds: a ``test`` of each value read, then the writes, applied atomically (a changed value
refuses the whole patch with 422). Pure: :func:`loadline.handlers._kube.patch_status_tested` sends them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["build_tested_status_patch", "merged", "testable", "value_at"]


def _pointer(path: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]]


def value_at(obj: Any, path: str) -> Any:
    """The value at a JSON pointer (``/status/conditions/2/type``) of ``obj``; None when a part of it
    is absent."""
    node: Any = obj
    for part in _pointer(path):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def testable(value: Any) -> bool:
    """Whether kube-apiserver's ``test`` op compares ``value`` as JSON: null, a boolean, an integer, or
    a plain ASCII string. It compares strings and numbers as the bytes Go's encoder wrote (json-patch
    v4), which escapes ``<``, ``>`` and ``&`` and formats floats its own way: a test on a plan's text
    ("... < 22 GiB the pod needs") never matches what a client sends, checked on the local control
    plane. Objects, lists and floats are tested through such scalars of theirs, or not at all."""
    if value is None or isinstance(value, bool | int):
        return True
    return (
        isinstance(value, str) and value.isascii() and value.isprintable() and not set(value) & set('<>&"\\')
    )


def build_tested_status_patch(
    obj: Mapping[str, Any], sets: Mapping[str, Any], tested: tuple[str, ...]
) -> list[dict[str, Any]] | None:
    """A JSON patch (RFC 6902) that sets each JSON pointer of ``sets`` to its value, preceded by a
    ``test`` of every path of ``tested`` against what ``obj`` holds there; None when one of those values
    is not :func:`testable`. The API server applies it atomically and refuses it (422) when a tested
    value changed; a path whose last part ``obj`` lacks is tested as null, which the API server takes as
    "still absent" (a missing parent is refused, so test the parent then)."""
    tests = [{"op": "test", "path": path, "value": value_at(obj, path)} for path in tested]
    if not all(testable(test["value"]) for test in tests):
        return None
    return [
        *tests,
        *({"op": _set_op(obj, path), "path": path, "value": value} for path, value in sets.items()),
    ]


def _set_op(obj: Mapping[str, Any], path: str) -> str:
    """ "replace" for an element of a list ("add" would insert one before it), else "add" (which sets an
    object's member whether or not it is there)."""
    parent = value_at(obj, path.rsplit("/", 1)[0])
    return "replace" if isinstance(parent, list) else "add"


def merged(target: Any, patch: Any) -> Any:
    """``patch`` merged into ``target`` as a JSON merge patch (RFC 7386) merges it: objects member by
    member, a null member removed, anything else replaced."""
    if not isinstance(patch, Mapping):
        return patch
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merged(result.get(key), value)
    return result
