"""``lmgym.agents.ALGORITHMS`` is the one list of agents: every agent is in it, and
what lists agents elsewhere agrees with it."""

from __future__ import annotations

import importlib
import pkgutil

import lmgym.agents
from lmgym.agents import ALGORITHMS, Agent


def agent_classes() -> set[type[Agent]]:
    """Every agent class defined in ``lmgym.agents`` (each of its modules imported)."""
    for info in pkgutil.iter_modules(lmgym.agents.__path__, "lmgym.agents."):
        importlib.import_module(info.name)
    found, todo = set(), list(Agent.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("lmgym.agents.") and "name" in vars(cls):
            found.add(cls)
    return found


def docstring_table() -> list[list[str]]:
    """The rows of the table in ``lmgym.agents``' docstring, split into cells."""
    lines = [line for line in (lmgym.agents.__doc__ or "").splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_every_agent_class_is_registered_under_its_name():
    assert set(ALGORITHMS.values()) == agent_classes()
    assert all(name == cls.name for name, cls in ALGORITHMS.items())


def test_the_package_table_lists_every_algorithm_with_its_default_aggregation():
    rows = docstring_table()
    assert [row[0] for row in rows] == list(ALGORITHMS)
    for name, *_, aggregation in rows:
        assert ALGORITHMS[name].config_class().loss_aggregation == aggregation, name
