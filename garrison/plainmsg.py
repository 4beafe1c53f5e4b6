"""Protobuf messages as plain JSON values, for the two CLI calls that must not import protobuf.

Why: importing protobuf and the generated modules costs ~50 ms on the project's small machines, half the
100 ms a `gsub` or `gqueue` call may take. On the controller's local socket these calls send and receive
the same messages as plain JSON instead (controller/rpc/local.py), and the CLI reads the answer through
``PlainMessage``, which looks like the message to the render code (attribute access, ``HasField``). The
controller still parses every request into its typed message, strictly, before the servicer sees it.

The plain form of a message is a dict keyed by proto field names: every field without presence (its
default when unset), a field with presence (``optional``, a sub-message) only when set, repeated fields
as lists, maps as dicts, enums as numbers, 64-bit integers as JSON numbers (and an infinite or NaN float,
bytes, as protobuf's JSON mapping writes them: "Infinity", base64). ``from_plain`` also takes
what protobuf's JSON mapping takes (json_format.ParseDict), which is a superset.

``to_plain`` and ``from_plain`` need message objects (the controller side, or the CLI's gRPC fallback);
``PlainMessage`` needs nothing, and this module imports nothing heavy.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing costs a CLI call ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any, TypeAlias, TypeVar

    from google.protobuf.message import Message

    M = TypeVar("M", bound=Message)
    _Convert: TypeAlias = Callable[[Any], Any] | None  # None: the value is already plain (most scalars)
    _Plan: TypeAlias = tuple[dict[str, Any], tuple[str, ...], tuple[str, ...], dict[int, _Convert]]


# On the controller's local socket, a method name with this suffix (SubmitJob+json) carries its request and
# its answer in plain form (controller/rpc/local.py).
PLAIN_METHOD_SUFFIX = "+json"


class PlainError(ValueError):
    """A plain value that is not a valid message of the type asked for; the message says why, in one line."""


def to_plain(message: Any) -> dict[str, Any]:
    """The plain form of ``message`` (a protobuf message object)."""
    defaults, repeated, maps, convert = _plan(message.DESCRIPTOR)
    out = defaults.copy()
    for name in repeated:
        out[name] = []
    for name in maps:
        out[name] = {}
    # ListFields (C) yields only the fields that are set: a queue of thousands of jobs converts in
    # milliseconds, where asking every field of every message took ~40 us a job.
    for field, value in message.ListFields():
        one = convert[field.number]
        out[field.name] = value if one is None else one(value)
    return out


_PLANS: dict[Any, _Plan] = {}


def _plan(descriptor: Any) -> _Plan:
    """Per message type: the plain form of an empty message (fields without presence at their default),
    the repeated fields and the maps (fresh lists and dicts), and how to convert each field that is set."""
    plan = _PLANS.get(descriptor)
    if plan is not None:
        return plan
    defaults: dict[str, Any] = {}
    repeated: list[str] = []
    maps: list[str] = []
    convert: dict[int, _Convert] = {}
    for field in descriptor.fields:
        if field.is_repeated:
            entry = field.message_type
            if entry is not None and entry.GetOptions().map_entry:
                maps.append(field.name)
                convert[field.number] = _map_of(_converter(entry.fields_by_name["value"]))
            else:
                repeated.append(field.name)
                convert[field.number] = _list_of(_converter(field))
        else:
            one = _converter(field)
            if not field.has_presence:
                defaults[field.name] = field.default_value if one is None else one(field.default_value)
            convert[field.number] = one
    plan = _PLANS[descriptor] = (defaults, tuple(repeated), tuple(maps), convert)
    return plan


def _converter(field: Any) -> _Convert:
    if field.type == field.TYPE_MESSAGE:
        return to_plain
    if field.type in (field.TYPE_DOUBLE, field.TYPE_FLOAT):
        return _float
    if field.type == field.TYPE_BYTES:
        return _bytes
    return None


def _list_of(one: _Convert) -> Callable[[Any], Any]:
    if one is None:
        return list
    return lambda values: [one(item) for item in values]


def _map_of(one: _Convert) -> Callable[[Any], Any]:
    if one is None:
        return dict
    return lambda entries: {key: one(item) for key, item in entries.items()}


def _float(value: float) -> float | str:
    if value - value == 0:
        return value
    # Infinity and NaN are not JSON numbers; protobuf's JSON mapping writes them as these strings.
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def _bytes(value: bytes) -> str:
    import base64

    return base64.b64encode(value).decode("ascii")  # as protobuf's JSON mapping writes bytes


def from_plain(data: Any, message_type: type[M]) -> M:
    """A ``message_type`` message from its plain form; PlainError for unknown fields or wrong types."""
    from google.protobuf import json_format

    if not isinstance(data, dict):
        raise PlainError(f"expected a JSON object for {message_type.__name__}, got {type(data).__name__}")
    message = message_type()
    try:
        _fill(message, data)
        return message
    except _Unusual:
        pass
    try:
        return json_format.ParseDict(data, message_type())
    except json_format.ParseError as err:
        raise PlainError(str(err).splitlines()[0]) from None


class _Unusual(Exception):
    """The fast path met something it leaves to json_format.ParseDict: a name or form it does not take
    itself (JSON names, enum names, strings for numbers, nulls, well-known types) or a value that is wrong,
    for ParseDict to refuse with its own message."""


_FILL_PLANS: dict[Any, dict[str, tuple[Any, int, Any]]] = {}


def _fill_plan(descriptor: Any) -> dict[str, tuple[Any, int, Any]]:
    """Per message type: each field's name -> (field, kind, the map's value field or None)."""
    plan = _FILL_PLANS.get(descriptor)
    if plan is None:
        plan = {}
        for field in descriptor.fields:
            entry = field.message_type
            if field.is_repeated and entry is not None and entry.GetOptions().map_entry:
                plan[field.name] = (field, _MAP, entry.fields_by_name["value"])
            elif field.is_repeated:
                plan[field.name] = (field, _REPEATED, None)
            else:
                plan[field.name] = (field, _SINGLE, None)
        _FILL_PLANS[descriptor] = plan
    return plan


_SINGLE, _REPEATED, _MAP = 0, 1, 2


def _scalar_ok(field: Any, value: Any) -> bool:
    """Whether ``value`` is a plain scalar protobuf takes for ``field`` as it is (its own range checks still
    apply on assignment). bool is an int in Python, and not a number in protobuf's JSON: it is refused for
    numbers, as ParseDict refuses it."""
    kind = field.type
    if kind == field.TYPE_STRING:
        return type(value) is str
    if kind == field.TYPE_BOOL:
        return type(value) is bool
    if kind in (field.TYPE_DOUBLE, field.TYPE_FLOAT):
        return type(value) is float or type(value) is int
    if kind in (field.TYPE_MESSAGE, field.TYPE_GROUP, field.TYPE_BYTES, field.TYPE_ENUM):
        return False  # not a scalar taken as it is (bytes arrive as base64 text, enums maybe by name)
    return type(value) is int


def _bytes_from_json(value: str) -> bytes:
    """Base64 text as json_format reads it (padding added, either alphabet), so both paths agree."""
    import base64

    encoded = value.encode("utf-8")
    return base64.urlsafe_b64decode(encoded + b"=" * (4 - len(encoded) % 4))


def _well_known(message_type: Any) -> bool:
    """Whether a message field's type is one of protobuf's well-known types (Timestamp, Struct, ...), whose
    JSON forms are not a dict of their fields: ParseDict reads those."""
    return message_type.full_name.startswith("google.protobuf.")  # type: ignore[no-any-return]


def _fill(message: Any, data: dict[str, Any]) -> None:
    """``data``'s fields into ``message``, for the common plain forms the CLI sends; _Unusual for anything
    else. json_format.ParseDict takes ~0.2 ms for a gsub's request (its 35-odd environment variables) on a quiet
    machine of the project's, this ~20 us."""
    descriptor = message.DESCRIPTOR
    plan = _fill_plan(descriptor)
    oneofs_seen: set[str] = set()
    for name, value in data.items():
        entry = plan.get(name)
        if entry is None:
            raise _Unusual  # a JSON name (camelCase) or an unknown field: ParseDict says which
        field, kind, value_field = entry
        if field.containing_oneof is not None:
            if field.containing_oneof.name in oneofs_seen:
                raise _Unusual  # two members of one oneof: ParseDict refuses it
            oneofs_seen.add(field.containing_oneof.name)
        try:
            if kind == _SINGLE:
                if field.type == field.TYPE_MESSAGE:
                    if type(value) is not dict or _well_known(field.message_type):
                        raise _Unusual
                    child = getattr(message, name)
                    child.SetInParent()
                    _fill(child, value)
                elif field.type == field.TYPE_BYTES and type(value) is str:
                    setattr(message, name, _bytes_from_json(value))  # a script, standard input
                elif field.type == field.TYPE_ENUM and type(value) is int:
                    if field.enum_type.values_by_number.get(value) is None and field.enum_type.is_closed:
                        raise _Unusual
                    setattr(message, name, value)
                elif _scalar_ok(field, value):
                    setattr(message, name, value)
                else:
                    raise _Unusual
            elif kind == _REPEATED:
                if type(value) is not list:
                    raise _Unusual
                if field.type == field.TYPE_MESSAGE:
                    if _well_known(field.message_type):
                        raise _Unusual
                    container = getattr(message, name)
                    for item in value:
                        if type(item) is not dict:
                            raise _Unusual
                        _fill(container.add(), item)
                elif all(_scalar_ok(field, item) for item in value):
                    getattr(message, name).extend(value)
                else:
                    raise _Unusual
            else:
                key_field = field.message_type.fields_by_name["key"]
                if type(value) is not dict or key_field.type != key_field.TYPE_STRING:
                    raise _Unusual  # integer keys arrive as JSON strings: ParseDict converts them
                container = getattr(message, name)
                if value_field.type == value_field.TYPE_MESSAGE:
                    if _well_known(value_field.message_type):
                        raise _Unusual
                    for key, item in value.items():
                        if type(item) is not dict:
                            raise _Unusual
                        _fill(container[key], item)
                elif all(_scalar_ok(value_field, item) for item in value.values()):
                    container.update(value)
                else:
                    raise _Unusual
        except (TypeError, ValueError):
            raise _Unusual from None  # out of range, say: ParseDict's message names the field


