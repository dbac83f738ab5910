"""An agent on disk: what ``Agent.save`` writes and ``Agent.load`` reads.

Layout of a saved agent (also ``agent/`` inside a training checkpoint)::

    policy/              save_pretrained: safetensors weights, config, tokenizer
    agent_state.pt       the agent's ``state_dict()``: optimizer, sampler and shuffle
                         RNG, the env's prompt stream, iteration and token counters,
                         critic head, stateful helpers (REINFORCE's EMA baseline),
                         sampling settings
    agent_config.json    {"algorithm", **the config}
    manifest.json        size + SHA-256 of every file above (written last)

``agent_state.pt`` holds only tensors and plain data and is read with
``torch.load(weights_only=True)`` (``lmgym.persistence.state``); the weights are
safetensors, and a policy directory carrying a pickle-based weight file is
refused. ``load`` verifies the manifest and every safetensors header before it
reads any file, checks ``agent_config.json`` against the copy ``agent_state.pt``
holds and the optimizer state for NaN, then rebuilds the agent and hands it
``load_state_dict(state)``: this module reads no private field of an agent. Of
``lmgym.agents`` it imports one function, when loading:
``lmgym.agents.config.config_from_dict`` (which reads every stored config), never
an agent.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import torch

from lmgym.parallel.sharded_state import MARKER
from lmgym.persistence.atomic import atomic_directory
from lmgym.persistence.manifest import (
    MANIFEST_FILE,
    CheckpointError,
    verify_manifest,
    write_manifest,
)
from lmgym.persistence.state import global_rng_state, load_state, save_state
from lmgym.persistence.write_errors import writing

if TYPE_CHECKING:
    from lmgym.envs.token_env import TokenVectorEnv
    from lmgym.policy.causal_lm import CausalLMPolicy

STATE_FILE = "agent_state.pt"
CONFIG_FILE = "agent_config.json"
POLICY_DIR = "policy"
SAVED_CONFIG = "agent_config"
"""Key of ``agent_state.pt`` holding the config as written to ``agent_config.json``:
``load_agent`` refuses a config file that no longer matches it."""
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
"""Weight formats that unpickle on load: never read from a checkpoint's policy directory."""


class SavableAgent(Protocol):
    """What this module needs of an agent (``lmgym.agents.Agent`` has all of it)."""

    name: ClassVar[str]
    config: Any
    policy: CausalLMPolicy

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


AgentT = TypeVar("AgentT", bound=SavableAgent)


def agent_state(agent: SavableAgent) -> dict[str, Any]:
    """Everything besides the weights and the config that ``load`` needs to continue
    exactly: ``agent.state_dict()``."""
    return agent.state_dict()


def rank_state(agent: SavableAgent) -> dict[str, Any]:
    """What differs between data-parallel ranks: the sampler and shuffle RNG, the env's
    prompt stream (its shard), the process's global RNG, the token counter and, under
    ``data_parallel="fsdp"``, the optimizer state (this rank's shard, marked ``MARKER``).

    A checkpoint of an N-process run holds one per rank (``trainer_state["ranks"]``);
    ``load_agent(rank_state=...)`` restores a rank's own. Plain data and CPU tensors.
    """
    full = agent.state_dict()
    state = {
        "generator": full["generator"].cpu(),
        "shuffle": full["shuffle"],
        "env": full["env"],
        "rng": global_rng_state(),
        "tokens_generated": full["tokens_generated"],
    }
    if MARKER in full["optimizer"]:  # a whole optimizer is the same on every rank: saved once
        state["optimizer"] = full["optimizer"]
    return state


