"""Methods that plug into the MLMT loop, one package each (docs/EXTENDING.md).

Each package registers its estimators and task rewards when imported, and has ``extension(config)``: its
:class:`~agent_system.trainer.hooks.Extension` when the config selects it, else None. :func:`load` imports them all.
"""

from __future__ import annotations

import importlib
import pkgutil

from agent_system.trainer.hooks import Extension


def import_all() -> list:
    """Import every method package (registering its estimators and rewards); returns the modules, by name."""
    return [importlib.import_module(f"{__name__}.{info.name}") for info in sorted(pkgutil.iter_modules(__path__))]


def load(config) -> list[Extension]:
    """The extensions the config selects, in package-name order."""
    extensions = [module.extension(config) for module in import_all()]
    return [extension for extension in extensions if extension is not None]
