"""Value functions for PPO: a head on the policy's trunk, or a separate critic model."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Literal

import torch
from torch import Tensor, nn

from lmgym.policy.adapters import adapters_disabled
from lmgym.policy.causal_lm import CausalLMPolicy
from lmgym.policy.views import live_view

ValueInit = Literal["zeros", "normal"]


class ValueHead(nn.Module):
    """Linear map from hidden states to one value per position.

    Args:
        hidden_size: ``H``.
        init: ``"zeros"`` (V = 0 at start: the first advantages are plain returns)
            or ``"normal"`` (std 1/sqrt(H), like an untied LM head).
    """

    def __init__(self, hidden_size: int, init: ValueInit = "zeros") -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        if init == "zeros":
            nn.init.zeros_(self.linear.weight)
        elif init == "normal":
            nn.init.normal_(self.linear.weight, std=hidden_size**-0.5)
        else:
            raise ValueError(f"value_init={init!r} is not one of ['zeros', 'normal']")
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        """``[B, L, H]`` (any float dtype, e.g. bf16 under autocast) -> ``[B, L] float32``."""
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1).float()


class Critic(nn.Module):
    """``V(s_t)`` for every completion position of a batch.

    ``shared=True`` puts the head on the policy's own trunk (one forward pass
    serves both losses); ``shared=False`` copies the policy's initial trunk into a
    separate critic model, so value gradients never touch the policy.

    Args:
        policy: the policy whose trunk is shared or copied.
        shared: share the trunk or keep a separate copy.
        init: initialisation of the value head.
    """

    def __init__(self, policy: CausalLMPolicy, shared: bool = True, init: ValueInit = "zeros"):
        super().__init__()
        self.shared = shared
        self.trunk_policy = policy if shared else copy.deepcopy(policy)
        self.head = ValueHead(policy.model.config.hidden_size, init).to(policy.device)

    def on_modules(self, trunk_policy: CausalLMPolicy, head: nn.Module) -> Critic:
        """This critic with ``head`` on ``trunk_policy``'s pass (data-parallel FSDP's
        sharded replicas: the policy's view for a shared trunk, else the separate
        trunk's); a view (``lmgym.policy.views.live_view``), this critic unchanged."""
        return live_view(self, trunk_policy=trunk_policy, head=head)

    def own_parameters(self) -> list[nn.Parameter]:
        """Trainable parameters the policy's optimizer does not already hold (a separate
        trunk under an adapter trains its adapter only)."""
        params = list(self.head.parameters())
        if not self.shared:
            params += [p for p in self.trunk_policy.model.parameters() if p.requires_grad]
        return params

    def values(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        num_targets: int,
        hidden: Tensor | None = None,
        group_ids: Tensor | None = None,
    ) -> Tensor:
        """Values of the states before each of the last ``num_targets`` tokens.

        Args:
            input_ids, attention_mask: ``[B, S]``.
            hidden: the policy's ``[B, L, H]`` hidden states when the trunk is shared
                and they were already computed (saves a forward pass).
            group_ids: ``[B] int64`` rows' groups: a group's prompt runs once through
                the trunk (``CausalLMPolicy.sequence_hidden``); ``None``: a plain pass.

        Returns:
            ``[B, L] float32``: ``values[:, t] = V(prompt, y_<t)``.
        """
        if hidden is None or not self.shared:
            hidden = self.trunk_policy.sequence_hidden(
                input_ids, attention_mask, num_targets, group_ids
            )
        return self.head(hidden)

    def state_dict_for_save(self) -> dict[str, Tensor]:
        state = {f"head.{k}": v for k, v in self.head.state_dict().items()}
        if not self.shared:
            state.update({f"trunk.{k}": v for k, v in self.trunk_policy.model.state_dict().items()})
        return state

    def load_from_save(self, state: dict[str, Tensor]) -> None:
        self.head.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("head.")})
        if not self.shared:
            self.trunk_policy.model.load_state_dict(
                {k[6:]: v for k, v in state.items() if k.startswith("trunk.")}
            )


class AdapterDisabledReference(CausalLMPolicy):
    """The base model of a PEFT policy, seen through the policy's own model object.

    Every trunk pass runs under ``PeftModel.disable_adapter()``, so it computes the
    base model's outputs while sharing every weight with the policy (no second copy
    in memory). With peft's default initialisation (LoRA's B = 0) it equals the
    policy before the first update.

    Args:
        policy: a policy whose model is a ``peft.PeftModel``.
    """

    def __init__(self, policy: CausalLMPolicy) -> None:
        if not policy.is_peft:
            raise TypeError("policy: AdapterDisabledReference needs a policy with a PEFT model")
        super().__init__(
            policy.model,
            policy.tokenizer,
            **dataclasses.asdict(policy.sampling),
            fused_activations=False,
            allowed_special_tokens=policy.allowed_special_tokens,
            autocast_dtype=policy.autocast_dtype,
        )
        self.use_token_rules(policy.token_rules)  # the env's, if the policy has them

    def _trunk_context(self) -> contextlib.AbstractContextManager[None]:
        return adapters_disabled(self.model)


@torch.no_grad()
def frozen_copy(policy: CausalLMPolicy) -> CausalLMPolicy:
    """The usual reference model for the KL term, frozen.

    A PEFT policy gets an ``AdapterDisabledReference``: its base model (the adapter
    disabled), sharing the policy's weights; the base weights never train, so it
    stays the same reference through training and after a reload. Any other policy
    gets a frozen deep copy of itself as it is now.
    """
    if policy.is_peft:
        return AdapterDisabledReference(policy)
    ref = copy.deepcopy(policy)
    ref.model.eval()
    for p in ref.model.parameters():
        p.requires_grad_(False)
    return ref
