"""Optional extras: import a bridge's dependency, or fail naming the pip extra."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, what: str) -> ModuleType:
    """``importlib.import_module(module)``, or an ``ImportError`` naming the extra.

    Args:
        module: the module to import (``"textarena"``, ``"openenv.core"``).
        extra: the lmgym extra that installs it (``"textarena"``, ``"openenv"``).
        what: what needs it, for the message (``"the TextArena bridge"``).

    Raises:
        ImportError: ``module`` is not installed; the message says
            ``pip install 'lmgym[<extra>]'``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{what} needs the optional dependency {module.split('.')[0]!r}, which is not "
            f"installed ({err}); install it with: pip install 'lmgym[{extra}]'"
        ) from err


__all__ = ["require"]
