"""A quicker ``__init__`` for the frozen dataclasses every plan builds.

A frozen dataclass's generated ``__init__`` sets each field through ``object.__setattr__`` (its own
``__setattr__`` refuses), which costs about 0.15 µs a field: 2.7 µs for :class:`EngineSettings`'s 15,
where writing the same values into the new instance's ``__dict__`` takes 0.7 µs. A plan builds its
:class:`SpecInputs`, the chosen candidate's settings and budget, the candidate and the plan, and a
refusal every rejected layout's settings, budget and candidate: some 10 µs of a 60 µs plan.

:func:`quick_init` replaces the generated ``__init__`` with one of the same parameters and defaults that
does that; the instance is the same (the same ``__dict__``, in field order; equality, hashing, ``repr``,
pickling and :func:`dataclasses.replace` are the dataclass's own) and stays frozen. It takes only the
dataclasses it knows how to build alike: every field in ``__init__``, positional, no default factory and
no ``__post_init__``. A field the class holds a data descriptor for (such as ``Plan.candidates``) is set
through the descriptor, as the generated ``__init__`` would.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["quick_init"]

C = TypeVar("C", bound=type)


def quick_init(cls: C) -> C:
    """Give the frozen dataclass ``cls`` an ``__init__`` that fills its ``__dict__`` directly (see the
    module's docstring); raises TypeError for a class it would not build as the dataclass does."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or not params.init:
        raise TypeError(f"{cls.__name__}: quick_init is for frozen dataclasses with a generated __init__")
    if hasattr(cls, "__post_init__") or getattr(cls, "__slots__", None) is not None:
        raise TypeError(f"{cls.__name__}: quick_init does not call __post_init__ nor fill slots")
    fields = dataclasses.fields(cls)
    if len(fields) != len(getattr(cls, "__dataclass_fields__", ())):
        raise TypeError(f"{cls.__name__}: quick_init does not take InitVar or ClassVar pseudo-fields")
    namespace: dict[str, Any] = {}
    params_src, body = ["self"], []
    for f in fields:
        if f.name.startswith("__quick_") or f.name == "self":
            raise TypeError(f"{cls.__name__}.{f.name}: a name quick_init's __init__ uses itself")
        if not f.init or f.kw_only or f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: quick_init takes positional fields, plain defaults")
        if f.default is dataclasses.MISSING:
            params_src.append(f.name)
        else:
            namespace[f"__quick_default_{f.name}"] = f.default
            params_src.append(f"{f.name}=__quick_default_{f.name}")
        descriptor = cls.__dict__.get(f.name)
        if descriptor is not None and hasattr(type(descriptor), "__set__"):
            namespace[f"__quick_set_{f.name}"] = type(descriptor).__set__
            namespace[f"__quick_descriptor_{f.name}"] = descriptor
            body.append(f"    __quick_set_{f.name}(__quick_descriptor_{f.name}, self, {f.name})")
        else:
            body.append(f"    __quick_dict[{f.name!r}] = {f.name}")
    head = f"def __init__({', '.join(params_src)}):\n    __quick_dict = self.__dict__\n"
    source = head + "\n".join(body) + "\n"
    exec(source, namespace)  # as dataclasses builds its own __init__
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = f"Build a {cls.__name__} (the dataclass's ``__init__``, quicker: :func:`quick_init`)."
    setattr(cls, "__init__", init)  # noqa: B010 (mypy refuses assigning __init__ on a type)
    return cls
