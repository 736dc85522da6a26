"""MLMT-RL entry point: train a solver (LL) and a feedback writer (HL) jointly on verl.

    python -m verl.trainer.main_mlmt [key=value ...]

With no overrides it trains the embedded default (SmolLM2-135M-Instruct at both levels on generated arithmetic
problems) on whatever hardware is present. ``--help`` lists the ``mlmt.*`` keys with their comments and folds verl's
groups; ``--help-all`` and ``--cfg job`` print the whole config; all three show this machine's config
(``agent_system/launcher/cli_help.py``).
This file is a thin Hydra shim; the package ``verl`` is the PyPI one and this module name is provided by the
MLMT-RL verl plugin (``agent_system/verl_plugin.py``). The code lives in ``agent_system``.
"""

import sys

import hydra

from agent_system.launcher.cli_help import page
from agent_system.launcher.main import run_mlmt, user_errors


@hydra.main(config_path="../../mlmt-configs", config_name="mlmt_trainer", version_base=None)
def main(config):
    try:
        run_mlmt(config)
    except user_errors() as error:  # the message names the bad input; a stack trace would bury it
        sys.exit(f"main_mlmt: error: {error}")


if __name__ == "__main__":
    try:
        text = page(sys.argv[1:])  # --help, --help-all, --cfg job: this machine's config, not Hydra's pages
    except user_errors() as error:
        sys.exit(f"main_mlmt: error: {error}")
    if text is not None:
        sys.stdout.write(text)
        sys.exit(0)
    main()
