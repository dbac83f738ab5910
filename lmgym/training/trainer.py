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

import torch
from transformers import AutoTokenizer

from lmgym.agents.base import Agent, Callback
from lmgym.agents.config import AgentConfig
from lmgym.distributed import DEFAULT_TIMEOUT_S
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.persistence.atomic import atomic_directory
from lmgym.persistence.manifest import CheckpointError
from lmgym.training.boundary_eval import BoundaryEval
from lmgym.training.build import (
    build_agent,
    eval_env_for,
    load_callback,
    make_train_env,
    reference_for,
    tiny_positions,
)
from lmgym.training.callbacks import Printer, check_callback, tqdm_print
from lmgym.training.checkpoint import CheckpointManager
from lmgym.training.evaluation import EvalResult, HeldOut, correct_threshold_for
from lmgym.training.holdout import holdout_lines
from lmgym.training.ranks import Ranks, launched_ranks, local_device
from lmgym.training.resolved import ResolvedFields, ResolvedRun, resolve
from lmgym.training.resume import (
    ResumePlan,
    check_checkpoint_agrees,
    check_schedule_length,
    checkpoint_error,
    choose_checkpoint,
    plan_resume,
    rewind_history,
)
from lmgym.training.run import RunDirectory, TrainConfig, default_run_dir
from lmgym.training.session import Session, assemble, main_callbacks
from lmgym.training.termination import sigterm_raises

# The lines that open a training session: what trains, on how many processes, from where.


def opening_lines(
    config: TrainConfig,
    async_config: Any,
    world_size: int,
    resumed: tuple[Path | None, int, int | None] | None,
) -> list[str]:
    """What a session says before it trains.

    Args:
        config: the run's settings.
        async_config: the ``AsyncConfig`` of an asynchronous run, else ``None``.
        world_size: data-parallel processes.
        resumed: ``(checkpoint, its iteration, the run's saved threads)`` of a resume.
    """
    cfg, lines = config, []
    if resumed is not None:
        checkpoint, iteration, saved_threads = resumed
        lines.append(
            f"resuming {cfg.algo} on {cfg.task} from {checkpoint} at iteration {iteration}; "
            f"training to {cfg.iterations}"
        )
        if saved_threads is not None and cfg.threads != saved_threads:
            lines.append(
                f"note: threads={cfg.threads} differs from the run's {saved_threads}; the metrics "
                "may then differ in the last digits from a run that kept its thread count "
                "(float sums in another order)"
            )
    elif async_config is not None:
        lines.append(
            f"{cfg.algo} on {cfg.task}, asynchronous: {async_config.actors} actor(s) x "
            f"{cfg.num_prompts} prompts x {cfg.group_size}, {async_config.learners} learner(s), "
            f"max_staleness={async_config.max_staleness}, {cfg.iterations} updates"
        )
    else:
        lines.append(
            f"{cfg.algo} on {cfg.task}: {cfg.num_prompts * cfg.group_size} rows "
            f"({cfg.num_prompts} prompts x {cfg.group_size}), {cfg.iterations} iterations, "
            f"model {cfg.model or 'tiny GPT-2 (built locally)'}"
        )
    if resumed is None:
        lines += holdout_lines(cfg.prompts, cfg.prompt_field, cfg.holdout, cfg.eval_prompts_file)
    if async_config is None and world_size > 1:
        lines.append(
            f"data parallel: {world_size} processes x {cfg.num_prompts} prompts = "
            f"{world_size * cfg.num_prompts} prompts per iteration"
        )
    return lines