def parse_plain(body: bytes, message_type: type[M]) -> M:
    """``from_plain`` of a JSON document; PlainError also for text that is not JSON."""
    import json

    try:
        data = json.loads(body)
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise PlainError(f"not JSON: {err}") from None
    return from_plain(data, message_type)


def dump_plain(message: Any) -> bytes:
    """The plain form of ``message`` as compact JSON."""
    import json

    return json.dumps(to_plain(message), separators=(",", ":")).encode()


if TYPE_CHECKING:
    _ReadOnlyMapping = Mapping[str, Any]
else:
    # A Mapping to type checkers, not at run time: collections.abc's Mapping comes with _collections_abc, which
    # gjob and gqueue launched without site have not loaded (~3 M instructions, callgrind). The methods a
    # Mapping's mixins would give are written out below.
    _ReadOnlyMapping = object


class PlainMessage(_ReadOnlyMapping):
    """A read-only view of a plain message that reads like the message: ``job.state``, ``job.HasField(...)``,
    ``for a in job.attempts``. A field the plain form leaves out (an unset ``optional``) raises
    AttributeError on access, so code that reads one without ``HasField`` fails loudly in tests. A map field
    (``env``) reads as a read-only mapping: ``[]``, ``get``, ``in``, ``keys``, ``items``, ``values``, ``==``."""

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getattr__(self, name: str) -> Any:
        try:
            value = self._data[name]
        except KeyError:
            raise AttributeError(name) from None
        return _view(value)

    def HasField(self, name: str) -> bool:  # noqa: N802 - the protobuf message method it stands in for
        return name in self._data

    def __getitem__(self, key: str) -> Any:  # a map field (env) reads as a mapping
        return _view(self._data[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: str, default: Any = None) -> Any:
        return _view(self._data[key]) if key in self._data else default

    def keys(self) -> Any:
        return self._data.keys()

    def items(self) -> Any:
        return [(key, _view(value)) for key, value in self._data.items()]

    def values(self) -> Any:
        return [_view(value) for value in self._data.values()]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PlainMessage):
            return self._data == other._data
        if isinstance(other, dict):
            return dict(self.items()) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as a Mapping's: unhashable

    def __repr__(self) -> str:
        return f"PlainMessage({self._data!r})"


def _view(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return PlainMessage(value)
    if kind is list and value and type(value[0]) is dict:  # a repeated message (protobuf has no list of lists)
        return [PlainMessage(item) for item in value]
    return value
