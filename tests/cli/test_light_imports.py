"""``import lmgym`` imports the policy and the rollout only when one of their names is used.

``lmgym/__init__.py`` resolves its public names on first use (PEP 562), so ``import
lmgym.cli`` and ``lmgym tasks`` skip transformers' model code (``lmgym.policy``) and
the agents, while ``import lmgym`` still registers the tasks with Gymnasium and every
name of ``lmgym.__all__`` is still importable from ``lmgym``. Checked in a fresh
interpreter: this one has imported everything already.
"""

from __future__ import annotations

import subprocess
import sys

from testkit import ROOT, child_env

SCRIPT = """
import contextlib, io, sys

import lmgym.cli

with contextlib.redirect_stdout(io.StringIO()) as out:
    assert lmgym.cli.main(["tasks"]) == 0
assert "lmgym/TargetString-v0" in out.getvalue()
heavy = ("lmgym.policy", "lmgym.rollout", "lmgym.agents", "lmgym.training.trainer")
print("loaded:", [name for name in heavy if name in sys.modules])

import gymnasium as gym

import lmgym

env = gym.make("lmgym/TargetString-v0")
env.reset(seed=0)
missing = [name for name in lmgym.__all__ if name not in dir(lmgym)]
print("not in dir:", missing)
namespace = {}
exec("from lmgym import *", namespace)
print("star:", sorted(set(lmgym.__all__) - set(namespace)))
print("policy:", lmgym.CausalLMPolicy.__module__, lmgym.__version__)
"""


def test_import_lmgym_cli_leaves_the_policy_out_and_the_names_resolve_on_use() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=child_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "loaded: []",
        "not in dir: []",
        "star: []",
        "policy: lmgym.policy.causal_lm 0.1.0",
    ]
