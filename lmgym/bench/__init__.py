"""The agent benchmark behind ``lmgym bench``: agents x tasks x seeds with equal budgets,
a Markdown table and PNG learning curves.

``spec`` says what to run (``BenchSpec``: agents, tasks, seeds, budgets) and lists its
jobs; ``run`` trains them (in this process or in worker processes) and keeps each
record as it finishes; ``report`` renders records as the table, JSON and curves. It
is built on ``lmgym.training`` and nothing in the runtime (``training``, ``agents``,
``envs``, ``policy``) imports it.
"""

from lmgym.bench.run import BenchSpec, run_bench

__all__ = ["BenchSpec", "run_bench"]
