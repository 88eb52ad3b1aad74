"""``simnccl.file_tail``: the end of a log, read from its end."""

from __future__ import annotations

from pathlib import Path

import pytest

from simnccl import file_tail
from simnccl.file_tail import tail_text


def test_the_last_characters_of_a_file_are_its_tail(tmp_path: Path) -> None:
    log = tmp_path / "rank_0.log"
    log.write_text("a" * 1000 + "\nlast line é😀\n", encoding="utf-8")
    assert tail_text(log, 13) == "last line é😀\n"
    assert tail_text(log, 10**6) == log.read_text(encoding="utf-8")
    assert tail_text(tmp_path / "missing.log", 10) == ""


def test_a_huge_log_is_not_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that printed a GiB made the reporting process read a GiB to keep 4,000 characters."""
    log = tmp_path / "big.log"
    with open(log, "wb") as file:
        file.truncate(64 * 2**20)  # 64 MiB of zeros, then the line that matters
        file.seek(0, 2)
        file.write(b"the error\n")
    read: list[int] = []
    real_open = open

    class Counting:
        def __init__(self, *args: object) -> None:
            self.file = real_open(*args)  # type: ignore[call-overload]

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

        def seek(self, *args: int) -> int:
            return self.file.seek(*args)

        def read(self) -> bytes:
            data = self.file.read()
            read.append(len(data))
            return data

    monkeypatch.setattr(file_tail, "open", Counting, raising=False)
    assert tail_text(log, 4000).endswith("the error\n")
    assert read == [16000]
