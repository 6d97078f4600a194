"""The one jinja2 environment the manifests are rendered with, and its safety rules.

Templates are YAML text, and CR strings are user input: a value holding a newline, ``: `` or ``---``
placed raw into YAML would change the document's structure (YAML injection). So no value is ever
placed raw. The ``q`` filter emits a value as JSON, which is valid YAML flow syntax and a single
scalar (or flow collection) whatever it contains; the environment's ``finalize`` hook refuses any
``{{ expression }}`` whose result did not come from ``q`` (or from ``block``, which re-indents the
output of a macro: template text and ``q`` values only). Undefined variables raise
(``StrictUndefined``). Autoescape is off: this is YAML, not HTML.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

import yaml
from jinja2 import Environment, PackageLoader, StrictUndefined

# Characters YAML either forbids in a stream or treats as line breaks inside a quoted scalar (which
# would fold them away), but JSON leaves raw. They are written as \uXXXX escapes, which YAML reads back
# as the same character.
_YAML_UNSAFE = frozenset([*range(0x7F, 0xA0), 0x2028, 0x2029, 0xFEFF, 0xFFFE, 0xFFFF, *range(0xD800, 0xE000)])
#: The same set as one character class, searched in C rather than by a Python loop over every character
#: of every value (the chat example's three manifests: 1.20 → 1.13 ms a render, without a profiler).
_YAML_UNSAFE_RE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]")


class Placed(str):
    """Template output that is safe to splice into YAML: a JSON scalar or a block of template text."""


def _escape_unsafe(text: str) -> str:
    return _YAML_UNSAFE_RE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


def quote(value: Any) -> Placed:
    """Any JSON-able value as one YAML flow node (strings double-quoted with every character escaped
    that could end the scalar)."""
    return Placed(_escape_unsafe(json.dumps(value, ensure_ascii=False, sort_keys=False)))


def block(text: str, width: int) -> Placed:
    """A macro's output re-indented by ``width`` spaces (its first line too) for splicing as a block."""
    pad = " " * width
    lines = str(text).strip("\n").split("\n")
    return Placed("\n".join(pad + line if line.strip() else "" for line in lines))


def _finalize(value: Any) -> Any:
    if isinstance(value, Placed):
        return value
    raise TypeError(
        f"template placed {value!r} without the q filter; every value must go through | q "
        "so that no CR string can change the YAML structure"
    )


#: libyaml's parser where PyYAML was built with it (its wheels are): the same YAML, parsed in C. Every
#: value reaches the text through ``| q`` (JSON), which both parsers read alike (the golden tests hold).
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def environment() -> Environment:
    """The strict environment (templates are package data under ``render/templates``).

    ``auto_reload=False``: package data does not change under a running process, and jinja2's default
    checks each template file's mtime on every render (a twentieth of the operator's CPU while 1,000
    models were created, py-spy)."""
    env = Environment(
        loader=PackageLoader("loadline.render", "templates"),
        auto_reload=False,
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
    )
    env.filters["q"] = quote
    env.filters["block"] = block
    return env


def render_object(template: str, context: dict[str, Any]) -> dict[str, Any]:
    """Render one template to YAML text and parse it back into the object it describes."""
    text = environment().get_template(template).render(**context)
    obj = yaml.load(text, Loader=_LOADER)
    if not isinstance(obj, dict):
        raise TypeError(f"template {template} did not render a mapping")
    return obj
