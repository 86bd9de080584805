"""Where a value lives. A party's values are keyed by its index (`dict[int, T]`); a value that exists
only in the process that hosts the active party is an `Active[T]`.

The step functions are written once for every process. Instead of threading `Tensor | None` through
them, a value computed from active-only inputs is `Active`: present in the active party's process,
absent everywhere else, and `apply` runs a computation only where its inputs are present. The only way
a value changes place is a round of the transport: `aggregate` turns the parties' values into an
`Active` sum, `broadcast` turns an `Active` value into a copy for each hosted party.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .errors import ProtocolError

T = TypeVar("T")
U = TypeVar("U")
_ABSENT: Any = object()


class Active(Generic[T]):
    """A value held only by the active party; `Active.absent()` in every other process."""

    __slots__ = ("_value",)

    def __init__(self, value: T) -> None:
        self._value = value

    @classmethod
    def absent(cls) -> Active[Any]:
        return _NOWHERE  # immutable: one instance serves every absent value

    @property
    def present(self) -> bool:
        return self._value is not _ABSENT

    def get(self) -> T:
        """The value; a `ProtocolError` in a process that does not host the active party."""
        if not self.present:
            raise ProtocolError("this value exists only at the active party")
        return self._value

    def map(self, fn: Callable[[T], U]) -> Active[U]:
        return Active(fn(self._value)) if self.present else Active.absent()

    def __repr__(self) -> str:
        return f"Active({self._value!r})" if self.present else "Active(<absent>)"


_NOWHERE: Active[Any] = Active(_ABSENT)


def apply(fn: Callable[..., U], *args: Any) -> Active[U]:
    """`fn(*args)` with every `Active` argument unwrapped, where all of them are present; absent
    where none is. Mixed presence means a value crossed places without a round: a bug, refused."""
    flags = {arg.present for arg in args if isinstance(arg, Active)}
    if len(flags) > 1:
        raise ProtocolError("an active-only value met a value of another process without a round")
    if flags == {False}:
        return Active.absent()
    return Active(fn(*(arg.get() if isinstance(arg, Active) else arg for arg in args)))
