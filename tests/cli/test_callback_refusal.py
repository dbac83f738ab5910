"""``--callback`` names something that cannot be called as ``callback(agent, metrics)``:
one line, no traceback, nothing created (issue 27 §6)."""

from __future__ import annotations

from lmgym.cli import main


def test_a_function_of_other_arguments_is_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--callback", "os:system", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lmgym train: error: callback 'os:system': system(command) cannot be ")
    assert "(agent, metrics)" in err and len(err.splitlines()) == 1
    assert not run.exists()
