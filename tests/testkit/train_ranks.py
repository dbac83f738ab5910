"""``lmgym train`` on two torchrun ranks, several command lines (scenarios) in one launch.

Starting a rank costs seconds of imports (torch, transformers) and a short run well
under one, so the suite runs every scenario it needs in one launch of this file and
reads each scenario's outcome: every rank's exit status and what it printed. A test
module lists its scenarios in a function ``two_rank_scenarios(root, selected)``;
``shared_launch`` (the session fixture ``two_rank_train`` of tests/conftest.py) runs
those of every module with a selected test, in collection order. Each scenario goes
through the CLI's own ``main`` (or, for ``call``, a function of a test's worker file)
and joins, then leaves, a process group of its own, exactly as a ``torchrun -m lmgym
train`` rank does.

As a script (torchrun's worker): ``train_ranks.py SPEC.json OUT_DIR``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RANKS = 2


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One ``lmgym train`` command line run on both ranks.

    Attributes:
        name: the key of its outcome.
        argv: the flags every rank gets (after ``train``).
        per_rank: extra flags for rank 0 and rank 1 (one string each, split on spaces).
        copy: ``(source, destination)`` directories rank 0 copies before the run starts.
        full_disk_at: a write point (``lmgym.persistence.atomic.write_point`` label) that
            raises ``OSError(ENOSPC)`` on rank 0 during this run.
        call: ``"FILE.py:FUNCTION"`` to run in place of ``lmgym train``:
            ``FUNCTION(OUT / name)`` on each rank (``argv`` unused), its code 0 when it
            returns; it joins the process group itself (``init_from_env``).
    """

    name: str
    argv: list[str]
    per_rank: tuple[str, str] = ("", "")
    copy: tuple[str, str] | None = None
    full_disk_at: str | None = None
    call: str | None = None


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What each rank's ``main`` returned and printed (Python's ``sys.stdout``/``stderr``)."""

    codes: list[int]
    out: list[str]
    err: list[str]

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)


def torchrun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 ARGS``, its output captured."""
    # Here, not at the top: as a script this file is torchrun's worker, where the
    # package ``testkit`` is not importable (and not needed).
    from testkit import child_env, torchrun_command

    command = torchrun_command(RANKS, *args)
    return subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=timeout)


def run_scenarios(
    out: Path, scenarios: list[Scenario], timeout: float = 600
) -> tuple[subprocess.CompletedProcess, dict[str, Outcome]]:
    """Run ``scenarios`` in order in one launch; ``(the launch, outcome by name)``.

    Asserts the launch ended with 0: every rank returned from every scenario (no hang,
    no crash), whatever each scenario's exit status.
    """
    spec = out / "scenarios.json"
    spec.write_text(json.dumps([dataclasses.asdict(s) for s in scenarios]))
    done = torchrun(__file__, str(spec), str(out), timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]
    outcomes = {
        s.name: Outcome(*([rank[s.name][key] for rank in ranks] for key in ("code", "out", "err")))
        for s in scenarios
    }
    return done, outcomes


#: The xdist group of every test that reads the shared launch: ``--dist loadgroup`` runs
#: them on one worker, so the session fixture launches once.
GROUP = "two-rank-train"


def check_one_worker(items: list[Any], fixture: str, group: str) -> None:
    """Every selected test that uses the session-wide launch ``fixture`` carries
    ``xdist_group(group)``; a test without it would start the launch again on another
    worker (each xdist worker builds its own session fixtures)."""
    loose = [
        item.nodeid
        for item in items
        if fixture in getattr(item, "fixturenames", ())
        and not any(mark.args == (group,) for mark in item.iter_markers("xdist_group"))
    ]
    assert not loose, f"mark these tests pytest.mark.xdist_group({group!r}): {loose}"


#: The function a test module defines to add scenarios to the shared launch:
#: ``two_rank_scenarios(root: Path, selected: set[str]) -> list[Scenario]``, where
#: ``selected`` holds the names of that module's selected test functions.
HOOK = "two_rank_scenarios"


