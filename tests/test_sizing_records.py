"""quick_init builds the same frozen dataclass instances as the dataclass's own __init__."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from dataclasses import dataclass
from typing import Any

import pytest

from loadline.sizing import Candidate, EngineSettings, MemoryBudget, Plan, SpecInputs
from loadline.sizing._plan import Deferred, Later
from loadline.sizing._records import quick_init


@pytest.mark.parametrize("cls", [SpecInputs, EngineSettings, MemoryBudget, Candidate, Plan])
def test_signature_is_the_dataclass_fields(cls: type) -> None:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert p.default == (inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default)


@dataclass(frozen=True)
class _Plain:
    a: int
    b: str
    c: tuple[str, ...] = dataclasses.field(default=())
    d: float | None = None


@quick_init
@dataclass(frozen=True)
class _Quick:
    a: int
    b: str
    c: tuple[str, ...] = dataclasses.field(default=())
    d: float | None = None


@pytest.mark.parametrize(
    ("args", "kwargs"), [((1, "x"), {}), ((1, "x", ("n",)), {"d": 0.5}), ((), {"b": "y", "a": 2})]
)
def test_same_instance_as_the_generated_init(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    plain, quick = _Plain(*args, **kwargs), _Quick(*args, **kwargs)
    assert vars(quick) == vars(plain)
    assert list(vars(quick)) == list(vars(plain))  # field order
    assert repr(quick).removeprefix("_Quick") == repr(plain).removeprefix("_Plain")
    assert quick == _Quick(*args, **kwargs) and hash(quick) == hash(_Quick(*args, **kwargs))
    assert pickle.loads(pickle.dumps(quick)) == quick
    assert dataclasses.replace(quick, a=7).a == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.a = 3  # type: ignore[misc]


def test_arguments_checked_as_by_the_generated_init() -> None:
    with pytest.raises(TypeError):
        _Quick(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Quick(1, "x", e=2)  # type: ignore[call-arg]


def test_descriptor_fields_set_through_the_descriptor() -> None:
    @quick_init
    @dataclass(frozen=True)
    class Lazy:
        value: Deferred[int] = Deferred()  # noqa: RUF009 (a descriptor, as Plan.candidates)

    assert Lazy(Later(lambda: 4)).value == 4


def test_refuses_what_it_would_not_build_alike() -> None:
    @dataclass(frozen=True)
    class WithFactory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclass(frozen=True)
    class WithPostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass
    class NotFrozen:
        a: int

    for cls in (WithFactory, WithPostInit, NotFrozen):
        with pytest.raises(TypeError):
            quick_init(cls)
