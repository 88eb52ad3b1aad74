"""User text is printed so that what is there is seen: the characters a terminal acts on are shown as escapes."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from rich.text import Text

from simnccl.cli_output import PipeAwareConsole
from simnccl.visible_text import invisible_in, visible

TESTS = Path(__file__).resolve().parent


def test_visible_escapes_what_a_terminal_acts_on_and_keeps_the_rest() -> None:
    assert visible("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert visible("abc\u202edef") == "abc\\u202edef"
    assert visible("a\rb\x07c\x9bd\u2028e") == "a\\rb\\x07c\\x9bd\\u2028e"
    assert visible("tab\tand\nnewline, naïve → ✓ [bold]x[/]") == "tab\tand\nnewline, naïve → ✓ [bold]x[/]"


def test_invisible_in_names_the_first_and_counts_newline_and_tab() -> None:
    assert invisible_in("plain name") is None
    assert invisible_in("two\nlines") == "\\n"
    assert invisible_in("a\tb\x1b") == "\\x1b"


def test_the_console_shows_controls_in_user_text_and_keeps_its_own_styling() -> None:
    for terminal in (False, True):
        stream = io.StringIO()
        console = PipeAwareConsole(file=stream, markup=False, highlight=False, force_terminal=terminal, width=200)
        console.print(Text("name \x1b[31mRED\u202e", style="bold"))
        out = stream.getvalue()
        assert "name \\x1b[31mRED\\u202e" in out
        assert "\u202e" not in out and ("\x1b" in out) == terminal  # only the console's own bold: \x1b[1m
        if terminal:
            assert out.count("\x1b") == 2 and "\x1b[1m" in out


def test_a_policy_message_with_controls_reaches_stderr_escaped(tmp_path: Path) -> None:
    (tmp_path / "loud_policy.py").write_text(
        "from dataclasses import dataclass\nfrom simnccl.policy import BasePolicy\n"
        "@dataclass(frozen=True)\nclass Loud(BasePolicy):\n    name: str = 'loud'\n"
        "    def on_group(self, request, decision):\n        raise RuntimeError('\\x1b[2J\\x1b[31mcleared')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "simnccl", "run", "-q", "--policy", "loud_policy:Loud"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("error: ") and "raised RuntimeError: \\x1b[2J\\x1b[31mcleared" in first
    assert "\x1b" not in first
    # the policy's traceback too: it was printed raw, so its last line cleared and recoloured the terminal
    assert "\x1b" not in done.stderr and "loud_policy.py" in done.stderr, done.stderr
    assert done.stderr.count("RuntimeError: \\x1b[2J\\x1b[31mcleared") == 2, done.stderr
