"""Keys of what an operator process remembers, by model and by object."""

from __future__ import annotations

#: (namespace, name) of an InferenceModel.
ModelKey = tuple[str, str]
#: (apiVersion, kind, namespace, name) of a child object.
ObjectKey = tuple[str, str, str | None, str]
