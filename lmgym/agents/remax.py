"""ReMax: REINFORCE whose baseline is the reward of the greedy completion of the same prompt.

    R_i = sum_t r_{i,t}         (KL already subtracted from r when beta > 0)
    b(x) = R(x, y_greedy(x))     the env's score of the prompt's greedy completion
    A_i = R_i - b(x_i)           sequence-level: every token of completion i gets A_i
    rho_{i,t} = exp(lp_{i,t} - lp_old_{i,t})
    l_{i,t} = max(-A_i rho_{i,t}, -A_i clip(rho_{i,t}, 1 - clip_low, 1 + clip_high))

Li, Xu, Zhang, Liu, Sun, Luo, "ReMax: A Simple, Effective, and Efficient
Reinforcement Learning Method for Aligning Large Language Models" (2023). The
baseline depends on the prompt only, so the gradient stays unbiased; it needs no
critic and no group of samples (``group_size=1`` is the paper's setting; with
``G > 1`` the G completions of a prompt share one baseline).

The update takes PPO's schedule (``MultiStepConfig``, 4 epochs x 2 minibatches at
3e-4) under PPO's token clip, as verl's ``remax`` estimator does; the greedy rollout
runs once per batch. With ``update_epochs=1, num_minibatches=1`` the ratio is 1 and
the loss has the paper's gradient ``-A_i * grad lp_{i,t}``. Measured
(docs/algorithms.md#update-schedule): at one step ReMax was still climbing on
TargetString after 150 iterations (182-201 to solve it) and kept LengthControl on 1
of 5 seeds.

The greedy rollout. Every update decodes each distinct prompt of its batch greedily
on a second env built once from the training env (same prompts and indices, reward,
reward mode, budget and stop ids; one row per prompt, episode-synchronous) and
scores it with the same reward. It runs on its own RNG and env, so the training
env's prompt stream and the sampler's generator move exactly as REINFORCE's do;
its tokens count in ``tokens_generated`` (they are generation work). Greedy
decoding is top-k sampling with ``k = 1``: the arg-max id, whatever the policy's
temperature (ties between equal largest logits are drawn among, not broken by
the lowest id).

When the baseline misleads. The greedy completion estimates the expected reward
well once the policy is fairly sure of itself; a near-uniform policy's greedy
completion can score far above its samples (on TargetString, 0.4 against 0.02).
Then nearly every sample gets a negative advantage, which squeezes probability
onto the arg-max ids, and the policy can collapse onto its greedy completion,
where every advantage is 0. An entropy bonus keeps it exploring, so ReMax's
``entropy_coef`` defaults to 0.01 (the other agents' to 0), with DAPO's clip-higher
(``clip_high=0.28``) so that a rare better token can grow faster than its greedy
rival. Measured on the tiny model at ``lmgym bench``'s settings, seeds 0-4
(benchmarks/results/stability_notes.md): without the bonus ReMax stalled on
TargetString on 4 of 5 seeds (0.6-0.8, every sample its greedy completion); the bonus
is applied on each of the schedule's 8 steps, outside the clip, and at 0.02 it kept
LengthControl's policy too noisy to stay solved (2 of 5); at 0.01 with clip-higher
both tasks are kept on 5 of 5.

Departures from the paper: the baseline is the greedy completion's task reward
(with DAPO's overlong shaping when ``overlong_cache`` is set), without the KL term
that ``kl_placement="reward"`` subtracts from the sampled rewards (that would need
the reference's log-probs of the greedy tokens too). A ``CombinedReward``'s
logged components (``reward/<name>``) are those of the sampled batch only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.profiler import record_function

from lmgym.agents.advantages import broadcast_to_tokens
from lmgym.agents.base import Agent
from lmgym.agents.config import KLPlacement, MultiStepConfig
from lmgym.agents.dapo import overlong_penalty
from lmgym.agents.metrics import masked_sum
from lmgym.agents.token_clip import TokenClip, TokenClipConfig
from lmgym.envs.rewards import reward_component_means
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.rollout import collect
from lmgym.types import RolloutBatch


@dataclass
class ReMaxConfig(TokenClipConfig, MultiStepConfig):
    kl_placement: KLPlacement = "reward"
    """Where the KL term goes: subtracted from the sampled rewards (as in RLHF) or added to the loss."""
    entropy_coef: float = 0.01
    """Entropy bonus weight; 0.01 rather than 0: without it ReMax collapses onto its greedy completion ("When the baseline misleads")."""
    clip_high: float = 0.28
    """Upper clip half-width epsilon_high: DAPO's clip-higher, so an unlikely token with a positive advantage can grow further ("When the baseline misleads")."""


