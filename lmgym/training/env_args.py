"""A task's env arguments (``--env KEY=VALUE``, ``env_kwargs``) checked and typed.

``check_env_kwargs(task, kwargs)`` checks that the task's vector factory
(``gymnasium.make_vec``'s ``vector_entry_point``) takes each argument and converts
its value to the argument's type with the one converter,
``lmgym.typed_values.parse_value`` (its rules: booleans from true/false/yes/no/1/0
only, an integer not from ``2.5``, ``none``/``null`` where ``None`` is allowed, a
single value where a list is expected as a list of one). The arguments and their
types are the factory's fields (``lmgym.envs.task_factory.factory_arguments``):
a task's ``TaskParams`` fields and the ``EnvOptions`` fields
(``lmgym.envs.options.OPTION_TYPES``). An error names the argument:
``env argument autoreset='maybe': expected true or false``. The arguments the run
sets itself (``num_envs``, ``group_size``, ``tokenizer``, ``device``, ...) are
refused. A user factory taking ``**kwargs`` accepts any name (an env option's
value still typed).
"""

from __future__ import annotations

import difflib
from typing import Any

from lmgym.envs.options import OPTION_TYPES
from lmgym.envs.task_factory import factory_arguments
from lmgym.training.evaluation import vector_factory
from lmgym.typed_values import parse_value

RESERVED = {
    "num_envs": "--num-prompts x --group-size",
    "group_size": "--group-size",
    "num_prompts": "--num-prompts",
    "tokenizer": "the policy's tokenizer",
    "device": "--device",
    "shard": "the data-parallel rank (torchrun)",
    "render_mode": "the run (it renders nothing)",
}


def check_env_kwargs(task: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` checked against ``task``'s vector factory and converted to its types.

    Args:
        task: a registered task id.
        kwargs: the env arguments, e.g. ``{"autoreset": "false", "max_new_tokens": 6}``.

    Returns:
        A new dict with converted values, e.g. ``{"autoreset": False, "max_new_tokens": 6}``.

    Raises:
        ValueError: an argument the run sets itself, one the factory does not take
            (listing those it does, and the closest name), or a value of the wrong
            type; each names the key.
    """
    arguments, takes_any = factory_arguments(vector_factory(task))
    valid = sorted(name for name in arguments if name not in RESERVED)
    out = {}
    for key, value in kwargs.items():
        if key in RESERVED:
            raise ValueError(
                f"env argument {key}: set by the run ({RESERVED[key]}), not an env argument"
            )
        if key in arguments:
            expected = arguments[key].type
        elif takes_any:
            expected = OPTION_TYPES.get(key, Any)
        else:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ValueError(
                f"env argument {key}: task {task} takes no such argument; "
                f"{hint}valid: {', '.join(valid)}"
            )
        out[key] = parse_value(f"env argument {key}", value, expected)
    return out


def with_policy_stop_ids(task: str, kwargs: dict[str, Any], policy: Any) -> dict[str, Any]:
    """``kwargs`` with ``stop_token_ids`` set to the policy's, where the run needs them.

    A chat model stops on more than its tokenizer's EOS (SmolLM2: ``<|im_end|>`` and
    ``<|endoftext|>``, from its generation config); an env built with the default
    (the EOS alone) refuses the others as actions, and the policy refuses such an env.
    So when the user gave no ``stop_token_ids``, the task's factory takes them, and
    the policy has more than the EOS, the run uses ``policy.stop_token_ids``; written
    into the run's ``env_kwargs``, they are recorded in ``config.json`` and a resume
    and ``lmgym eval --run`` build the same env.
    """
    from lmgym.training.evaluation import factory_accepts

    stop = [int(i) for i in getattr(policy, "stop_token_ids", [])]
    eos = policy.tokenizer.eos_token_id
    if "stop_token_ids" in kwargs or stop in ([], [eos]):
        return kwargs
    if not factory_accepts(task, "stop_token_ids"):
        return kwargs
    return {**kwargs, "stop_token_ids": stop}