# What ``Trainer.run`` returns.


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
        tokens_generated: tokens the policy sampled (all sessions, all ranks; a
            multi-turn episode's observations not counted).
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

    def report_line(self) -> str | None:
        """The line ``lmgym train`` ends with: the reward before and after, and the split
        and prompts they were measured on (``None`` without both evaluations)."""
        if self.before is None or self.after is None:
            return None
        after = self.after
        return (
            f"reward before: {self.before.reward_mean:.3f}   after: {after.reward_mean:.3f}"
            f"   ({len(self.history)} iterations in {self.seconds:.1f} s, "
            f"{self.tokens_generated} tokens generated; measured on split {after.split or '?'}: "
            f"{after.num_prompts} prompts x {after.samples_per_prompt} samples)"
        )


def _silent(text: str) -> None:
    """The printer of ranks other than 0: they print nothing."""


class Trainer(ResolvedFields):
    """Build and run one training run with a run directory.

    The configs are checked and the run's derived values computed once, into the
    record ``resolved`` (``lmgym.training.resolved``) that the trainer, a resume and
    ``config.json`` read; ``config`` and ``agent_config`` are its settings.

    Args:
        config: the run's settings (not changed: a ``TrainConfig`` is frozen), or the
            record ``resolve`` made of them (``Trainer.resume`` passes its plan's).
        agent_config: the algorithm's config (default: its documented defaults);
            its class must be ``ALGORITHMS[config.algo].config_class``.
        callbacks: extra ``callback(agent, metrics)`` called each iteration, after
            the built-in ones and before the checkpoint; ``TrainingCallback``s'
            ``state_dict`` is saved with each checkpoint (under ``state_key``).
        overwrite: replace ``config.run_dir`` if it exists (only an lmgym run).
        out: where progress lines go (default: ``print`` through tqdm).
        async_config: an ``lmgym.asynchronous.AsyncConfig``: train with actor and
            learner processes (``AsyncDriver``, docs/async.md) in the processes torchrun
            started (``actors + learners``). Learner 0 does what rank 0 does: the run
            directory, callbacks (evaluations, samples, early stop, logs), checkpoints
            every ``save_every``; a resume continues on the synchronous path.
    """

    def __init__(
        self,
        config: TrainConfig | ResolvedRun,
        agent_config: AgentConfig | None = None,
        *,
        callbacks: Sequence[Callback] = (),
        overwrite: bool = False,
        out: Printer = tqdm_print,
        async_config: Any = None,
    ) -> None:
        if isinstance(config, ResolvedRun):  # Trainer.resume: its plan resolved it
            if agent_config is not None:
                raise TypeError("agent_config: a ResolvedRun holds its own (record.agent_config)")
            self.resolved = config
        else:
            self.resolved = resolve(config, agent_config)
        for callback in callbacks:
            check_callback(callback, "callbacks")
        if async_config is not None:
            async_config.check()
        self.async_config = async_config
        self.user_callbacks = list(callbacks)
        self.overwrite = overwrite
        self.out = out
        if os.environ.get("RANK", "0") == "0":  # before the process group: torchrun's rank
            for line in self.resolved.notes:
                out(line)
        self.plan: ResumePlan | None = None
        self.resume_from: Path | None = None
        self.ranks = Ranks()  # joined in run() (torchrun's process group, if any)
        self.device = self.config.device
        self._model: str | None = None  # a directory to load instead of config.model
        self._tiny: tempfile.TemporaryDirectory | None = None
        if self.config.model is None and launched_ranks() > 1:
            # Before the process group: transformers' save_pretrained then writes on
            # every rank (afterwards only on rank 0).
            from lmgym.policy import make_tiny_lm, save_tiny

            tiny = make_tiny_lm(n_positions=tiny_positions(self.config, self.env_id))
            self._tiny = tempfile.TemporaryDirectory()
            self._model = str(save_tiny(f"{self._tiny.name}/tiny-gpt2", tiny))

    @property
    def env_id(self) -> str:
        """The task's registered Gymnasium id."""
        return self.resolved.env_id

    @classmethod
    def resume(
        cls,
        path: str | Path,
        *,
        changes: dict[str, Any] | None = None,
        agent_changes: dict[str, Any] | None = None,
        callbacks: Sequence[Callback] = (),
        out: Printer = tqdm_print,
    ) -> Trainer:
        """Continue a run from its latest checkpoint (or from the checkpoint ``path``).

        The rules are ``lmgym.training.resume``'s (``plan_resume``). The checkpoint is
        chosen, verified and loaded by ``run()``, under the run's lock. The user code
        named in the run's ``config.json`` is imported again, after a line saying which.

        Args:
            path: a run directory or one of its checkpoints.
            changes: ``TrainConfig`` fields to change, e.g. ``{"iterations": 200}``
                (the new total); ``FIXED_ON_RESUME`` fields cannot change.
            agent_changes: agent config values asked for; each must equal the run's.
            callbacks, out: as in ``Trainer``.

        Raises:
            FixedOnResumeError: a change touches a field a resumed run keeps.
            ValueError: the prompt file changed, or ``config.json`` was edited.
        """
        plan = plan_resume(path, changes, agent_changes, out)
        trainer = cls(plan.resolved, callbacks=callbacks, out=out)
        trainer.plan = plan
        trainer.resume_from = plan.checkpoint
        return trainer

    # ----------------------------------------------------------------- run
    def run(self) -> TrainResult:
        """Train to ``config.iterations`` (in total), checkpointing and logging on the way.

        Everything that can fail before training (the model, the env, the evaluation
        env, the callbacks' imports) is done before a new run directory is created, so
        a failed start leaves none behind. The run directory is locked from then
        until ``run`` returns (a second ``run`` on it raises ``DirectoryLockedError``).

        Returns:
            A ``TrainResult``.
        """
        torch.set_num_threads(self.config.threads)
        try:
            with sigterm_raises(launched_ranks() > 1):
                self._start_ranks()
                return self._run()
        finally:
            if self._tiny is not None:
                self._tiny.cleanup()
                self._tiny = self._model = None

    def _start_ranks(self) -> None:
        """Join torchrun's process group, if launched by it: this process's ``ranks`` and
        ``device`` (``cuda:LOCAL_RANK``); the ranks' TrainConfigs must agree (``ValueError``
        on every rank naming the fields that differ). Ranks other than 0 print nothing."""
        cfg, acfg = self.config, self.async_config
        if acfg is not None and launched_ranks() != acfg.world_size:
            raise ValueError(
                f"actors={acfg.actors} + learners={acfg.learners} need {acfg.world_size} "
                f"processes, this run has {launched_ranks()}: launch with lmgym train --actors "
                f"{acfg.actors} --learners {acfg.learners} (which starts them), or torchrun "
                f"--nproc-per-node {acfg.world_size} -m lmgym train ..."
            )
        self.ranks = Ranks.start(cfg.device, acfg.timeout_s if acfg else DEFAULT_TIMEOUT_S)
        self.device = local_device(cfg.device)
        # run_dir: a default one holds the time, which may differ between ranks (rank 0's counts).
        values = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "run_dir"}
        self.ranks.check_same("TrainConfig", values)
        if not self.ranks.is_main:
            self.out = _silent

    def _run(self) -> TrainResult:
        ranks = self.ranks
        if self.plan is None:
            learner, agent = self._start_learner()
            eval_env, split = ranks.on_every(lambda: self._eval_env(agent))
            extra = ranks.on_every(self._config_callbacks)
            state: dict[str, Any] = {}
            run = self._create_run(self._launch_record())  # rank 0 creates and locks it
        else:
            run = self.plan.run
            checkpoint = Path(ranks.on_main(lambda: self._lock_and_choose(run)))
            try:
                agent, state = self._build_resumed(run, checkpoint)
                learner = agent
                eval_env, split = self._eval_env(agent)
                extra = ranks.on_every(self._config_callbacks)
            except BaseException:
                if ranks.is_main:
                    run.release_lock()
                raise
        try:
            return self._train(run, learner, agent, state, eval_env, split, extra)
        finally:
            if ranks.is_main:
                run.release_lock()

    # --------------------------------------------------------------- build
    def _start_learner(self) -> tuple[Any, Agent]:
        """A fresh run's ``(learner, agent)``: the learner is the agent, or (asynchronous)
        the ``AsyncDriver`` whose ``learn`` runs this process's actor or learner loop."""
        if self.async_config is None:
            agent = self.ranks.on_every(
                lambda: self._build_fresh(self.device, (self.ranks.rank, self.ranks.size))
            )
            return agent, agent
        from lmgym.asynchronous.driver import AsyncDriver

        driver = AsyncDriver.start(
            lambda role: self._build_fresh(str(role.device), process_group=role.process_group),
            self.async_config,
            device=self.config.device,
        )
        return driver, driver.agent

    def _build_fresh(
        self, device: str, shard: tuple[int, int] = (0, 1), process_group: Any = None
    ) -> Agent:
        """A new agent (``build_agent``), the record completed with the env arguments
        it was built with; nothing is written yet."""
        agent, env_kwargs = build_agent(
            self.config, self.agent_config, self.env_id, device, shard, process_group, self._model
        )
        self.resolved = self.resolved.with_values(env_kwargs=env_kwargs)
        return agent

    def _lock_and_choose(self, run: RunDirectory) -> str:
        """Rank 0: take the run's lock and choose the checkpoint (released on failure)."""
        for line in run.acquire_lock():
            self.out(f"cleaned up after a crashed writer: {line}")
        try:
            checkpoint = choose_checkpoint(run, self.resume_from, self.ranks.size)
            return str(checkpoint)
        except BaseException:
            run.release_lock()
            raise

    def _build_resumed(self, run: RunDirectory, checkpoint: Path) -> tuple[Agent, dict[str, Any]]:
        """Load the checkpoint ``_choose_checkpoint`` chose (every rank: its own state),
        then set the abandoned history aside (rank 0, with the run's lock held)."""
        cfg, ranks = self.config, self.ranks
        self.resume_from = checkpoint

        def load() -> tuple[Agent, dict[str, Any]]:
            # The env needs the tokenizer: read it from the (verified) checkpoint's policy.
            tokenizer = AutoTokenizer.from_pretrained(checkpoint / "agent" / "policy")
            env = make_train_env(
                cfg, tokenizer, self.env_id, device=self.device, shard=(ranks.rank, ranks.size)
            )
            reference = reference_for(
                cfg, self.agent_config.beta, checkpoint=checkpoint, device=self.device,
                model=self._model,
            )  # fmt: skip
            try:
                agent, state = CheckpointManager.load(
                    checkpoint, env, reference, device=self.device, verified=True,
                    rank=ranks.rank, world_size=ranks.size,
                )  # fmt: skip
            except CheckpointError as exc:
                raise checkpoint_error(run, checkpoint, exc) from None
            assert self.plan is not None
            check_checkpoint_agrees(self.plan, checkpoint, agent, state)
            check_schedule_length(agent, cfg.iterations)
            cfg.mark_base_storage(agent.policy)
            cfg.use_rollout_engine(agent.policy)
            return agent, state

        agent, state = ranks.on_every(load)
        ranks.on_main(lambda: self._rewind(run, checkpoint, agent.iteration))
        return agent, state

    def _rewind(self, run: RunDirectory, checkpoint: Path, iteration: int) -> None:
        """Set the history after ``iteration`` aside and rewrite ``config.json`` (rank 0)."""
        rewind_history(run, checkpoint, iteration, self.out)
        self.resolved.save(run, self._launch_record())

    def _launch_record(self) -> dict[str, Any] | None:
        """What ``config.json`` records of the launch: the world size of a data-parallel
        run, the settings of an asynchronous one."""
        if self.async_config is not None:
            return {"async": self.async_config.as_dict()}
        return {"world_size": self.ranks.size} if self.ranks.size > 1 else None

    def _eval_env(self, agent: Agent) -> tuple[TokenVectorEnv | None, str]:
        """The evaluation env (rank 0 only: ``(None, "")`` on the others)."""
        if not self.ranks.is_main:
            return None, ""
        return eval_env_for(self.config, self.env_id, agent.policy.tokenizer, self.device)

    def _config_callbacks(self) -> list[Callback]:
        """The callbacks named in the config (``--callback``), imported (a resume says
        which first: ``plan_resume``)."""
        return [load_callback(spec) for spec in self.config.callbacks]

    def _create_run(self, launch: dict[str, Any] | None) -> RunDirectory:
        """Rank 0 creates, locks and describes the run directory; every rank gets it
        (and records it: ``config.run_dir``)."""
        cfg = self.config
        created: list[RunDirectory] = []

        def create() -> str:
            if cfg.run_dir is None:
                run = RunDirectory.create_unique(default_run_dir(cfg.algo, cfg.task))
            else:
                run = RunDirectory.create(cfg.run_dir, overwrite=self.overwrite)
            try:
                self.resolved.with_values(run_dir=str(run.path)).save(run, launch)
            except BaseException:
                run.release_lock()
                raise
            created.append(run)
            return str(run.path)

        path = self.ranks.on_main(create)
        self.resolved = self.resolved.with_values(run_dir=path)
        return created[0] if created else RunDirectory(path)

    # --------------------------------------------------------------- train
    def _announce(self, agent: Agent, run: RunDirectory) -> None:
        """The lines that open a session: what trains, where, and on how many processes."""
        resumed = None
        if self.plan is not None:
            resumed = (self.resume_from, agent.iteration, self.plan.saved_threads)
        lines = opening_lines(self.config, self.async_config, self.ranks.size, resumed)
        for line in [*lines, f"run directory: {run.path}"]:
            self.out(line)

    def _callbacks(
        self,
        run: RunDirectory,
        agent: Agent,
        state: dict[str, Any],
        eval_env: TokenVectorEnv | None,
        split: str,
        extra: list[Callback],
    ) -> tuple[Session, list[Callback], Any, BoundaryEval | None]:
        """``(session, callbacks, checkpoint callback, boundary evaluation)`` of this process.

        Rank 0 (learner 0 of an asynchronous run) evaluates, logs, samples and runs the
        user's callbacks. Data parallel: every rank takes part in the checkpoints and
        shares the stop. Asynchronous: learner 0 alone checkpoints; the stop reaches
        the others through its control record.
        """
        cfg, ranks = self.config, self.ranks
        threshold = correct_threshold_for(self.env_id)
        seed = self.agent_config.seed
        session, boundary = Session(), None
        if ranks.is_main:
            assert eval_env is not None
            session = main_callbacks(
                self.resolved, eval_env, split, run,
                seed=seed, beta=self.agent_config.beta,
                learning_rate=self.agent_config.learning_rate, correct_threshold=threshold,
                resumed_at=agent.iteration if self.plan is not None else None,
                start=time.perf_counter(), extra=[*extra, *self.user_callbacks], out=self.out,
            )  # fmt: skip
            held_out = HeldOut(eval_env, cfg.eval_prompts, seed, threshold, split)
            boundary = BoundaryEval(held_out, run, self.out, session.watch)
        if self.async_config is None:
            callbacks, checkpoint = assemble(session, run, cfg, state, ranks, share_stop=ranks)
        else:
            alone = Ranks(alone=True) if ranks.is_main else None
            callbacks, checkpoint = assemble(session, run, cfg, state, alone)
        return session, callbacks, checkpoint, boundary

    def _train(
        self,
        run: RunDirectory,
        learner: Any,
        agent: Agent,
        state: dict[str, Any],
        eval_env: TokenVectorEnv | None,
        split: str,
        extra: list[Callback],
    ) -> TrainResult:
        cfg, ranks = self.config, self.ranks
        session, callbacks, checkpoint, boundary = self._callbacks(
            run, agent, state, eval_env, split, extra
        )
        self._announce(agent, run)
        before = boundary(agent, "start") if boundary is not None else None
        remaining = max(0, cfg.iterations - agent.iteration)
        start = time.perf_counter()
        try:
            history = learner.learn(remaining, callback=callbacks)
        finally:
            session.close()
        seconds = time.perf_counter() - start
        # Asynchronous: learner 0's count is the run's (every actor's tokens received).
        sync = self.async_config is None
        tokens = ranks.sum(agent.tokens_generated) if sync else agent.tokens_generated
        last = checkpoint.last if checkpoint is not None else None
        after = merged = None
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
            before=before,
            after=after,
            seconds=seconds,
            iteration=agent.iteration,
            tokens_generated=tokens,
            checkpoint=last,
            stopped_early=session.early is not None and session.early.solved_at is not None,
            agent=agent,
            merged=merged,
        )
