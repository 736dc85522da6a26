"""W&B is checked before any worker starts (issue 42, point 9): the experiment scripts log to W&B by default, and a
run without a key or an offline mode used to start its workers and servers and only then stop at its first log.

    .venv/bin/python -m pytest tests/unit/trainer/test_loggers_check_on_cpu.py
"""

from __future__ import annotations

import pytest

from agent_system.config import ConfigError
from agent_system.launcher.main import check_loggers


def test_wandb_without_a_key_or_offline_mode_is_refused(tmp_path):
    home = {"HOME": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"logs to W&B, but no W&B key is set: export WANDB_API_KEY"):
        check_loggers(["console", "wandb"], home)
    check_loggers(["console", "tensorboard"], home)  # no W&B: nothing to check
    check_loggers(["wandb"], {**home, "WANDB_API_KEY": "k"})
    check_loggers(["wandb"], {**home, "WANDB_MODE": "offline"})
    with pytest.raises(ConfigError):
        check_loggers(["wandb"], {**home, "WANDB_MODE": "online"})


def test_a_wandb_login_in_netrc_counts_as_a_key(tmp_path):
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    netrc.chmod(0o600)
    check_loggers(["wandb"], {"HOME": str(tmp_path)})
    netrc.write_text("machine example.org\n  login user\n  password secret\n")
    with pytest.raises(ConfigError):
        check_loggers(["wandb"], {"HOME": str(tmp_path)})