def write_agent(agent: SavableAgent, directory: Path) -> None:
    """Write the agent's files and their ``manifest.json`` into the empty ``directory``
    (part of an ``atomic_directory``: it is not renamed into place here).

    Raises:
        OSError: a write failed (a full disk), naming the file or directory.
    """
    directory.mkdir(parents=True, exist_ok=True)
    with writing(directory / POLICY_DIR):
        agent.policy.save_pretrained(directory / POLICY_DIR)
    if not any((directory / POLICY_DIR).glob("*.safetensors")):
        # transformers' save_pretrained writes nothing on ranks other than 0 once a
        # torch.distributed group exists: a checkpoint without weights must not land.
        raise RuntimeError(
            "Agent.save: the policy's save_pretrained wrote no weights (under "
            "torch.distributed, transformers writes on rank 0 only). Save on rank 0: the "
            "weights are the same on every data-parallel rank"
        )
    config = json.dumps({"algorithm": agent.name, **dataclasses.asdict(agent.config)}, indent=2)
    state = agent_state(agent)
    state[SAVED_CONFIG] = json.loads(config)  # checked against CONFIG_FILE on load
    save_state(state, directory / STATE_FILE, name="agent state")
    (directory / CONFIG_FILE).write_text(config)
    write_manifest(directory)


def save_agent(agent: SavableAgent, path: str | Path) -> Path:
    """``Agent.save``: write ``path`` atomically (see the module docstring for the layout).

    Returns:
        ``path``.

    Raises:
        FileExistsError: ``path`` is a file or a symbolic link (only a directory is
            replaced).
        OSError: a write failed (a full disk); ``path`` is then untouched.
    """
    path = Path(path)
    with atomic_directory(path) as tmp:
        write_agent(agent, tmp)
    return path


def check_agent_dir(path: Path) -> None:
    """Raise if ``path`` is not a directory ``save_agent`` wrote, or if it is damaged or unsafe.

    Raises:
        FileNotFoundError: a required file is missing (not a saved agent).
        CheckpointError: the manifest does not match, the policy directory holds
            a pickle-based weight file, or a safetensors file's header is unreadable.
    """
    for needed in (CONFIG_FILE, STATE_FILE, POLICY_DIR, MANIFEST_FILE):
        if not (path / needed).exists():
            raise FileNotFoundError(
                f"{path} is not an lmgym checkpoint: {needed} is missing "
                "(was it written by Agent.save?)"
            )
    verify_manifest(path)
    pickled = sorted(
        p.relative_to(path).as_posix()
        for p in (path / POLICY_DIR).rglob("*")
        if p.suffix.lower() in PICKLE_SUFFIXES
    )
    if pickled:
        raise CheckpointError(
            f"checkpoint {path} is refused: {', '.join(pickled)} is a pickle-based weight file "
            "(loading it could run code); lmgym checkpoints hold safetensors weights only"
        )
    check_safetensors(path / POLICY_DIR)


