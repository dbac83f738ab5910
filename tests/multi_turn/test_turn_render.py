"""Observations are rendered once into ids: the buffer of a chat episode reads exactly
as the chat template renders the whole conversation; plain prompts get the text as it is."""

from __future__ import annotations

import pytest
import torch

from lmgym.char_tokenizer import DEFAULT_CHARS, make_char_tokenizer
from lmgym.envs import TokenVectorEnv
from lmgym.envs.turns import ResponderError

# A ChatML-like template small enough for a character tokenizer: "|" ends a message
# (the assistant's stop id) and "\n" follows it, as "<|im_end|>\n" does in ChatML.
TINY_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'][0] }}>{{ m['content'] }}|\n{% endfor %}"
    "{% if add_generation_prompt %}<a>{% endif %}"
)


@pytest.fixture
def chat_tokenizer():
    tok = make_char_tokenizer(DEFAULT_CHARS + "<>|\n")
    tok.chat_template = TINY_TEMPLATE
    return tok


def chat_ids(tok, conversation, add_generation_prompt: bool) -> list[int]:
    out = tok.apply_chat_template(
        conversation, add_generation_prompt=add_generation_prompt, tokenize=True
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def buffer(env: TokenVectorEnv, row: int = 0) -> list[int]:
    obs = env._obs()
    return obs["input_ids"][row][obs["attention_mask"][row]].tolist()


def play(env: TokenVectorEnv, turns: list[list[int]]) -> None:
    for turn in turns:
        for token in turn:
            env.step(torch.tensor([token]))


@pytest.mark.parametrize("role", ["user", "tool"])
def test_a_chat_buffer_reads_as_the_template_renders_the_conversation(
    scripted, chat_tokenizer, role
):
    tok = chat_tokenizer
    bar = tok.convert_tokens_to_ids("|")
    prompt = [{"role": "user", "content": "hi"}]
    responder = scripted(role=role, done_at=3, reply=lambda text, turn: f"x{turn}")
    env = TokenVectorEnv(tok, [prompt], None, responder=responder, stop_token_ids=[bar])
    env.reset(seed=0)
    words = ["ok", "go"]
    turns = [tok(w, add_special_tokens=False)["input_ids"] + [bar] for w in words]
    play(env, turns)
    conversation = [
        *prompt,
        {"role": "assistant", "content": "ok"},
        {"role": role, "content": "x1"},
        {"role": "assistant", "content": "go"},
        {"role": role, "content": "x2"},
    ]
    assert buffer(env) == chat_ids(tok, conversation, add_generation_prompt=True)
    assert tok.decode(buffer(env)) == (
        f"<u>hi|\n<a>ok|\n<{role[0]}>x1|\n<a>go|\n<{role[0]}>x2|\n<a>"
    )
    # A stop id that is an ordinary character stays in the turn's text, as in a reward's.
    assert [t.turn_texts for t in responder.responded()] == [["ok|"], ["go|"]]


def text_after_ok(tok, prompt, responder, stop_token_ids: list[int], end: int) -> str:
    """The buffer's text after a one-prompt env's policy writes "ok" then ``end``."""
    env = TokenVectorEnv(tok, [prompt], None, responder=responder, stop_token_ids=stop_token_ids)
    env.reset(seed=0)
    play(env, [tok("ok", add_special_tokens=False)["input_ids"] + [end]])
    return tok.decode(buffer(env))


def test_a_turn_ended_by_another_stop_id_gets_the_templates_whole_closing(scripted, chat_tokenizer):
    tok = chat_tokenizer
    bar, dot = tok.convert_tokens_to_ids(["|", "."])
    responder = scripted(done_at=3, reply=lambda text, turn: "x")
    text = text_after_ok(tok, [{"role": "user", "content": "hi"}], responder, [bar, dot], dot)
    assert text == "<u>hi|\n<a>ok.|\n<u>x|\n<a>"


def test_a_plain_prompt_gets_the_text_as_it_is_even_with_a_chat_tokenizer(scripted, chat_tokenizer):
    tok = chat_tokenizer
    bar = tok.convert_tokens_to_ids("|")
    responder = scripted(reply=lambda text, turn: " no, ")
    assert text_after_ok(tok, "hi:", responder, [bar], bar) == "hi:ok| no, "


def test_a_template_that_cannot_render_the_role_is_a_responder_error(scripted, chat_tokenizer):
    tok = chat_tokenizer
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}"
        "{% endif %}<{{ m['role'][0] }}>{{ m['content'] }}|{% endfor %}"
        "{% if add_generation_prompt %}<a>{% endif %}"
    )
    bar = tok.convert_tokens_to_ids("|")
    env = TokenVectorEnv(
        tok, [[{"role": "user", "content": "hi"}]], None, responder=scripted(role="tool"),
        stop_token_ids=[bar],
    )  # fmt: skip
    env.reset(seed=0)
    env.step(torch.tensor([tok.convert_tokens_to_ids("o")]))
    before = buffer(env)
    with pytest.raises(ResponderError, match=r"cannot render a 'tool' message .*no tools"):
        env.step(torch.tensor([bar]))
    assert buffer(env) == before


def test_the_real_chat_models_buffer_reads_as_its_template_renders_it(scripted, smollm2_tokenizer):
    tok = smollm2_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = [{"role": "user", "content": "Guess my number between 1 and 9."}]
    replies = {1: "Higher.", 2: "Lower."}
    env = TokenVectorEnv(
        tok, [prompt], None, max_new_tokens=64, stop_token_ids=[im_end],
        responder=scripted(done_at=3, reply=lambda text, turn: replies[turn]),
    )  # fmt: skip
    env.reset(seed=0)
    guesses = ["I guess 5.", "I guess 7."]
    play(env, [tok(g, add_special_tokens=False)["input_ids"] + [im_end] for g in guesses])
    conversation = [*prompt]
    for turn, guess in enumerate(guesses, start=1):
        conversation += [
            {"role": "assistant", "content": guess},
            {"role": "user", "content": replies[turn]},
        ]
    assert buffer(env) == chat_ids(tok, conversation, add_generation_prompt=True)
    # The policy's tokens are exactly the ones it sampled, the rest is the env's.
    policy = env._obs()["policy_mask"][0]
    sampled = env._obs()["input_ids"][0][policy].tolist()
    assert sampled == [
        i for g in guesses for i in tok(g, add_special_tokens=False)["input_ids"] + [im_end]
    ]
