"""NCCL version strings and the features they switch on (cuMem by default, runtime connect, NVLS, suspend).

Why: which of NCCL's mechanisms exist, and when they are paid, depends on the release; the thresholds live in
``nccl_constants.toml`` ([versions]) with the release that introduced each. A ``+pr2366`` suffix models a
build carrying NVIDIA/nccl PR #2366 (no NET shared buffers for one-rank communicators), which no release has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from simnccl.nccl.constants import NcclInputError, constants

_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?((?:\+[a-z0-9]+)*)$")


@dataclass(frozen=True, slots=True)
class NcclVersion:
    """A parsed version: ``2.30.7``, ``2.22`` or ``2.30.7+pr2366``."""

    numbers: tuple[int, int, int]
    patches: frozenset[str]
    text: str

    @classmethod
    def parse(cls, text: str) -> NcclVersion:
        """Raises NcclInputError for a malformed version. Parsed once per text: ``feature`` parses a threshold
        at every question, and the model asks several per communicator priced."""
        cached = _PARSED.get((cls, text)) if isinstance(text, str) else None
        if cached is not None:
            return cached
        match = _VERSION.match(str(text).strip())
        if not match:
            raise NcclInputError(f"nccl_version: expected MAJOR.MINOR[.PATCH][+patch], e.g. 2.30.7, got {text!r}")
        major, minor, patch, suffix = match.groups()
        patches = frozenset(p for p in suffix.split("+") if p)
        parsed = cls((int(major), int(minor), int(patch or 0)), patches, str(text).strip())
        if isinstance(text, str) and len(_PARSED) < 1024:  # versions are a handful of texts; bounded all the same
            _PARSED[(cls, text)] = parsed
        return parsed

    def at_least(self, threshold: str) -> bool:
        return self.numbers >= NcclVersion.parse(threshold).numbers

    def feature(self, key: str) -> bool:
        """Whether the release has the feature whose first version is ``versions.<key>``: remembered per (version
        numbers and patches, key, constants), as the model asks it several times per communicator it prices."""
        c = constants()
        memo = (self.numbers, self.patches, key, id(c))
        kept = _FEATURES.get(memo)
        if kept is not None and kept[0] is c:
            return kept[1]
        answer = self.at_least(c.text(f"versions.{key}"))
        if len(_FEATURES) < 1024:  # a handful of versions x feature keys; bounded all the same
            _FEATURES[memo] = (c, answer)
        return answer

    @property
    def single_rank_net_shared_defect(self) -> bool:
        """One-rank communicators allocate the NET shared p2p pool (when runtime connect is off)."""
        fixed_in = constants().text("versions.single_rank_net_shared_fixed_in")
        if "pr2366" in self.patches:
            return False
        return not (fixed_in and self.at_least(fixed_in))

    def __str__(self) -> str:
        return self.text


_PARSED: dict[tuple[type[NcclVersion], str], NcclVersion] = {}
_FEATURES: dict[tuple[object, ...], tuple[object, bool]] = {}
