"""Building many instances of a frozen, slotted dataclass cheaply (a restart builds 50,000 Jobs and as many
scheduling views of them).

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (the class refuses its own
``__setattr__``): a global lookup, an attribute lookup and a call per field, ~3.7 us for a 19-field Job. Setting
the slots through their descriptors, bound once, took ~2 us. The functions made here build the object as an
instance of a plain class with the very same slots (its "twin", whose attributes are set as any object's:
~20 ns a field), then give it the dataclass as its class: Python allows that assignment only between classes
whose instances are laid out alike (the same slots on the same base), and checks it, so what comes out is an
ordinary instance of the dataclass, equal to one ``__init__`` makes (~0.4 us a Job). They are generated from
the class's own fields and defaults, as dataclasses generates ``__init__``, so they take the same arguments and
follow the class; they refuse classes whose ``__init__`` would do more (``__post_init__``, default factories,
fields left out of ``__init__``) and those with a base class of their own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _twin(cls: type) -> type:
    """A plain class whose instances are laid out as ``cls``'s; checked by making one of them a ``cls``."""
    slots = cls.__dict__["__slots__"]
    twin = type(f"_{cls.__name__}Slots", (object,), {"__slots__": slots})
    probe: Any = object.__new__(twin)
    probe.__class__ = cls  # TypeError where the layouts differ
    return twin


def _checked_fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    if (not dataclasses.is_dataclass(cls) or "__slots__" not in cls.__dict__ or hasattr(cls, "__post_init__")
            or cls.__bases__ != (object,)):
        raise TypeError(f"{cls.__name__}: not a slotted dataclass without __post_init__ or base classes")
    for field in dataclasses.fields(cls):
        if not field.init or field.default_factory is not dataclasses.MISSING or field.kw_only:
            raise TypeError(f"{cls.__name__}.{field.name}: only plain fields, with at most a plain default")
    return dataclasses.fields(cls)


def constructor_without_init(cls: type[T]) -> Callable[..., T]:
    """A function that builds ``cls(*args, **kwargs)`` without running its ``__init__``."""
    fields = _checked_fields(cls)
    namespace: dict[str, Any] = {"_new": object.__new__, "_twin": _twin(cls), "_cls": cls}
    params, body = [], []
    for field in fields:
        if field.default is dataclasses.MISSING:
            params.append(field.name)
        else:
            namespace[f"_default_{field.name}"] = field.default
            params.append(f"{field.name}=_default_{field.name}")
        body.append(f"    made.{field.name} = {field.name}\n")
    exec(f"def make({', '.join(params)}):\n    made = _new(_twin)\n{''.join(body)}"
         "    made.__class__ = _cls\n    return made\n", namespace)
    made: Callable[..., T] = namespace["make"]
    made.__qualname__ = made.__name__ = f"new_{cls.__name__}"
    return made


def replacer(cls: type[T], name: str) -> Callable[[T, Any], T]:
    """A function ``(obj, value)`` that builds ``dataclasses.replace(obj, **{name: value})`` without running
    ``__init__``: every other field copied as it is."""
    names = [field.name for field in _checked_fields(cls)]
    if name not in names:
        raise TypeError(f"{cls.__name__} has no field {name!r}")
    namespace: dict[str, Any] = {"_new": object.__new__, "_twin": _twin(cls), "_cls": cls}
    body = "".join(f"    made.{field} = {'value' if field == name else f'old.{field}'}\n" for field in names)
    exec(f"def with_(old, value):\n    made = _new(_twin)\n{body}    made.__class__ = _cls\n    return made\n",
         namespace)
    made: Callable[[T, Any], T] = namespace["with_"]
    made.__qualname__ = made.__name__ = f"{cls.__name__}_with_{name}"
    return made