def greedy_env_like(env: TokenVectorEnv) -> TokenVectorEnv:
    """An env over ``env``'s prompts, reward and budget with one episode-synchronous row per prompt.

    The prompt source is ``env``'s own (texts or chat messages, and their reward
    columns), so ``prompt_index`` and any per-prompt data a reward reads mean the same
    in both. A multi-turn env's responder (and ``max_turns``) comes along: the
    baseline is the greedy policy's whole episode.
    """
    options = dataclasses.replace(
        env.options,
        num_envs=env.num_prompts,
        group_size=1,
        max_prompt_length=env.prompt_width,
        autoreset=False,
        shard=(0, 1),  # queue_prompts names the prompts itself
        render_mode=None,
    )
    return TokenVectorEnv(
        env.tokenizer, env.prompt_source, env.reward_model, options, responder=env.responder
    )


def queue_prompts(env: TokenVectorEnv, prompt_index: Tensor) -> None:
    """Make ``env``'s next ``reset()`` (without a seed) put these prompts in its rows.

    Rows past ``prompt_index`` repeat its last prompt. ``env`` must have
    ``group_size=1`` and at least ``len(prompt_index)`` rows.

    Args:
        env: the env whose prompt stream is replaced.
        prompt_index: ``[k] int64`` indices into ``env``'s prompt source.
    """
    fill = prompt_index[-1:].expand(env.num_envs - prompt_index.numel())
    state = env.get_state()
    state.update(
        order=torch.cat([prompt_index, fill]).cpu(),
        cursor=0,
        next_slot=0,
        group_prompt=torch.empty(0, dtype=torch.long),
        group_base=0,
    )
    env.set_state(state)


class ReMax(TokenClip, Agent[ReMaxConfig]):
    """REINFORCE with the greedy completion's reward as the baseline, under PPO's token clip."""

    config_class = ReMaxConfig
    name = "remax"

    def check_config(self) -> None:
        self.check_clip_range()
        # Not checks, but built once here: the greedy env and an RNG of its own (a
        # top-1 draw picks the arg-max, yet torch.multinomial still advances its RNG).
        self._greedy_env = greedy_env_like(self.env)
        self._greedy_generator = torch.Generator(device=self.policy.device)
        self._greedy_reward_mean = 0.0
        self._sampled_components: dict[str, float] = {}

    @torch.no_grad()
    def greedy_baseline(self, batch: RolloutBatch) -> Tensor:
        """``[B] float32``: the score of the greedy completion of each row's prompt.

        Decodes every distinct prompt of ``batch`` once with the current policy.
        """
        prompts, inverse = torch.unique(batch.prompt_index.cpu(), return_inverse=True)
        env = self._greedy_env
        sampled_components = reward_component_means(self.env)  # before greedy ones join them
        scores = []
        top_k, self.policy.top_k = self.policy.top_k, 1
        try:
            with record_function("lmgym.remax.greedy_rollout"):
                for chunk in prompts.split(env.num_envs):
                    queue_prompts(env, chunk)
                    greedy = collect(env, self.policy, generator=self._greedy_generator)
                    self.tokens_generated += int(greedy.policy_lengths.sum())
                    score = greedy.scores
                    if self.config.overlong_cache is not None:
                        shaping = overlong_penalty(
                            greedy.lengths, env.max_new_tokens, self.config.overlong_cache
                        )
                        score = score + shaping
                    scores.append(score[: chunk.numel()])
        finally:
            self.policy.top_k = top_k
        reward_component_means(self.env)  # drop the greedy completions' components
        self._sampled_components = sampled_components
        baseline = torch.cat(scores)[inverse].to(batch.rewards.device)
        self._greedy_reward_mean = baseline.mean().item()
        return baseline

    def advantages(
        self, batch: RolloutBatch, rewards: Tensor, mask: Tensor, values: Tensor | None
    ) -> tuple[Tensor, None]:
        scores = masked_sum(rewards, mask, dim=1)  # where, not * mask: NaN * 0 is NaN
        return broadcast_to_tokens(scores - self.greedy_baseline(batch), mask), None

    def step(self) -> dict[str, float]:
        """``Agent.step``, plus ``greedy_reward_mean`` (the baseline's mean over rows)."""
        metrics = super().step()
        metrics["greedy_reward_mean"] = self._greedy_reward_mean
        metrics.update(self._sampled_components)
        return metrics
