"""Methods that plug into the MLMT loop, one package each, and the user's plug-in modules (docs/EXTENDING.md).

A method package of this folder, or a module named in ``mlmt.plugins``, registers its estimators and task rewards
when imported (``trainer/advantages.py``), and may define:

* ``extension(config)``: its :class:`~agent_system.trainer.hooks.Extension` when the config selects it, else None;
* ``config_errors(config, frozen)``: the start-up refusals of its settings (``frozen``: ``config.frozen_reasons``);
* ``model_path_keys(config)``: the config keys of models it loads (checked and resolved like the policies');
* ``resource_demands(config)``: ``(name, {resource: amount})`` of each Ray actor it starts outside the levels' pools
  (checked against the cluster's free resources with the pools);
* ``own_critics(config)``: ``{level: description}`` of each value model it trains itself, outside verl's critic
  (shown in the run plan).

The launcher calls :func:`check_config` at start-up (which imports them all) and :func:`load` to build the trainer.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from agent_system.config import ConfigError, frozen_reasons
from agent_system.trainer.advantages import estimator_names, hl_reward_names
from agent_system.trainer.hooks import Extension


def import_all(config=None) -> list[ModuleType]:
    """Import every method package, then each module of ``mlmt.plugins`` (registering their estimators and rewards);
    returns the modules, method packages by name first."""
    modules = [importlib.import_module(f"{__name__}.{info.name}") for info in sorted(pkgutil.iter_modules(__path__))]
    for name in [] if config is None else plugin_names(config):
        try:
            modules.append(importlib.import_module(name))
        except ImportError as error:
            raise ConfigError(f"mlmt.plugins: cannot import {name!r} ({error}); is it on PYTHONPATH?") from error
    return modules


def plugin_names(config) -> list[str]:
    """The modules of ``mlmt.plugins``: a list, or one module name given without brackets (``mlmt.plugins=my.mod``,
    which used to be read letter by letter: "cannot import 'm'").

    Raises:
        ConfigError: ``mlmt.plugins`` is neither a list nor a module name.
    """
    plugins = config.mlmt.plugins
    if isinstance(plugins, str):
        return [plugins]
    if plugins is None or not all(isinstance(name, str) for name in plugins):
        raise ConfigError(f"mlmt.plugins={plugins!r}: give module names, e.g. mlmt.plugins=[my_pkg.my_estimators]")
    return list(plugins)


def _hooks(config, name: str) -> list:
    """The module-level function ``name`` of each method package and plug-in that defines one, in import order."""
    return [getattr(module, name) for module in import_all(config) if hasattr(module, name)]


def check_config(config) -> None:
    """The start-up checks that belong to methods: each level's estimator and the HL's reward among the registered
    ones, then every method's and plug-in's ``config_errors``; raises ConfigError naming the keys."""
    hooks = _hooks(config, "config_errors")  # imports the plug-ins first: their registrations are accepted values
    errors = [
        f"mlmt.{level}.adv_estimator={config.mlmt[level].adv_estimator!r}: choose one of {estimator_names()}"
        for level in ("ll", "hl")
        if config.mlmt[level].adv_estimator not in estimator_names()
    ]
    if config.mlmt.reward.hl_reward not in hl_reward_names():
        errors.append(f"mlmt.reward.hl_reward={config.mlmt.reward.hl_reward!r}: choose one of {hl_reward_names()}")
    if errors:  # the methods' own checks read these values
        raise ConfigError("; ".join(errors))
    frozen = frozen_reasons(config)
    errors = [error for hook in hooks for error in hook(config, frozen)]
    if errors:
        raise ConfigError("; ".join(errors))


def model_path_keys(config) -> list[str]:
    """The config keys of the models the methods and plug-ins the config selects load."""
    return [key for hook in _hooks(config, "model_path_keys") for key in hook(config)]


def resource_demands(config) -> list[tuple[str, dict[str, float]]]:
    """The Ray resources the selected methods' and plug-ins' own actors ask for (one entry per actor)."""
    return [demand for hook in _hooks(config, "resource_demands") for demand in hook(config)]


def own_critics(config) -> dict[str, str]:
    """The value models the selected methods and plug-ins train themselves, by level (for the run plan)."""
    return {level: text for hook in _hooks(config, "own_critics") for level, text in hook(config).items()}


def load(config) -> list[Extension]:
    """The extensions the config selects, method packages by name first, then the plug-ins in their order."""
    extensions = [hook(config) for hook in _hooks(config, "extension")]
    return [extension for extension in extensions if extension is not None]
