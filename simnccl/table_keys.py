"""The keys of one table read from a data file: none unknown, none required missing, named the same everywhere.

Why its own module: every file simnccl reads (GPU kinds, topologies, published NCCL points, NCCL options,
profiles, scenarios, sweep matrices) checks a table's keys before its values, and each reader once wrote that
check itself, with small differences in what the message named. Here it is written once: the message names
the file, the dotted key, every key the table accepts (and which it requires), and the nearest accepted key
when the unknown one looks like a typo. Readers whose errors carry the key apart from the message (a scenario's
``ScenarioError``) take the ``KeyProblem``; the others let ``check_keys`` raise their own error type.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class KeyProblem:
    """What is wrong with a table's keys: ``key`` is the dotted path of the offending key(s) in the file
    (``comm.init_mib``; several are comma-separated), ``message`` what is wrong and what was expected."""

    key: str
    message: str

    def at(self, file: str) -> str:
        """The one-line error: ``file: key: message`` (no file: ``key: message``)."""
        return ": ".join(part for part in (file, self.key, self.message) if part)


def key_problem(
    table: Any, *, allowed: Iterable[str], required: Iterable[str] = (), path: str = ""
) -> KeyProblem | None:
    """The first problem with ``table``'s keys (not a table, unknown keys, missing required keys), or None.

    ``path`` is the table's dotted path in its file (``""`` for the top level); ``required`` keys are allowed
    too. Unknown keys are reported before missing ones: a misspelt required key is one mistake, not two.
    """
    required = tuple(required)
    accepted = sorted(set(allowed) | set(required))
    if not isinstance(table, Mapping):
        return KeyProblem(path, f"expected a table of {', '.join(accepted)}, got {table!r}")
    unknown = sorted(str(key) for key in table if key not in accepted)
    if unknown:
        noun = "key" if len(unknown) == 1 else "keys"
        message = f"unknown {noun}; expected one of {', '.join(accepted)}"
        hints = [(key, _nearest(key, accepted)) for key in unknown]
        hints = [(key, near) for key, near in hints if near]
        if len(unknown) == 1 and hints:
            message += f"; did you mean {hints[0][1]!r}?"
        elif hints:
            message += "; did you mean " + ", ".join(f"{near!r} for {key!r}" for key, near in hints) + "?"
        return KeyProblem(_keys(path, unknown), message)
    missing = [key for key in required if key not in table]
    if missing:
        noun = "key" if len(missing) == 1 else "keys"
        return KeyProblem(_keys(path, missing), f"missing {noun}; required: {', '.join(required)}")
    return None


def check_keys(
    table: Any,
    *,
    allowed: Iterable[str],
    required: Iterable[str] = (),
    file: str,
    path: str = "",
    error: Callable[[str], Exception] = ValueError,
) -> None:
    """Raise ``error("file: key: message")`` for the first problem ``key_problem`` finds in ``table``."""
    problem = key_problem(table, allowed=allowed, required=required, path=path)
    if problem is not None:
        raise error(problem.at(file))


def _keys(path: str, keys: list[str]) -> str:
    return ", ".join(f"{path}.{key}" if path else key for key in keys)


def _nearest(key: str, accepted: list[str]) -> str | None:
    matches = difflib.get_close_matches(key, accepted, n=1, cutoff=0.6)
    return matches[0] if matches else None
