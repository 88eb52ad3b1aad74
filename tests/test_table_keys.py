"""The one table-key check every reader uses (simnccl.table_keys): its messages and the error it raises."""

from __future__ import annotations

import pytest

from simnccl.table_keys import KeyProblem, check_keys, key_problem


class _Custom(ValueError):
    pass


def test_a_good_table_has_no_problem() -> None:
    assert key_problem({"a": 1, "b": 2}, allowed=("b", "c"), required=("a",)) is None
    check_keys({"a": 1}, allowed=(), required=("a",), file="f.toml", path="t")


def test_an_unknown_key_is_named_with_its_path_every_accepted_key_and_the_nearest() -> None:
    problem = key_problem({"totl_mib": 1}, allowed=("source",), required=("total_mib",), path="[x]")
    assert problem == KeyProblem(
        "[x].totl_mib", "unknown key; expected one of source, total_mib; did you mean 'total_mib'?"
    )


def test_several_unknown_keys_are_all_named_with_a_hint_for_each_typo() -> None:
    problem = key_problem({"colour": 1, "totl_mib": 2, "display": 3}, allowed=("display", "total_mib"))
    assert problem is not None
    assert problem.key == "colour, totl_mib"
    assert problem.message == (
        "unknown keys; expected one of display, total_mib; did you mean 'total_mib' for 'totl_mib'?"
    )


def test_no_hint_when_nothing_is_close() -> None:
    problem = key_problem({"zzz": 1}, allowed=("display",))
    assert problem is not None and "did you mean" not in problem.message


def test_unknown_keys_come_before_missing_ones() -> None:
    # a misspelt required key is one mistake: reported as unknown (with the hint), not also as missing
    problem = key_problem({"dispaly": 1}, allowed=(), required=("display",))
    assert problem is not None and problem.message.startswith("unknown key;")


def test_missing_keys_are_named_in_order_with_every_required_key() -> None:
    problem = key_problem({"b": 1}, allowed=(), required=("c", "b", "a"), path="comm")
    assert problem == KeyProblem("comm.c, comm.a", "missing keys; required: c, b, a")


def test_a_value_that_is_not_a_table_names_what_the_table_holds() -> None:
    problem = key_problem([1, 2], allowed=("b",), required=("a",), path="timing")
    assert problem == KeyProblem("timing", "expected a table of a, b, got [1, 2]")


def test_check_keys_raises_the_readers_error_naming_file_and_key() -> None:
    with pytest.raises(_Custom) as err:
        check_keys({"speed": 1}, allowed=("seed",), file="s.toml", path="cluster", error=_Custom)
    assert str(err.value) == "s.toml: cluster.speed: unknown key; expected one of seed; did you mean 'seed'?"


def test_top_level_keys_and_fileless_tables_read_naturally() -> None:
    with pytest.raises(ValueError, match=r"^p\.toml: colour: unknown key"):
        check_keys({"colour": 1}, allowed=("name",), file="p.toml")
    with pytest.raises(ValueError, match=r"^options\.cga: unknown key"):
        check_keys({"cga": 4}, allowed=("max_ctas",), file="", path="options")
