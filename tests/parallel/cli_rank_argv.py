"""Run ``lmgym train`` under torchrun with rank-dependent extra flags; write the exit status.

Usage: cli_rank_argv.py OUT_DIR 'RANK0 FLAGS' 'RANK1 FLAGS' -- COMMON FLAGS...
"""

import os
import sys
from pathlib import Path

from lmgym.cli import main

out, *rest = sys.argv[1:]
split = rest.index("--")
per_rank, common = rest[:split], rest[split + 1 :]
rank = int(os.environ["RANK"])
code = main(["train", *common, *per_rank[rank].split()])
Path(out, f"rc{rank}").write_text(str(code))
