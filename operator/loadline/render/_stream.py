"""Manifests as a YAML stream, the way ``helm template`` prints them, for GitOps repositories.

Each document starts with a comment naming the object and where it came from; the render notes (for
example "this vLLM version cannot offload KV cache to CPU") are repeated as comments so that a reviewer
of the committed YAML sees them without decoding annotations. Values are dumped by PyYAML, which quotes
every string that needs it, so the stream parses back to exactly the objects rendered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadline._yaml import dump_yaml


def _comment(text: str) -> str:
    return "\n".join(f"# {line}".rstrip() for line in text.splitlines() or [""])


def manifests_yaml(objects: Sequence[dict[str, Any]], source: str = "") -> str:
    """The objects as one YAML stream (``---`` separated), each with a header comment."""
    docs = []
    for obj in objects:
        meta = obj.get("metadata", {})
        where = f"{meta['namespace']}/" if meta.get("namespace") else ""
        header = [f"{obj.get('kind', '?')} {where}{meta.get('name', '?')}"]
        if source:
            header.append(f"Source: {source}")
        notes = (meta.get("annotations") or {}).get("loadline.dev/render-notes", "")
        header.extend(f"Note: {line}" for line in str(notes).splitlines() if line)
        body = dump_yaml(obj)
        docs.append("---\n" + "\n".join(_comment(line) for line in header) + "\n" + body)
    return "".join(docs)