def check_safetensors(directory: Path) -> None:
    """Read the header of every ``*.safetensors`` file under ``directory``.

    The manifest only proves the files are those that were listed: one damaged
    before the manifest was (re)written passes it and would fail deep inside the
    model loader.

    Raises:
        CheckpointError: one line naming the file that cannot be read.
    """
    from safetensors import SafetensorError, safe_open

    for file in sorted(directory.rglob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CheckpointError(
                f"checkpoint file {file} is not a readable safetensors file ({first[:200]})"
            ) from None


def check_saved_config(path: Path, written: dict[str, Any], saved: dict[str, Any] | None) -> None:
    """Refuse an ``agent_config.json`` that differs from the config saved with the agent.

    The manifest catches a file changed afterwards unless the manifest was recomputed
    too; then the checkpoint's config would silently differ from the one it trained
    with, and a resume would ask to adopt the changed value. ``agent_state.pt`` holds
    the config as it was written (``SAVED_CONFIG``). Checkpoints written before it did
    hold none and are not checked.

    Raises:
        CheckpointError: naming the first field that differs, the saved value and the fix.
    """
    if saved is None:
        return
    if written == saved:
        return
    differing = sorted(k for k in written.keys() | saved.keys() if written.get(k) != saved.get(k))
    field = differing[0]
    raise CheckpointError(
        f"checkpoint {path} is refused: its {CONFIG_FILE} does not match the config saved with "
        f"the agent in {STATE_FILE} ({field} is {written.get(field)!r} in the file, "
        f"{saved.get(field)!r} as saved): the file was changed after the save. Resume from "
        f"another checkpoint, or put the file back ({field}: {saved.get(field)!r})"
    )


def check_optimizer_state(path: Path, optimizer: Any) -> None:
    """Refuse optimizer state holding a NaN: no training step saves one (a step whose
    loss or gradient is non-finite is refused before it is applied), so the file was
    damaged or changed. Left in, it would make the next step's weights NaN (AdamW moves
    a weight by its moments even where its gradient is 0, in a row no token uses) and
    the error would blame the learning rate.

    Raises:
        CheckpointError: naming the state entry, where the first NaN is, and the fix.
    """

    def walk(value: Any, where: str) -> str | None:
        if isinstance(value, torch.Tensor):
            if not value.is_floating_point() or not bool(value.isnan().any()):
                return None
            first = value.isnan().nonzero()[0].tolist() if value.dim() else []
            at = (
                f" (first at row {first[0]})"
                if value.dim() > 1
                else (f" (first at index {first[0]})" if first else "")
            )
            return f"{where}{at}"
        if isinstance(value, dict):
            items = value.items()
        elif isinstance(value, list | tuple):
            items = enumerate(value)
        else:
            return None
        for key, item in items:
            found = walk(item, f"{where}[{key!r}]")
            if found is not None:
                return found
        return None

    found = walk(optimizer, "optimizer")
    if found is not None:
        raise CheckpointError(
            f"checkpoint {path} is refused: {STATE_FILE} holds a NaN in the optimizer state, "
            f"{found}; training never saves one, so the file is damaged or was changed after "
            "the save. Resume from an earlier checkpoint"
        )


def load_agent(
    cls: type[AgentT],
    path: str | Path,
    env: TokenVectorEnv,
    ref_policy: CausalLMPolicy | None = None,
    device: torch.device | str = "cpu",
    *,
    verified: bool = False,
    rank_state: dict[str, Any] | None = None,
) -> AgentT:
    """``Agent.load``: rebuild an agent written by ``save_agent``.

    Args:
        cls: the agent class (must match the saved algorithm).
        path: the directory.
        env: the env to continue in (its prompt stream is restored).
        ref_policy: the frozen reference, when the agent's ``beta > 0``.
        device: where to load the policy.
        verified: ``check_agent_dir(path)`` was just called (skip hashing again).
        rank_state: a data-parallel rank's own sampler, shuffle, prompt-stream,
            counter and (fsdp) optimizer-shard state (``rank_state``), used instead of
            the saved agent's (rank 0's).

    Raises:
        FileNotFoundError: ``path`` is not a saved agent.
        CheckpointError: a file is missing, truncated, altered, unsafe or unlisted
            (checked against ``manifest.json`` before anything is read);
            ``agent_config.json`` differs from the config saved in ``agent_state.pt``;
            the optimizer state holds a NaN.
        ValueError: the directory holds another algorithm.
    """
    from lmgym.agents.config import config_from_dict
    from lmgym.policy.causal_lm import CausalLMPolicy
    from lmgym.policy.value import frozen_copy

    path = Path(path)
    if not verified:
        check_agent_dir(path)
    saved = json.loads((path / CONFIG_FILE).read_text())
    state = load_state(path / STATE_FILE, map_location=device)
    check_saved_config(path, saved, state.pop(SAVED_CONFIG, None))
    algorithm = saved.pop("algorithm")
    if algorithm != cls.name:
        raise ValueError(f"{path} holds a {algorithm!r} agent; load it with that class")
    if rank_state is not None:
        own = ("generator", "shuffle", "env", "tokens_generated", "optimizer")
        state.update({k: rank_state[k] for k in own if k in rank_state})
    check_optimizer_state(path, state.get("optimizer"))
    policy = CausalLMPolicy.from_pretrained(path / POLICY_DIR, device=device, **state["sampling"])
    if ref_policy is None and policy.is_peft and saved.get("beta", 0) > 0:
        ref_policy = frozen_copy(policy)  # the base under the adapter: exact, no copy
    agent = cls(policy, env, ref_policy, config=config_from_dict(cls.config_class, saved))  # type: ignore[call-arg]
    agent.load_state_dict(state)
    return agent
