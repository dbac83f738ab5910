"""Failed writes reported as ``OSError``, whichever library did the writing.

A full disk reaches Python as ``OSError(ENOSPC)`` from ``open``/``write``, but
``torch.save`` reports it as ``RuntimeError: [enforce fail at inline_container.cc]
... unexpected pos`` (or ``PytorchStreamWriter failed writing file``) and
safetensors as ``SafetensorError: Error while serializing: IoError(...)``.
``writing(path)`` turns those into one ``OSError`` naming the file, so every
caller handles a failed write in one way (the CLI: one line, exit 2; the last
complete checkpoint is intact because every write is atomic).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_TORCH_WRITE_FAILURES = ("inline_container", "PytorchStreamWriter")


def as_os_error(error: BaseException, path: str | Path) -> OSError | None:
    """An ``OSError`` naming ``path`` for ``error`` when it is a library's report of a
    failed write, else ``None`` (a bug or bad data: not ours to relabel)."""
    message = str(error).strip()
    first = message.splitlines()[0] if message else type(error).__name__
    torch_write = isinstance(error, RuntimeError) and any(
        marker in message for marker in _TORCH_WRITE_FAILURES
    )
    safetensors_write = type(error).__name__ == "SafetensorError" and "IoError" in message
    if not (torch_write or safetensors_write):
        return None
    return OSError(f"writing {path} failed (is the disk full?): {first[:300]}")


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Run the body, re-raising a library's failed-write error as ``OSError`` (``as_os_error``)."""
    try:
        yield
    except OSError:
        raise
    except Exception as error:
        converted = as_os_error(error, path)
        if converted is None:
            raise
        raise converted from error
