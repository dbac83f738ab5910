"""GRPO from scratch: the whole algorithm on lmgym's env and policy, without ``Agent``.

Run ``python examples/grpo_from_scratch.py``: a tiny GPT-2 learns to answer
"say hello:" with "hello" (lmgym/TargetString-v0), and the mean reward climbs
from about 0.03 to 1 in about 100 iterations (about ten seconds of CPU, start-up
included). Measured on seeds 0-14 (``main(seed=...)``), every one of them: the
first 5 iterations average 0.02-0.04, the mean over 5 iterations first reaches
0.95 in a window starting at iteration 78-89, iterations 95-104 average 0.97-0.99,
and the last 10 of 150 average 0.99-1.00
(``tests/test_examples_grpo_from_scratch.py`` checks seeds 0-2).

Why 16 completions a prompt at lr 1e-3: with one step per batch at 2e-3 and 8 a
prompt, 3 of seeds 0-9 settled on a wrong answer and stayed (seed 0 on "hhlll",
reward 0.6; seeds 7 and 8 at 0.8). Once every completion of a group is the same,
its advantages are all 0 and nothing moves the policy off it; smaller steps and
larger groups keep some variety in each group until the answer is found.

One iteration, as in docs/algorithms.md:

1. collect: 4 prompts x 16 completions each (``lmgym.rollout.collect``);
2. advantages: each completion's reward against its own group's,
   ``A_i = (R_i - mean_g R) / (std_g R + eps)`` (#grpo-and-dr-grpo);
3. loss: PPO's token clip on the ratio ``rho = exp(lp - lp_old)`` (#token-clip),
   averaged over each completion's tokens, then over completions
   (``seq-mean-token-mean``, #aggregation);
4. one AdamW step, gradient norm clipped to 1.

It takes one gradient step per batch, so ``lp_old`` is the detached ``lp`` of the
same forward pass and ``rho = 1``: the clip is written out for the reader but
only binds with several steps per batch. ``lmgym.agents.GRPO`` with
``update_epochs=1, num_minibatches=1`` computes exactly this update
(``tests/test_examples_grpo_from_scratch.py`` checks that); its defaults take 4
epochs of 2 minibatches per batch at 3e-4, where the clip does bind, and it adds
KL, TIS, metrics, checkpoints and callbacks.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import Tensor

import lmgym  # noqa: F401  (registers the lmgym/... tasks)
from lmgym import CausalLMPolicy, RolloutBatch, collect, make_tiny_model


def group_advantages(scores: Tensor, group_ids: Tensor, eps: float = 1e-4) -> Tensor:
    """GRPO's advantage: each reward standardised within its group.

    Args:
        scores: ``[B] float32``, one reward per completion.
        group_ids: ``[B] int64``; rows with the same id are completions of one prompt
            (every group has the same size G).

    Returns:
        ``[B] float32``; 0 for every row of a group whose rewards are all equal.
    """
    groups, inverse = torch.unique(group_ids, return_inverse=True)
    order = torch.argsort(inverse, stable=True)  # the rows of each group, together
    grouped = scores[order].view(groups.numel(), -1)  # [P, G]
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)  # unbiased, as torch.std
    normalised = torch.where(std > 0, (grouped - mean) / (std + eps), 0.0)
    return torch.empty_like(scores).index_put((order,), normalised.flatten())


def grpo_loss(
    policy: CausalLMPolicy, batch: RolloutBatch, clip_low: float = 0.2, clip_high: float = 0.2
) -> Tensor:
    """The loss of one GRPO update on ``batch`` (a scalar with gradient).

    Args:
        policy: the policy being trained.
        batch: completions sampled by ``policy`` (before this update).
        clip_low, clip_high: the token clip's half-widths around 1.

    Returns:
        0-dim float32 tensor.
    """
    advantages = group_advantages(batch.scores, batch.group_ids)[:, None]  # [B, 1]
    ids, attention_mask = batch.input_ids()  # prompt + completion, [B, Lp + L]
    # Teacher-forced log-probs of the completion tokens, with gradient: [B, L]; a
    # group's rows run their shared prompt through the model once.
    logprobs, _ = policy.logprobs(
        ids, attention_mask, batch.max_new_tokens, group_ids=batch.group_ids, with_entropy=False
    )
    old_logprobs = logprobs.detach()  # one step per batch: lp_old is lp before the step
    ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0).exp()  # the clamp only guards exp
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)  # [B, L], pessimistic
    mask = batch.completion_mask & batch.valid[:, None]  # real completion tokens
    per_sequence = torch.where(mask, per_token, 0.0).sum(1) / mask.sum(1).clamp(min=1)
    return per_sequence.mean()


def update(
    policy: CausalLMPolicy,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    max_grad_norm: float = 1.0,
) -> float:
    """One gradient step on ``batch``; returns the loss.

    (With ``rho = 1`` the loss is ``-mean(A)``, about 0 since each group's advantages
    sum to 0; its gradient, ``-A * grad lp``, is what moves the policy.)
    """
    optimizer.zero_grad(set_to_none=True)
    loss = grpo_loss(policy, batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def main(iterations: int = 150, seed: int = 0) -> list[float]:
    """Train on TargetString and print the mean reward; returns it per iteration."""
    torch.manual_seed(seed)
    env = gym.make_vec("lmgym/TargetString-v0", num_envs=64, group_size=16)
    policy = CausalLMPolicy(make_tiny_model(len(env.tokenizer), seed=seed), env.tokenizer)
    # AdamW's default weight decay is 0.01; GRPO's config uses none.
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3, weight_decay=0.0)
    sampler = torch.Generator().manual_seed(seed)
    rewards = []
    for iteration in range(iterations):
        batch = collect(env, policy, seed=seed if iteration == 0 else None, generator=sampler)
        update(policy, optimizer, batch)
        rewards.append(batch.scores.mean().item())
        if iteration % 10 == 0 or iteration == iterations - 1:
            sample = env.decode_completions(batch.completion_ids[:1])[0]
            print(f"iteration {iteration:4d}   mean reward {rewards[-1]:.3f}   e.g. {sample!r}")
    return rewards


if __name__ == "__main__":
    # Tiny models are overhead-bound: one thread is several times faster than two.
    torch.set_num_threads(1)
    main()
