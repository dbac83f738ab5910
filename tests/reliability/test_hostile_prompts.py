"""Hostile prompt files fail fast, naming the file and the line (issue 13, item 5)."""

from __future__ import annotations

import time

import pytest

from lmgym.envs.prompts import JsonlPrompts


def write(tmp_path, data: bytes):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n' + data)
    return path


def test_a_huge_line_is_refused_before_it_is_parsed(tmp_path):
    path = write(tmp_path, b'{"prompt": "' + b"x" * (20 << 20) + b'"}\n')
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"prompts.jsonl:2: line longer than max_line_bytes="):
        JsonlPrompts(path)
    assert time.perf_counter() - start < 2.0  # was 34 s and +3.7 GB through the tokenizer


def test_the_bound_is_configurable(tmp_path):
    path = write(tmp_path, b'{"prompt": "' + b"y" * 2000 + b'"}\n')
    assert len(JsonlPrompts(path, max_line_bytes=4096)) == 2
    with pytest.raises(ValueError, match="max_line_bytes=1000"):
        JsonlPrompts(path, max_line_bytes=1000)


def test_deep_nesting_is_a_clear_error_not_a_recursion_error(tmp_path):
    path = write(tmp_path, b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    with pytest.raises(ValueError, match=r"prompts.jsonl:2: JSON nested too deeply"):
        JsonlPrompts(path)


def test_bad_utf8_names_the_file_and_line(tmp_path):
    path = write(tmp_path, b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"prompts.jsonl:2: not UTF-8"):
        JsonlPrompts(path)
