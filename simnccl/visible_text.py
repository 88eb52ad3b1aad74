"""User text made visible: the characters a terminal acts on instead of showing, shown as escapes.

Why: a command prints text it did not write (a scenario's and a variant's name, a policy's name and its
exception's message, a row read back from a sweep's file) and must print it literally. Rich markup is never
interpreted (``markup=False``), but an ESC in a scenario name still reached the terminal raw and coloured it, and
a U+202E reversed the rest of its line: text that changes how the report looks, or hides what it says. Each such
character is printed as its Python escape (``\\x1b``, ``\\u202e``) instead, so what is there is seen.
"""

from __future__ import annotations

import re
from typing import Any

# C0 controls but tab and newline, DEL and the C1 controls, zero-width and direction marks, the line and
# paragraph separators, the bidirectional embeddings, overrides and isolates, the word joiner and friends, BOM.
_INVISIBLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _escaped(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def visible(text: str) -> str:
    """``text`` with every character a terminal would act on (but tab and newline) written as its escape."""
    return _INVISIBLE.sub(_escaped, text)


def invisible_in(text: str) -> str | None:
    """The first such character of ``text``, escaped (None: there is none); newline and tab count too, for text
    that must stay on one line (a name in a one-line summary)."""
    match = _INVISIBLE.search(text) or re.search("[\n\t]", text)
    return None if match is None else _escaped(match)


def one_line(text: str) -> str:
    """``visible(text)`` with newline and tab escaped too: user text inside a line that must stay one line (an
    error message, a table cell)."""
    return visible(text).replace("\n", "\\n").replace("\t", "\\t")


def brief(value: Any, width: int = 120) -> str:
    """``repr(value)`` cut to ``width`` characters: an error message must stay one readable line (a GPU name of a
    million characters, an integer of 400 digits read back from a file, were quoted whole)."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's int-to-text digit limit
        return "an integer of thousands of digits"
    return text if len(text) <= width else f"{text[: width - 5]}...{text[-2:]}"


def error_text(err: BaseException) -> str:
    """``str(err)``, or what can be said of it where its ``__str__`` raises: user code's exception is reported
    whatever it does, and a report that raised in its place blamed simnccl for the user's error."""
    try:
        return str(err)
    except Exception as inner:
        return f"<{type(err).__name__} whose str() raised {type(inner).__name__}>"


def repr_text(value: Any) -> str:
    """``repr(value)``, or what can be said of it where its ``__repr__`` raises (``error_text``'s twin for a
    user's object a message shows)."""
    try:
        return repr(value)
    except Exception as inner:
        return f"<{type(value).__name__} whose repr() raised {type(inner).__name__}>"
