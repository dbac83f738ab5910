"""One training run, as ``lmgym train`` does it: build, train with callbacks, checkpoint, evaluate.

```python
from lmgym.agents import GRPOConfig
from lmgym.training import TrainConfig, Trainer

result = Trainer(TrainConfig(algo="grpo", iterations=100, run_dir="runs/demo"),
                 GRPOConfig(learning_rate=2e-3)).run()
result = Trainer.resume("runs/demo", changes={"iterations": 200}).run()   # 100 more
```

Determinism. A fresh run seeds the global torch RNG with the agent's ``seed``
before building the policy (a LoRA adapter draws its initial weights from it) and
again before building the agent (a critic head may draw its initial weights from it).
Evaluations and printed samples use their own env and generator. So on CPU a run
of ``N`` iterations and a run of ``M < N`` iterations resumed to ``N`` produce
the same metrics, row for row (``time/*`` aside): the checkpoint holds the
weights, optimizer, sampler/shuffle RNG, the env's prompt stream, the global RNG
and the callbacks' state. (An ``autoreset`` env's rows in flight are not saved:
such a run resumes with fresh rows.)
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from lmgym.agents.base import Agent, Callback
from lmgym.agents.config import AgentConfig
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.persistence.atomic import atomic_directory
from lmgym.persistence.manifest import CheckpointError
from lmgym.policy.causal_lm import CausalLMPolicy
from lmgym.training.boundary_eval import BoundaryEval
from lmgym.training.callbacks import (
    CheckpointCallback,
    EarlyStopAtThreshold,
    MetricsLogger,
    Printer,
    RankCallbacks,
    check_callback,
    tqdm_print,
)
from lmgym.training.checkpoint import CheckpointManager, checkpoint_iteration, is_checkpoint
from lmgym.training.env_args import check_env_kwargs, with_policy_stop_ids
from lmgym.training.evaluation import (
    EvalResult,
    correct_threshold_for,
    make_eval_env,
)
from lmgym.training.logger import make_logger, make_stdout_logger
from lmgym.training.model_source import resolve_model
from lmgym.training.ranks import Ranks, launched_ranks, local_device
from lmgym.training.run import (
    FIXED_ON_RESUME,
    RunDirectory,
    RunDirectoryError,
    TrainConfig,
    default_run_dir,
)
from lmgym.training.session import Session, main_callbacks, stop_threshold
from lmgym.training.threads import auto_threads
from lmgym.training.user_code import (
    check_prompt_file,
    check_task_factory,
    import_object,
    prepare_task,
    resolve_task,
    run_imports,
    user_code_specs,
)


def _silent(text: str) -> None:
    """The printer of ranks other than 0: they print nothing."""


class FixedOnResumeError(ValueError):
    """A resume would change a field of ``FIXED_ON_RESUME``.

    Attributes:
        field, value, old: the field, the value asked for and the run's.
    """

    KEPT = (
        "a resumed run keeps its algorithm, task, model and its settings (dtype, LoRA, "
        "checkpointing), batch shape, temperature and env arguments (start a new run to "
        "change them)"
    )

    def __init__(self, field: str, value: Any, old: Any) -> None:
        super().__init__(f"{field}={value!r} differs from the run's {old!r}; {self.KEPT}")
        self.field, self.value, self.old = field, value, old


def check_schedule_length(agent: Agent, iterations: int) -> None:
    """Refuse to train a resumed agent past the end of its decaying learning-rate schedule.

    A schedule's length is fixed when the run starts (``schedule_iterations``, else the
    run's first ``iterations``) and a checkpoint restores it as it was: past its end a
    linear schedule stays at 0 and a cosine one climbs back up.

    Raises:
        ValueError: ``iterations`` exceeds the schedule; the message gives its length.
    """
    from lmgym.agents.optim import NEEDS_LENGTH, steps_per_iteration

    steps = agent.lr_schedule.total_steps
    kind = agent.config.lr_scheduler_type
    if agent.lr_schedule.scheduler is None or steps is None or kind not in NEEDS_LENGTH:
        return
    span = steps // steps_per_iteration(agent.config)
    if iterations > span:
        raise ValueError(
            f"iterations={iterations}: the run's {kind} learning-rate schedule spans {span} "
            f"iterations (fixed when the run started) and a resume cannot lengthen it; resume "
            f"with --iterations {span} or fewer, or start a new run (with --schedule-iterations "
            "N to plan a longer one)"
        )


def check_algo(algo: str) -> None:
    """Raise ``ValueError`` listing the valid names if ``algo`` is unknown."""
    from lmgym.agents import ALGORITHMS

    if algo not in ALGORITHMS:
        raise ValueError(f"unknown algo {algo!r}; valid: {', '.join(sorted(ALGORITHMS))}")


def check_task(task: str) -> str:
    """The Gymnasium id of ``task`` (``"module:Id"`` imports ``module`` first).

    Raises:
        ValueError: unknown, listing the registered tasks (``user_code.resolve_task``).
    """
    return resolve_task(task)


def load_policy(
    model: str | None,
    temperature: float = 1.0,
    device: torch.device | str = "cpu",
    *,
    peft_config: Any = None,
    autocast_dtype: str | None = None,
    gradient_checkpointing: bool = False,
) -> CausalLMPolicy:
    """The policy for ``model`` (hub name or directory); ``None``: the tiny GPT-2, built
    locally and round-tripped through ``save_pretrained`` / ``from_pretrained``.

    Args:
        peft_config, autocast_dtype, gradient_checkpointing: as
            ``CausalLMPolicy.from_pretrained`` (``TrainConfig.peft_config()``, ...).

    Raises:
        ModelNotFoundError: a missing directory, or a hub name while offline and not
            cached (``resolve_model``); one line saying what to pass instead.
    """
    from lmgym.policy import save_tiny

    settings = {
        "device": device,
        "temperature": temperature,
        "peft_config": peft_config,
        "autocast_dtype": autocast_dtype,
        "gradient_checkpointing": gradient_checkpointing,
    }
    if model is not None:
        return CausalLMPolicy.from_pretrained(resolve_model(model), **settings)
    with tempfile.TemporaryDirectory() as tmp:
        path = save_tiny(f"{tmp}/tiny-gpt2")
        return CausalLMPolicy.from_pretrained(path, **settings)


def policy_for(
    config: TrainConfig, device: str | None = None, model: str | None = None
) -> CausalLMPolicy:
    """The run's initial policy: ``config.model`` with its LoRA, dtype and checkpointing.

    Args:
        device: where (default ``config.device``; a data-parallel rank's own GPU).
        model: load this directory instead of ``config.model`` (the tiny GPT-2 saved
            before the process group started: ``save_pretrained`` writes nothing on
            ranks other than 0 once one has).
    """
    policy = load_policy(
        model or config.model,
        config.temperature,
        device or config.device,
        peft_config=config.peft_config(),
        autocast_dtype=config.autocast_dtype,
        gradient_checkpointing=config.gradient_checkpointing,
    )
    config.mark_base_storage(policy)
    return policy


def make_train_env(
    config: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    env_id: str | None = None,
    *,
    device: str | None = None,
    shard: tuple[int, int] = (0, 1),
) -> TokenVectorEnv:
    """The run's training env: ``gymnasium.make_vec(task, ...)`` with the policy's tokenizer.

    Args:
        env_id: the task's registered id (``prepare_task``); default ``config.task``.
        device: where (default ``config.device``).
        shard: ``(rank, world_size)`` of a data-parallel run: this rank's share of the
            prompt stream, ``config.num_prompts`` prompts per reset.
    """
    kwargs = dict(config.env_kwargs)
    if shard != (0, 1):
        kwargs["shard"] = shard
    env = gym.make_vec(
        env_id or config.task,
        num_envs=config.num_prompts * config.group_size,
        group_size=config.group_size,
        tokenizer=tokenizer,
        device=device or config.device,
        **kwargs,
    )
    if not isinstance(env, TokenVectorEnv):
        raise TypeError(
            f"task {config.task!r}: make_vec returned {type(env).__name__}, not an lmgym "
            "TokenVectorEnv"
        )
    return env


def load_callback(spec: str) -> Callback:
    """Import a user callback from ``'package.module:name'``; a class is instantiated.

    Raises:
        ValueError: it cannot be imported, is not callable, or is a Stable-Baselines3
            ``BaseCallback`` (the message states lmgym's callback protocol).
    """
    target = import_object(spec, "callback")
    try:
        check_callback(target, f"callback {spec!r}")
        if isinstance(target, type):
            target = target()
        check_callback(target, f"callback {spec!r}")
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    return target


@dataclass
class TrainResult:
    """What a run did.

    Attributes:
        run_dir: its directory.
        history: one metrics dict per iteration trained in this session.
        before, after: evaluations at the start and the end of this session (``None``
            on data-parallel ranks other than 0: rank 0 evaluates).
        seconds: wall time of ``learn``.
        iteration: the agent's iteration count at the end (all sessions).
        tokens_generated: completion tokens sampled (all sessions, all ranks).
        checkpoint: the final checkpoint.
        stopped_early: whether early stopping ended it.
        agent: the trained agent.
        merged: ``RUN/merged`` when ``save_merged`` wrote it.
    """

    run_dir: Path
    history: list[dict[str, float]]
    before: EvalResult | None
    after: EvalResult | None
    seconds: float
    iteration: int
    tokens_generated: int
    checkpoint: Path | None
    stopped_early: bool
    agent: Agent = field(repr=False)
    merged: Path | None = None


class Trainer:
    """Build and run one training run with a run directory.

    Args:
        config: the run's settings.
        agent_config: the algorithm's config (default: its documented defaults);
            its class must be ``ALGORITHMS[config.algo].config_class``.
        callbacks: extra ``callback(agent, metrics)`` called each iteration, after
            the built-in ones and before the checkpoint; ``TrainingCallback``s'
            ``state_dict`` is saved with each checkpoint (under ``state_key``).
        overwrite: replace ``config.run_dir`` if it exists (only an lmgym run).
        out: where progress lines go (default: ``print`` through tqdm).
        async_config: an ``lmgym.asynchronous.AsyncConfig``: train with actor and
            learner processes (``run_async``, docs/async.md) in the processes torchrun
            started (``actors + learners``); such a run cannot be resumed.
    """

    def __init__(
        self,
        config: TrainConfig,
        agent_config: AgentConfig | None = None,
        *,
        callbacks: Sequence[Callback] = (),
        overwrite: bool = False,
        out: Printer = tqdm_print,
        async_config: Any = None,
    ) -> None:
        from lmgym.agents import ALGORITHMS

        check_algo(config.algo)
        config.check()
        self.env_id = prepare_task(config)
        check_task_factory(self.env_id, config.task)
        config.env_kwargs = check_env_kwargs(self.env_id, config.env_kwargs)
        stop_threshold(config, self.env_id)  # early_stop needs one: refused before anything
        for callback in callbacks:
            check_callback(callback, "callbacks")
        agent_class = ALGORITHMS[config.algo]
        if agent_config is None:
            agent_config = agent_class.config_class()
        if type(agent_config) is not agent_class.config_class:
            raise TypeError(
                f"agent_config: {config.algo} takes {agent_class.config_class.__name__}, "
                f"got {type(agent_config).__name__}"
            )
        if async_config is not None:
            async_config.check()
        self.config = config
        self.agent_config = agent_config
        self.async_config = async_config
        self.user_callbacks = list(callbacks)
        self.overwrite = overwrite
        self.out = out
        if config.threads == 0:  # chosen once, then recorded in config.json like a number
            config.threads, why = auto_threads(processes=launched_ranks())
            if os.environ.get("RANK", "0") == "0":  # before the process group: torchrun's rank
                out(f"threads: {config.threads} ({why}; --threads 0 chose)")
        self.resume_from: Path | None = None
        self._resume_run: RunDirectory | None = None
        self._resume_latest = False
        self._saved_threads: int | None = None
        self.ranks = Ranks()  # joined in run() (torchrun's process group, if any)
        self.device = config.device
        self._model: str | None = None  # a directory to load instead of config.model

    # -------------------------------------------------------------- resume
    @staticmethod
    def find_run(path: str | Path) -> RunDirectory:
        """The run directory ``path`` names: a run directory, or a checkpoint inside one
        (``RUN/checkpoints/iter_NNNNNN``).

        Raises:
            RunDirectoryError: a symbolic link, or a checkpoint that is not inside a run's
                ``checkpoints/``.
            FileNotFoundError: not an lmgym run directory.
        """
        path = Path(path)
        if is_checkpoint(path):
            if path.is_symlink():
                raise RunDirectoryError(
                    f"checkpoint {path} is a symbolic link; pass the real checkpoint directory"
                )
            if (
                path.parent.name != RunDirectory.CHECKPOINTS
                or checkpoint_iteration(path.name) is None
            ):
                raise RunDirectoryError(
                    f"{path} is not a checkpoint inside a run directory (expected "
                    "RUN/checkpoints/iter_NNNNNN); evaluate it with lmgym eval --model instead"
                )
            return RunDirectory.open(path.parent.parent)
        return RunDirectory.open(path)

    @staticmethod
    def find_checkpoint(path: str | Path) -> tuple[RunDirectory, Path]:
        """``(run, checkpoint)`` for a run directory (its latest checkpoint) or a checkpoint.

        Raises:
            FileNotFoundError: neither, or a run without checkpoints.
            CheckpointError: the run's ``checkpoints/latest`` names something else than
                one of its checkpoints.
        """
        path = Path(path)
        run = Trainer.find_run(path)
        if is_checkpoint(path):
            return run, path
        latest = CheckpointManager(run.checkpoints).latest()
        if latest is None:
            raise FileNotFoundError(f"run directory {run.path} has no checkpoint to resume from")
        return run, latest

    @classmethod
    def resume(
        cls,
        path: str | Path,
        *,
        changes: dict[str, Any] | None = None,
        callbacks: Sequence[Callback] = (),
        out: Printer = tqdm_print,
    ) -> Trainer:
        """Continue a run from its latest checkpoint (or from the checkpoint ``path``).

        The checkpoint is chosen, verified and loaded by ``run()``, under the run's
        lock. The user code named in the run's ``config.json`` (a ``module:Id`` task,
        the reward of a prompt file, ``--callback`` modules) is imported again, after a
        line saying which; a prompt file must still have the SHA-256 the run recorded.

        Args:
            path: a run directory or one of its checkpoints.
            changes: ``TrainConfig`` fields to change, e.g. ``{"iterations": 200}``
                (the new total). The algorithm, task, model and its settings (dtype,
                LoRA, checkpointing), batch shape, sampling temperature and env
                arguments cannot change (``FIXED_ON_RESUME``).
            callbacks: as in ``Trainer``.
            out: as in ``Trainer``.

        Raises:
            ValueError: ``changes`` touches a fixed field, or the prompt file changed.
        """
        from lmgym.agents import ALGORITHMS

        path = Path(path)
        run = cls.find_run(path)
        saved = run.read_config()
        if "async" in saved.get("launch", {}):
            raise ValueError(
                f"{run.path} is an asynchronous actor-learner run, and async runs cannot be "
                "resumed (its checkpoint lacks the actors' prompt streams and rows in flight; "
                "docs/async.md); start a new run, e.g. from its final model with --model "
                f"{run.checkpoints}/<iter_NNNNNN>/agent/policy"
            )
        changed = check_prompt_file(saved.get("imports"), "resume")
        if changed is not None:
            raise ValueError(
                f"{changed}; a resumed run must train on the same prompts: restore the file, "
                "or start a new run on the new one"
            )
        specs = user_code_specs(saved["run"])
        if specs:
            out(
                f"importing the code named in {run.config_path}: "
                + ", ".join(f"{role} {spec}" for role, spec in specs)
            )
        changes = dict(changes or {})
        if changes.get("prompts") is not None:
            changes["prompts"] = str(Path(changes["prompts"]).expanduser().resolve())
        if "env_kwargs" in changes:
            env_id = prepare_task(TrainConfig(**saved["run"]))
            changes["env_kwargs"] = check_env_kwargs(env_id, changes["env_kwargs"])
        defaults = TrainConfig()  # the values of fields added after the run was written
        for name in FIXED_ON_RESUME:
            old = saved["run"].get(name, getattr(defaults, name))
            if name in changes and changes[name] != old:
                raise FixedOnResumeError(name, changes[name], old)
        config = TrainConfig(**{**saved["run"], **changes, "run_dir": str(run.path)})
        agent_class = ALGORITHMS[saved["algo"]]
        agent_values = dict(saved["agent"])
        if "adam_betas" in agent_values:
            agent_values["adam_betas"] = tuple(agent_values["adam_betas"])
        trainer = cls(
            config, agent_class.config_class(**agent_values), callbacks=callbacks, out=out
        )
        trainer._resume_run = run
        trainer._resume_latest = not is_checkpoint(path)
        trainer.resume_from = path if is_checkpoint(path) else None
        trainer._saved_threads = saved["run"].get("threads")
        return trainer

    # ----------------------------------------------------------------- run
    def _reference(
        self, policy: CausalLMPolicy | None = None, checkpoint: Path | None = None
    ) -> CausalLMPolicy | None:
        """The frozen KL reference (``None`` when ``beta`` is 0).

        Args:
            policy: a fresh run's initial policy: the reference is ``frozen_copy`` of it
                (a PEFT policy's is the same model with its adapter disabled, no copy).
            checkpoint: a resume's checkpoint. When its policy is a PEFT adapter
                ``CheckpointManager.load`` builds the adapter-off view from the loaded
                policy (``None`` here); otherwise the initial model is loaded again.
        """
        if self.agent_config.beta <= 0:
            return None
        from lmgym.policy.adapters import is_adapter_dir
        from lmgym.policy.value import frozen_copy

        if policy is not None:
            return frozen_copy(policy)
        if checkpoint is not None and is_adapter_dir(checkpoint / "agent" / "policy"):
            return None
        # The reference is the initial model, not the checkpoint's: rebuild it.
        cfg = self.config
        return frozen_copy(
            load_policy(
                self._model or cfg.model,
                cfg.temperature,
                self.device,
                autocast_dtype=cfg.autocast_dtype,
            )
        )

    def _build_fresh(self) -> Agent:
        """A new agent; nothing is written yet."""
        from lmgym.agents import ALGORITHMS

        cfg = self.config
        torch.manual_seed(self.agent_config.seed)  # a new adapter's initial weights
        policy = policy_for(cfg, self.device, self._model)
        cfg.env_kwargs = with_policy_stop_ids(self.env_id, cfg.env_kwargs, policy)
        env = make_train_env(cfg, policy.tokenizer, self.env_id, **self._env_place())
        torch.manual_seed(self.agent_config.seed)
        return ALGORITHMS[cfg.algo](policy, env, self._reference(policy), config=self.agent_config)

    def _env_place(self) -> dict[str, Any]:
        """``make_train_env``'s device and this rank's shard."""
        return {"device": self.device, "shard": (self.ranks.rank, self.ranks.size)}

    def _checkpoint_error(self, run: RunDirectory, checkpoint: Path, exc: Exception) -> Exception:
        """``exc`` with the run's other checkpoints named as a way out."""
        others = [p.name for p in CheckpointManager(run.checkpoints).checkpoints()]
        others = [name for name in others if name != checkpoint.name]
        hint = (
            f"; other checkpoints in this run: {', '.join(others)} (pass one to --resume, "
            f"e.g. --resume {run.checkpoints / others[-1]})"
            if others
            else ""
        )
        return CheckpointError(f"{exc}{hint}")

    def _choose_checkpoint(self, run: RunDirectory) -> Path:
        """The checkpoint to resume from, verified (rank 0, with the run's lock held)."""
        manager = CheckpointManager(run.checkpoints, self.config.keep_checkpoints)
        checkpoint = manager.latest() if self._resume_latest else self.resume_from
        if checkpoint is None:
            raise FileNotFoundError(
                f"run directory {run.path} has no checkpoint to resume from (it stopped before "
                f"its first one); start it again with --run-dir {run.path} --overwrite"
            )
        try:
            CheckpointManager.verify(checkpoint)
        except CheckpointError as exc:
            raise self._checkpoint_error(run, checkpoint, exc) from None
        CheckpointManager.check_world_size(checkpoint, self.ranks.size)
        return checkpoint

    def _build_resumed(self, run: RunDirectory, checkpoint: Path) -> tuple[Agent, dict[str, Any]]:
        """Load the checkpoint ``_choose_checkpoint`` chose (every rank: its own state),
        then set the abandoned history aside (rank 0, with the run's lock held)."""
        cfg = self.config
        self.resume_from = checkpoint

        def load() -> tuple[Agent, dict[str, Any]]:
            # The env needs the tokenizer: read it from the (verified) checkpoint's policy.
            tokenizer = AutoTokenizer.from_pretrained(checkpoint / "agent" / "policy")
            env = make_train_env(cfg, tokenizer, self.env_id, **self._env_place())
            ref = self._reference(checkpoint=checkpoint)
            try:
                agent, state = CheckpointManager.load(
                    checkpoint,
                    env,
                    ref,
                    device=self.device,
                    verified=True,
                    rank=self.ranks.rank,
                    world_size=self.ranks.size,
                )
            except CheckpointError as exc:
                raise self._checkpoint_error(run, checkpoint, exc) from None
            check_schedule_length(agent, cfg.iterations)
            cfg.mark_base_storage(agent.policy)
            return agent, state

        agent, state = self.ranks.on_every(load)

        def rewind() -> None:
            manager = CheckpointManager(run.checkpoints, cfg.keep_checkpoints)
            later = [
                p
                for p in manager.checkpoints()
                if (checkpoint_iteration(p.name) or 0) > agent.iteration
            ]
            branch = run.rewind(agent.iteration, later)
            if branch is not None:
                self.out(
                    f"the history after iteration {agent.iteration} (rows, samples, evaluations"
                    f"{', checkpoints ' + ', '.join(p.name for p in later) if later else ''}) "
                    f"was moved to {branch}; nothing was deleted"
                )
            manager.point_latest_at(checkpoint)
            run.write_config(cfg, self.agent_config, run_imports(cfg), self._launch_record())

        self.ranks.on_main(rewind)
        return agent, state

    def _launch_record(self) -> dict[str, Any] | None:
        """What ``config.json`` records of the launch: the world size of a data-parallel run."""
        return {"world_size": self.ranks.size} if self.ranks.size > 1 else None

    def _eval_env(self, agent: Agent) -> tuple[TokenVectorEnv | None, str]:
        """The evaluation env (rank 0 only: ``(None, "")`` on the others)."""
        cfg = self.config
        if not self.ranks.is_main:
            return None, ""
        return make_eval_env(
            self.env_id,
            agent.policy.tokenizer,
            cfg.eval_prompts,
            cfg.eval_samples,
            env_kwargs=cfg.env_kwargs,
            device=self.device,
        )

    def _config_callbacks(self) -> list[Callback]:
        """The callbacks named in the config (``--callback``), imported (a resume says
        which first: ``Trainer.resume``)."""
        return [load_callback(spec) for spec in self.config.callbacks]

    def run(self) -> TrainResult:
        """Train to ``config.iterations`` (in total), checkpointing and logging on the way.

        Everything that can fail before training (the model, the env, the evaluation
        env, the callbacks' imports) is done before a new run directory is created, so
        a failed start leaves none behind. The run directory is locked from then
        until ``run`` returns (a second ``run`` on it raises ``DirectoryLockedError``).

        Returns:
            A ``TrainResult``.
        """
        cfg = self.config
        torch.set_num_threads(cfg.threads)
        with tempfile.TemporaryDirectory() as tmp:
            if cfg.model is None and launched_ranks() > 1:
                # Before the process group: transformers' save_pretrained then writes
                # on every rank (afterwards only on rank 0).
                from lmgym.policy import save_tiny

                self._model = str(save_tiny(f"{tmp}/tiny-gpt2"))
            try:
                if self.async_config is not None:
                    return self._run_async()
                self._start_ranks()
                return self._run()
            finally:
                self._model = None

    def _run(self) -> TrainResult:
        ranks = self.ranks
        if self._resume_run is None:

            def build() -> tuple[Agent, TokenVectorEnv | None, str, list[Callback]]:
                agent = self._build_fresh()
                eval_env, split = self._eval_env(agent)
                return agent, eval_env, split, self._config_callbacks()

            agent, eval_env, split, extra = ranks.on_every(build)
            state: dict[str, Any] = {}

            run = self._create_run(self._launch_record())  # rank 0 creates and locks it
        else:
            run = self._resume_run

            def lock_and_choose() -> str:
                for line in run.acquire_lock():
                    self.out(f"cleaned up after a crashed writer: {line}")
                try:
                    return str(self._choose_checkpoint(run))
                except BaseException:
                    run.release_lock()
                    raise

            checkpoint = Path(ranks.on_main(lock_and_choose))
            try:
                agent, state = self._build_resumed(run, checkpoint)
                eval_env, split = self._eval_env(agent)
                extra = ranks.on_every(self._config_callbacks)
            except BaseException:
                if ranks.is_main:
                    run.release_lock()
                raise
        try:
            return self._train(run, agent, state, eval_env, split, extra)
        finally:
            if ranks.is_main:
                run.release_lock()

    def _run_async(self) -> TrainResult:
        """Actors and learners (``run_async``): learner 0 (rank 0) does what rank 0 of a
        data-parallel run does (run directory, logs, samples, evaluations, the final
        checkpoint, printing); every other process writes nothing."""
        from lmgym.agents import ALGORITHMS
        from lmgym.asynchronous import Role, run_async

        cfg, acfg = self.config, self.async_config
        if launched_ranks() != acfg.world_size:
            raise ValueError(
                f"actors={acfg.actors} + learners={acfg.learners} need {acfg.world_size} "
                f"processes, this run has {launched_ranks()}: launch with lmgym train --actors "
                f"{acfg.actors} --learners {acfg.learners} (which starts them), or torchrun "
                f"--nproc-per-node {acfg.world_size} -m lmgym train ..."
            )
        self.ranks = Ranks.start(cfg.device, acfg.timeout_s)
        self.device = local_device(cfg.device)
        values = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "run_dir"}
        self.ranks.check_same("TrainConfig", values)
        ranks = self.ranks
        if not ranks.is_main:
            self.out = _silent
        run = self._create_run({"async": acfg.as_dict()})
        try:
            return self._train_async(run, ALGORITHMS[cfg.algo], Role, run_async)
        finally:
            if ranks.is_main:
                run.release_lock()

    def _create_run(self, launch: dict[str, Any]) -> RunDirectory:
        """Rank 0 creates, locks and describes the run directory; every rank gets it."""
        cfg = self.config
        created: list[RunDirectory] = []

        def create() -> str:
            run = RunDirectory.create(
                cfg.run_dir or default_run_dir(cfg.algo, cfg.task), overwrite=self.overwrite
            )
            try:
                cfg.run_dir = str(run.path)
                run.write_config(cfg, self.agent_config, run_imports(cfg), launch)
            except BaseException:
                run.release_lock()
                raise
            created.append(run)
            return str(run.path)

        cfg.run_dir = self.ranks.on_main(create)
        return created[0] if created else RunDirectory(cfg.run_dir)

    def _train_async(
        self, run: RunDirectory, agent_class: Any, role_class: Any, run_async: Any
    ) -> TrainResult:
        cfg, acfg = self.config, self.async_config
        main = self.ranks.is_main
        evals: dict[str, Any] = {}

        def make_agent(role: Any) -> Agent:
            torch.manual_seed(self.agent_config.seed)
            policy = policy_for(cfg, str(role.device), self._model)
            cfg.env_kwargs = with_policy_stop_ids(self.env_id, cfg.env_kwargs, policy)
            env = make_train_env(cfg, policy.tokenizer, self.env_id, device=str(role.device))
            torch.manual_seed(self.agent_config.seed)
            agent = agent_class(
                policy,
                env,
                self._reference(policy),
                config=self.agent_config,
                process_group=role.process_group,
            )
            if main:  # learner 0: announced, timed and recorded in eval.jsonl
                eval_env, split = self._eval_env(agent)
                evals["boundary"] = boundary = BoundaryEval(
                    eval_env,
                    cfg.eval_prompts,
                    self.agent_config.seed,
                    threshold,
                    split,
                    run,
                    self.out,
                )
                evals["before"] = boundary(agent, "start")
            return agent

        threshold = correct_threshold_for(self.env_id)

        callbacks: list[Callback] = []
        logger = stdout = None
        checkpoint: CheckpointCallback | None = None
        if main:
            self.out(
                f"{cfg.algo} on {cfg.task}, asynchronous: {acfg.actors} actor(s) x "
                f"{cfg.num_prompts} prompts x {cfg.group_size}, {acfg.learners} learner(s), "
                f"max_staleness={acfg.max_staleness}, {cfg.iterations} updates"
            )
            self.out(f"run directory: {run.path}")
            logger = make_logger(run.path)
            stdout = make_stdout_logger() if cfg.log_interval else None
            callbacks.append(MetricsLogger(logger, stdout, cfg.log_interval))
            if cfg.early_stop:
                from lmgym.envs.registration import TASKS

                info = TASKS.get(self.env_id)
                stop_at = cfg.stop_threshold
                if stop_at is None and info is not None:
                    stop_at = info.solved_threshold
                if stop_at is not None:
                    callbacks.append(EarlyStopAtThreshold(stop_at, cfg.stop_window, out=self.out))
            callbacks += self._config_callbacks() + self.user_callbacks
            # One checkpoint at the end (for lmgym eval and --model); no resume.
            checkpoint = CheckpointCallback(
                CheckpointManager(run.checkpoints, cfg.keep_checkpoints),
                0,
                None,
                ranks=Ranks(alone=True),
            )
            callbacks.append(checkpoint)
        start = time.perf_counter()
        try:
            result = run_async(
                make_agent, cfg.iterations, acfg, callback=callbacks, device=cfg.device
            )
        finally:
            if logger is not None:
                logger.close()
            if stdout is not None:
                stdout.close()
        seconds = time.perf_counter() - start
        agent = result.agent
        before = after = None
        if main:
            assert checkpoint is not None
            self.out(f"checkpoint: {checkpoint.last}")
            before, after = evals["before"], evals["boundary"](agent, "end")
        tokens = int(result.history[-1].get("tokens_generated", 0)) if result.history else 0
        return TrainResult(
            run_dir=run.path,
            history=result.history,
            before=before,
            after=after,
            seconds=seconds,
            iteration=agent.iteration,
            tokens_generated=tokens,
            checkpoint=checkpoint.last if checkpoint is not None else None,
            stopped_early=False,
            agent=agent,
        )

    def _start_ranks(self) -> None:
        """Join torchrun's process group, if launched by it: this process's ``ranks`` and
        ``device`` (``cuda:LOCAL_RANK``); the ranks' TrainConfigs must agree (``ValueError``
        on every rank naming the fields that differ). Ranks other than 0 print nothing."""
        cfg = self.config
        self.ranks = Ranks.start(cfg.device)
        self.device = local_device(cfg.device)
        # run_dir: a default one holds the time, which may differ between ranks (rank 0's counts).
        values = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "run_dir"}
        self.ranks.check_same("TrainConfig", values)
        if not self.ranks.is_main:
            self.out = _silent

    def _train(
        self,
        run: RunDirectory,
        agent: Agent,
        state: dict[str, Any],
        eval_env: TokenVectorEnv | None,
        split: str,
        extra: list[Callback],
    ) -> TrainResult:
        cfg = self.config
        threshold = correct_threshold_for(self.env_id)
        seed = self.agent_config.seed
        resumed = self._resume_run is not None
        ranks = self.ranks
        # Rank 0 evaluates, logs, samples and runs the user's callbacks; every rank takes
        # part in the checkpoints (RankCallbacks shares a stop between ranks).
        session, boundary = Session(), None
        if ranks.is_main:
            assert eval_env is not None
            session = main_callbacks(
                cfg,
                self.env_id,
                eval_env,
                split,
                run,
                seed=seed,
                beta=self.agent_config.beta,
                correct_threshold=threshold,
                resumed_at=agent.iteration if resumed else None,
                start=time.perf_counter(),
                extra=[*extra, *self.user_callbacks],
                out=self.out,
            )
            boundary = BoundaryEval(
                eval_env, cfg.eval_prompts, seed, threshold, split, run, self.out
            )
        callbacks = session.callbacks
        for cb in callbacks:
            key = getattr(cb, "state_key", None)
            if key is not None and key in state.get("callbacks", {}):
                cb.load_state_dict(state["callbacks"][key])  # type: ignore[attr-defined]

        def trainer_state() -> dict[str, Any]:
            return {
                "callbacks": {
                    cb.state_key: cb.state_dict()  # type: ignore[attr-defined]
                    for cb in callbacks
                    if hasattr(cb, "state_key") and hasattr(cb, "state_dict")
                }
            }

        checkpoint = CheckpointCallback(
            CheckpointManager(run.checkpoints, cfg.keep_checkpoints),
            cfg.save_every,
            trainer_state,
            ranks=ranks,
        )
        callbacks.append(checkpoint)
        if ranks.size > 1:
            callbacks = [RankCallbacks(callbacks, ranks)]

        rows = cfg.num_prompts * cfg.group_size
        if not resumed:
            self.out(
                f"{cfg.algo} on {cfg.task}: {rows} rows ({cfg.num_prompts} prompts x "
                f"{cfg.group_size}), {cfg.iterations} iterations, model "
                f"{cfg.model or 'tiny GPT-2 (built locally)'}"
            )
        else:
            self.out(
                f"resuming {cfg.algo} on {cfg.task} from {self.resume_from} at iteration "
                f"{agent.iteration}; training to {cfg.iterations}"
            )
            if self._saved_threads is not None and cfg.threads != self._saved_threads:
                self.out(
                    f"note: threads={cfg.threads} differs from the run's {self._saved_threads}; "
                    "the metrics may then differ in the last digits from a run that kept "
                    "its thread count (float sums in another order)"
                )
        if ranks.size > 1:
            self.out(
                f"data parallel: {ranks.size} processes x {cfg.num_prompts} prompts = "
                f"{ranks.size * cfg.num_prompts} prompts per iteration"
            )
        self.out(f"run directory: {run.path}")
        before = boundary(agent, "start") if boundary is not None else None
        remaining = max(0, cfg.iterations - agent.iteration)
        start = time.perf_counter()
        try:
            history = agent.learn(remaining, callback=callbacks)
        finally:
            session.close()
        seconds = time.perf_counter() - start
        tokens = ranks.sum(agent.tokens_generated)
        last, after, merged = checkpoint.last, None, None
        if boundary is not None:  # rank 0; the other ranks write and print nothing
            if cfg.save_merged:
                with atomic_directory(run.path / RunDirectory.MERGED) as tmp:
                    agent.policy.save_pretrained(tmp, merged=True)
                merged = run.path / RunDirectory.MERGED
                self.out(f"merged model: {merged}")
            last = last or CheckpointManager(run.checkpoints).latest()
            self.out(f"checkpoint: {last}")
            after = boundary(agent, "end")
        return TrainResult(
            run_dir=run.path,
            history=history,
            before=before if ranks.is_main else None,
            after=after,
            seconds=seconds,
            iteration=agent.iteration,
            tokens_generated=tokens,
            checkpoint=last,
            stopped_early=session.early is not None and session.early.solved_at is not None,
            agent=agent,
            merged=merged,
        )
