"""How every party turns the text of an ID cell into the key it aligns on.

The rule is the same at every party (it comes from `[federation]` of the shared federation file) and is
applied before anything is blinded, in this order:

1. surrounding whitespace is removed (always);
2. `pattern` (optional regular expression): the key is its first match anywhere in the ID, the match's
   group when the pattern has one (`MRN-0*(\\d+)` turns `MRN-004217` into `4217`), its group named `key`
   when it has more (`(MRN|ID)-(?P<key>\\d+)`; more groups without one named `key` are refused: the first,
   often an alternation, would make every key alike), else the whole match; an ID the pattern does not
   match is refused;
3. `fold_case` (optional): the key is case-folded (`str.casefold`: `AB-7` and `ab-7` are one key);
4. `strip_leading_zeros` (optional): leading `0` characters are removed (`0004217` -> `4217`; an ID of
   zeros only becomes `0`).

Two rows of one table whose keys are equal are refused by the table reader, naming both lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import DataError


@dataclass(frozen=True)
class IdRule:
    """The ID normalisation of a federation (see the module doc for the order of the steps)."""

    fold_case: bool = False
    strip_leading_zeros: bool = False
    pattern: str | None = None

    def __post_init__(self) -> None:
        if self.pattern is not None:
            compiled(self.pattern)

    @property
    def is_plain(self) -> bool:
        """True when the key is the stripped ID text itself."""
        return not (self.fold_case or self.strip_leading_zeros or self.pattern)

    def key(self, text: str) -> str:
        """The key of one ID cell; a DataError (without location: the caller adds it) when the
        pattern does not match or the key is empty."""
        key = text.strip()
        if self.pattern is not None:
            match = compiled(self.pattern).search(key)
            if match is None:
                raise DataError(f"ID {key!r} does not match id_pattern {self.pattern!r}")
            key = match.group(_key_group(match.re))
            key = (key or "").strip()
        if self.fold_case:
            key = key.casefold()
        if self.strip_leading_zeros and key:
            key = key.lstrip("0") or "0"
        if not key:
            raise DataError(f"ID {text.strip()!r} normalises to an empty key (id_pattern {self.pattern!r})")
        return key

    def describe(self) -> str:
        """The rule in words, for messages: "strip, id_pattern 'x', fold case"."""
        steps = ["strip spaces"]
        if self.pattern is not None:
            steps.append(f"id_pattern {self.pattern!r}")
        if self.fold_case:
            steps.append("id_fold_case")
        if self.strip_leading_zeros:
            steps.append("id_strip_leading_zeros")
        return ", ".join(steps)


_COMPILED: dict[str, re.Pattern] = {}


def compiled(pattern: str) -> re.Pattern:
    """The compiled pattern; a DataError names a pattern that is not a regular expression."""
    if pattern not in _COMPILED:
        if not isinstance(pattern, str) or not pattern:
            raise DataError(f"id_pattern must be a non-empty regular expression, got {pattern!r}")
        try:
            _COMPILED[pattern] = re.compile(pattern)
        except (re.error, OverflowError, RecursionError) as error:  # (a repetition too large, groups nested deep)
            raise DataError(f"id_pattern {pattern!r} is not a regular expression ({error})") from None
        if _COMPILED[pattern].groups > 1 and "key" not in _COMPILED[pattern].groupindex:
            raise DataError(f"id_pattern {_COMPILED.pop(pattern).pattern!r} has several groups and none named "
                            "'key': name the key's group (?P<key>...) and write the others (?:...)")
    return _COMPILED[pattern]


def _key_group(pattern: re.Pattern) -> int | str:
    """Which group of a match is the key: the one named `key`, else the only group, else the whole match."""
    return "key" if "key" in pattern.groupindex else min(pattern.groups, 1)
