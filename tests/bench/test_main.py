"""``python -m bench``'s command line: names as the results files are named, a usage error
(not a traceback) for a name no bench module has."""

from __future__ import annotations

import pytest

from bench.__main__ import discover, parse_names


def test_a_short_or_full_name_picks_that_bench_and_none_picks_all():
    assert parse_names(["validation", "training_bench"]) == ["validation_bench", "training_bench"]
    assert parse_names([]) == discover()
    assert "real_model_trl_bench" in discover()


def test_an_unknown_name_is_a_usage_error_that_names_it(capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_names(["validation", "--help-me"])
    assert stopped.value.code == 2
    assert "--help-me" in capsys.readouterr().err

    with pytest.raises(SystemExit) as stopped:
        parse_names(["no_such"])
    assert stopped.value.code == 2
    assert "no benchmark named no_such" in capsys.readouterr().err


def test_help_lists_the_benchmarks(capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_names(["--help"])
    assert stopped.value.code == 0
    assert "real_model_trl" in capsys.readouterr().out