def shared_launch(
    session: Any, root: Path
) -> tuple[Path, subprocess.CompletedProcess, dict[str, Outcome]]:
    """One launch of every scenario the modules of ``session``'s selected tests list
    (``HOOK``), each writing under ``root / name``; ``(root, the launch, outcome by name)``."""
    check_one_worker(session.items, "two_rank_train", GROUP)
    selected: dict[Any, set[str]] = {}
    for item in session.items:
        module = getattr(item, "module", None)  # None: not a Python test function
        selected.setdefault(module, set()).add(getattr(item, "originalname", item.name))
    scenarios = [
        scenario
        for module, names in selected.items()
        if hasattr(module, HOOK)
        for scenario in getattr(module, HOOK)(root, names)
    ]
    names = [s.name for s in scenarios]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    assert not duplicated, f"two modules name a scenario alike: {duplicated}"
    launch, outcomes = run_scenarios(root, scenarios)
    return root, launch, outcomes


# ----------------------------------------------------------------- the worker (each rank)
def _fresh_rendezvous(index: int, rank: int, launcher_port: int) -> None:
    """Point the next ``env://`` rendezvous at a store of this scenario's own.

    A process group re-created on the launcher's store finds the previous group's keys
    there, and gloo then connects to stale addresses now and then; so rank 0 hosts a
    new store on a free port and tells rank 1 through the launcher's store.
    """
    from torch.distributed import TCPStore

    launcher = TCPStore(os.environ["MASTER_ADDR"], launcher_port, is_master=False)
    key = f"lmgym-tests/scenario-{index}/port"
    if rank == 0:
        with socket.socket() as probe:
            probe.bind((os.environ["MASTER_ADDR"], 0))
            port = probe.getsockname()[1]
        launcher.set(key, str(port))
    os.environ["MASTER_PORT"] = launcher.get(key).decode()
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"  # rank 0 hosts the store


@contextlib.contextmanager
def _full_disk_on_rank_0(label: str | None, rank: int):
    from lmgym.persistence import atomic

    def point(name: str) -> None:
        if name == label:
            raise OSError(28, "No space left on device")  # errno.ENOSPC

    original = atomic.write_point
    if label is not None and rank == 0:
        atomic.write_point = point
    try:
        yield
    finally:
        atomic.write_point = original


def _call(target: str, out: Path) -> int:
    """Run ``FILE.py:FUNCTION`` with ``out``; 0 when it returns."""
    # The worker runs as a script: make the package testkit importable for its helper.
    if str(ROOT / "tests") not in sys.path:
        sys.path.append(str(ROOT / "tests"))
    from testkit import import_script

    path, function = target.rsplit(":", 1)
    module = import_script(Path(path), Path(path).stem)
    out.mkdir(parents=True, exist_ok=True)
    getattr(module, function)(out)
    return 0


def _run(scenario: Scenario, rank: int, root: Path) -> dict:
    from lmgym.cli import main

    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        _full_disk_on_rank_0(scenario.full_disk_at, rank),
    ):
        try:
            if scenario.call is not None:
                code = _call(scenario.call, root / scenario.name)
            else:
                code = main(["train", *scenario.argv, *scenario.per_rank[rank].split()])
        except BaseException:  # recorded for the test; the next scenario still runs
            traceback.print_exc()
            code = -1
    return {"code": code, "out": out.getvalue(), "err": err.getvalue()}


def _worker(spec: Path, out: Path) -> None:
    rank = int(os.environ["RANK"])
    launcher_port = int(os.environ["MASTER_PORT"])
    results: dict[str, dict] = {}
    for index, fields in enumerate(json.loads(spec.read_text())):
        scenario = Scenario(**{**fields, "per_rank": tuple(fields["per_rank"])})
        if rank == 0 and scenario.copy is not None:
            shutil.copytree(*scenario.copy)  # before the port is published: rank 1 waits
        _fresh_rendezvous(index, rank, launcher_port)
        results[scenario.name] = _run(scenario, rank, out)
        (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), Path(sys.argv[2]))
