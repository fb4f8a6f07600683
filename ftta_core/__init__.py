"""ftta_core: the library behind the ftta federated test-time adaptation workbook.

Extending it (see docs/adding-a-method.md)::

    from ftta_core import register_local, register_strategy   # decorators: @register_local("mytent")
    from ftta_core import load_plugins                         # --plugin / $FTTA_PLUGINS / 'ftta.plugins' entry points
    from ftta_core import check_backends_agree                 # the loop and vectorized backends agree on your method

Importing the package stays light (no torch) until one of these is used.
"""
from typing import Any

from . import project  # first: its IMPORTED_AT_NS precedes the import of every other module of the package
from .plugins import load_plugins

__version__ = "0.1.0"
__all__ = ["register_local", "register_strategy", "load_plugins", "check_backends_agree", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "register_local":  # the registering decorators import their layer (torch) when asked for
        from .tta import register_local

        return register_local
    if name == "register_strategy":
        from .strategies import register_strategy

        return register_strategy
    if name == "check_backends_agree":  # imports torch and the engine: only when asked for
        from .contract import check_backends_agree

        return check_backends_agree
    raise AttributeError(f"module 'ftta_core' has no attribute {name!r}")
