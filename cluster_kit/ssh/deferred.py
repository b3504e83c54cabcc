"""Imports paramiko makes that clusterkit defers (imported first, by ssh/__init__.py)."""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types


class _Deferred(types.ModuleType):
    """Stands in for a module until one of its attributes is first used."""

    def __getattr__(self, attr: str) -> object:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attr)


def _defer_import(name: str) -> None:
    """Make `import name` cheap: the module is imported on first attribute use.

    paramiko.config imports invoke, only ever used for ssh_config's `Match exec`,
    and invoke brings asyncio, yaml and unittest.mock: about a third of paramiko's
    import time, and of the interpreter's exit (0.1-0.2 s on a loaded 2-core
    machine, at the start and the end of every fan-out). A module that is not
    installed stays an ImportError."""
    if name in sys.modules or importlib.util.find_spec(name) is None:
        return
    sys.modules[name] = _Deferred(name)


_defer_import("invoke")
