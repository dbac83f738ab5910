"""README and docs claims that are commands or numbers, checked (issue 40 item 6).

- every ``make ...`` / ``lmgym ...`` / ``pip install 'lmgym[...]'`` command in a shell
  block of README.md or docs/*.md names a Makefile target, a CLI subcommand and its
  flags, or an extra that exist;
- the Makefile's ``.PHONY`` lists exactly the targets it defines;
- the default run (``make run`` / bare ``lmgym train``) is given one training time
  everywhere, and the sample output shown with it agrees with that figure;
- the suite times stated for ``make test`` and ``make test-fast`` (README, Makefile
  comments) agree with each other.

Each checker is a pure function over text, and each has a test on a broken input
below, so a check that can no longer fail would show up here.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAKEFILE = ROOT / "Makefile"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def markdown_files() -> dict[str, str]:
    """README.md and docs/*.md by their path relative to the repository."""
    return {str(p.relative_to(ROOT)): read(p) for p in [README, *DOCS]}


# ------------------------------------------------------------------ parsing


def shell_blocks(markdown: str) -> list[str]:
    """The bodies of the ```bash / ```sh / ```shell / ```console fenced blocks."""
    pattern = re.compile(r"^```(?:bash|sh|shell|console)[ \t]*\n(.*?)^```", re.M | re.S)
    return pattern.findall(markdown)


def shell_commands(block: str) -> list[tuple[str, str]]:
    """``(command, comment)`` per logical line of a shell block: backslash
    continuations joined, a trailing ``# comment`` split off, blank lines and
    comment-only lines dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", block)
    commands = []
    for line in joined.splitlines():
        command, _, comment = line.partition(" #")
        command = command.strip()
        if command and not command.startswith("#"):
            commands.append((command, comment.strip()))
    return commands


def makefile_targets(makefile: str) -> set[str]:
    """Named targets defined by rules (``name: ...``); file targets built from
    variables (``$(BIN)/.installed``), special targets (``.PHONY``) and variable
    assignments (``:=``) are not names a user types."""
    rule = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)[ \t]*:(?![:=])", re.M)
    return set(rule.findall(makefile))


def phony_targets(makefile: str) -> set[str]:
    joined = re.sub(r"\\\n", " ", makefile)
    names: set[str] = set()
    for line in re.findall(r"^\.PHONY[ \t]*:(.*)$", joined, re.M):
        names.update(line.split())
    return names


def target_comments(makefile: str) -> dict[str, str]:
    """The comment lines directly above each rule, by target."""
    comments: dict[str, str] = {}
    above: list[str] = []
    for line in makefile.splitlines():
        if line.startswith("#"):
            above.append(line.lstrip("# "))
            continue
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)[ \t]*:(?![:=])", line)
        if match:
            comments[match.group(1)] = " ".join(above)
        above = []
    return comments


# ------------------------------------------------------------------ (a) commands


def command_problems(
    commands: list[str],
    targets: set[str],
    options: dict[str, set[str] | None],
    extras: set[str],
) -> list[str]:
    """What in ``commands`` names nothing that exists.

    Args:
        commands: shell command lines (comments already removed).
        targets: the Makefile's targets.
        options: CLI subcommand -> its option strings (``None``: options not checked).
        extras: the package's optional-dependency names.
    """
    problems = []
    for command in commands:
        words = shlex.split(command)
        if words[0] == "make":
            for word in words[1:]:
                if "=" not in word and not word.startswith("-") and word not in targets:
                    problems.append(f"{command!r}: no Makefile target {word!r}")
        elif words[0] == "lmgym":
            sub = words[1] if len(words) > 1 else None
            if sub not in options:
                problems.append(f"{command!r}: no lmgym subcommand {sub!r}")
                continue
            known = options[sub]
            for word in words[2:]:
                flag = word.split("=", 1)[0]
                if known is not None and flag.startswith("--") and flag not in known:
                    problems.append(f"{command!r}: lmgym {sub} has no flag {flag}")
        elif words[:2] == ["pip", "install"]:
            for word in words[2:]:
                match = re.fullmatch(r"lmgym\[([^\]]+)\]", word)
                for extra in match.group(1).split(",") if match else ():
                    if extra not in extras:
                        problems.append(f"{command!r}: lmgym has no extra {extra!r}")
    return problems


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def cli_options(commands: list[str]) -> dict[str, set[str] | None]:
    """Each lmgym subcommand's option strings, from the parsers the CLI runs; for
    ``train``, the union over the ``--algo`` values the commands use (each algorithm
    has its own config fields)."""
    from lmgym.cli import COMMANDS
    from lmgym.cli.bench import _bench_parser
    from lmgym.cli.eval import eval_parser
    from lmgym.cli.train_args import _train_parser

    algos = {"grpo"}
    for command in commands:
        words = shlex.split(command)
        if words[:2] == ["lmgym", "train"] and "--algo" in words:
            algos.add(words[words.index("--algo") + 1])
    train: set[str] = set()
    for algo in algos:
        train |= option_strings(_train_parser(algo)[0])
    known: dict[str, set[str] | None] = {name: None for name in COMMANDS}
    known.update(train=train, eval=option_strings(eval_parser()))
    known["bench"] = option_strings(_bench_parser())
    return known


def documented_commands() -> list[str]:
    return [
        command
        for text in markdown_files().values()
        for block in shell_blocks(text)
        for command, _ in shell_commands(block)
    ]


def extras() -> set[str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads(read(ROOT / "pyproject.toml"))
    return set(pyproject["project"]["optional-dependencies"])


def test_documented_commands_name_targets_subcommands_flags_and_extras_that_exist():
    commands = documented_commands()
    checked = [c for c in commands if c.split()[0] in ("make", "lmgym")]
    assert len(checked) >= 20, checked  # the blocks were found and read
    problems = command_problems(
        commands, makefile_targets(read(MAKEFILE)), cli_options(commands), extras()
    )
    assert problems == []


def test_command_checker_flags_a_missing_target_subcommand_flag_or_extra():
    options = {"train": {"--algo", "--iterations"}, "tasks": None}
    assert command_problems(["make run", "make test TORCH=torch"], {"run", "test"}, {}, set()) == []
    assert command_problems(["lmgym train --algo ppo --iterations=5"], set(), options, set()) == []
    problems = command_problems(
        [
            "make tset",
            "lmgym trian",
            "lmgym train --iteration 5",
            "pip install 'lmgym[pef]'",
        ],
        {"run", "test"},
        options,
        {"peft"},
    )
    assert problems == [
        "'make tset': no Makefile target 'tset'",
        "'lmgym trian': no lmgym subcommand 'trian'",
        "'lmgym train --iteration 5': lmgym train has no flag --iteration",
        "\"pip install 'lmgym[pef]'\": lmgym has no extra 'pef'",
    ]


def test_shell_commands_join_continuations_and_drop_comments():
    block = "# a note\nlmgym train --a 1 \\\n    --b 2   # trains\n\nmake test\n"
    assert shell_commands(block) == [("lmgym train --a 1 --b 2", "trains"), ("make test", "")]


# ------------------------------------------------------------------ (b) .PHONY


def test_phony_lists_exactly_the_makefile_targets():
    makefile = read(MAKEFILE)
    assert phony_targets(makefile) == makefile_targets(makefile)


def test_phony_check_sees_a_missing_or_stale_name():
    makefile = ".PHONY: run lint gone\nX := 1\n$(BIN)/.installed: a\nrun: setup\n\tx\nlint:\n\ty\nnew: run\n"
    assert makefile_targets(makefile) == {"run", "lint", "new"}
    assert phony_targets(makefile) == {"run", "lint", "gone"}
    assert phony_targets(makefile) != makefile_targets(makefile)


# ------------------------------------------------------------------ (c) default run


SECONDS_OF_TRAINING = re.compile(r"(?:~|about )(\d+(?:\.\d+)?) s of training")
MEASURED_DEFAULT_RUN = re.compile(r"\(150 iterations in (\d+(?:\.\d+)?) s")


def default_run_problems(texts: dict[str, str]) -> list[str]:
    """The default run's training time: one figure wherever it is stated, and each
    measured sample output shown for it within 25% of that figure."""
    stated = {
        (name, float(figure))
        for name, text in texts.items()
        for figure in SECONDS_OF_TRAINING.findall(text)
    }
    figures = {figure for _, figure in stated}
    if len(figures) != 1:
        return [f"the default run's training time is stated as {sorted(stated)}"]
    (claim,) = figures
    return [
        f"{name}: a sample output of the default run took {measured} s, but its time is "
        f"given as about {claim:g} s"
        for name, text in texts.items()
        for measured in map(float, MEASURED_DEFAULT_RUN.findall(text))
        if abs(measured - claim) > 0.25 * claim
    ]


def test_default_run_time_is_one_figure_everywhere():
    texts = markdown_files()
    readme_lines = [
        command for block in shell_blocks(texts["README.md"]) for command in shell_commands(block)
    ]
    default_runs = [c for c in readme_lines if c[0] in ("make run", "lmgym train")]
    assert len(default_runs) == 2, default_runs
    for command, comment in default_runs:  # each says how long it trains
        assert SECONDS_OF_TRAINING.search(comment), (command, comment)
    assert default_run_problems(texts) == []


def test_default_run_check_sees_two_figures_or_a_contradicting_sample():
    good = {"README.md": "(~35 s of training)", "docs/cli.md": "about 35 s of training"}
    assert default_run_problems(good) == []
    two = {**good, "docs/x.md": "a default run (~5 s of training)"}
    assert default_run_problems(two) == [
        "the default run's training time is stated as "
        "[('README.md', 35.0), ('docs/cli.md', 35.0), ('docs/x.md', 5.0)]"
    ]
    slow = {**good, "docs/cli.md": "about 35 s of training: (150 iterations in 61.0 s, ..."}
    assert len(default_run_problems(slow)) == 1


# ------------------------------------------------------------------ (d) suite times


DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(?:minutes|min)\b(?:\s+(\d+)\s*s\b)?")


def minutes(text: str) -> list[float]:
    """Every duration in minutes: '20 minutes', '~1 min 50 s', '20 min 5 s'."""
    return [float(m) + (float(s) / 60 if s else 0.0) for m, s in DURATION.findall(text)]


def suite_time_problems(claims: dict[str, list[tuple[str, str]]]) -> list[str]:
    """Per target, every stated duration within 10% of every other one.

    Args:
        claims: target -> ``(where, text)`` of each place that says how long it takes.
    """
    problems = []
    for target, places in claims.items():
        figures = [(where, value) for where, text in places for value in minutes(text)]
        values = [value for _, value in figures]
        if values and max(values) > 1.1 * min(values):
            problems.append(f"make {target}: durations disagree: {figures}")
    return problems


def suite_time_claims() -> dict[str, list[tuple[str, str]]]:
    """What README.md and docs say about ``make test`` / ``make test-fast`` in their
    shell blocks, and the Makefile's comment above each target."""
    claims: dict[str, list[tuple[str, str]]] = {"test": [], "test-fast": []}
    for name, text in markdown_files().items():
        for block in shell_blocks(text):
            for command, comment in shell_commands(block):
                words = command.split()
                if words[0] == "make" and len(words) > 1 and words[1] in claims:
                    claims[words[1]].append((name, comment))
    for target, comment in target_comments(read(MAKEFILE)).items():
        if target in claims:
            claims[target].append(("Makefile", comment))
    return claims


def test_suite_times_agree_wherever_stated():
    claims = suite_time_claims()
    for target in ("test", "test-fast"):  # each has a measured figure somewhere
        assert any(minutes(text) for _, text in claims[target]), (target, claims[target])
    assert suite_time_problems(claims) == []


def test_suite_time_check_sees_a_contradiction():
    assert minutes("about 20 minutes; 2,098 tests, 20 min 5 s; ~1 min 50 s") == pytest.approx(
        [20.0, 20 + 5 / 60, 1 + 50 / 60]
    )
    fine = {"test": [("README.md", "about 20 minutes"), ("README.md", "20 min 5 s")]}
    assert suite_time_problems(fine) == []
    stale = {"test": [("README.md", "about 20 minutes"), ("README.md", "45 min 3 s")]}
    assert suite_time_problems(stale) == [
        "make test: durations disagree: [('README.md', 20.0), ('README.md', 45.05)]"
    ]
