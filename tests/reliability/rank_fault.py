"""Run ``lmgym train`` under torchrun with a full disk on rank 0 at one write point.

Usage: rank_fault.py OUT_DIR LABEL TRAIN FLAGS...

On rank 0 the write point named ``LABEL`` raises ``OSError(ENOSPC)``; every rank
writes its exit status to ``OUT_DIR/rc{rank}`` and its stderr to ``OUT_DIR/err{rank}``.
"""

import contextlib
import errno
import io
import os
import sys
from pathlib import Path

from lmgym.cli import main
from lmgym.persistence import atomic

out, label, *argv = sys.argv[1:]
rank = int(os.environ["RANK"])
if rank == 0:

    def point(name: str) -> None:
        if name == label:
            raise OSError(errno.ENOSPC, "No space left on device")

    atomic.write_point = point
err = io.StringIO()
with contextlib.redirect_stderr(err):
    code = main(["train", *argv])
Path(out, f"err{rank}").write_text(err.getvalue())
Path(out, f"rc{rank}").write_text(str(code))
