"""Every leaf key of the composed config (verl's tree and ``mlmt.*``) is read by something, is refused when set, or is
listed below with the reason it may stay (issue 41, point 6: accepted keys that did nothing).

A key counts as read when its name (the last component of its dotted path) is an attribute or a quoted string in the
project's sources (``agent_system/``) or in verl's installed package, less the driver modules this trainer replaces
(verl's workers, engines and rollout servers read their own config sections; ``main_ppo`` and ``RayPPOTrainer`` never
run). A key under ``verl_keys.BYPASSED_VERL_KEYS`` is refused when set, so it counts too. The test reads files only
(about a second): a key added to the YAML that nothing reads fails it.
"""

from __future__ import annotations

import fnmatch
import re
from functools import cache
from pathlib import Path

import pytest
import verl
from omegaconf import OmegaConf

from agent_system.config import compose_config
from agent_system.verl_keys import BYPASSED_VERL_KEYS, POLICY, POLICY_TREES

REPO = Path(__file__).resolve().parents[3]
VERL = Path(verl.__file__).parent
# verl's driver and its other entry points, replaced by agent_system/trainer (a key only they read does nothing here)
VERL_DRIVER = (
    "trainer/main_ppo.py",
    "trainer/main_ppo_v0.py",
    "trainer/ppo/ray_trainer.py",
    "trainer/ppo/v1/",
    "trainer/sft_trainer.py",
    "trainer/sft_trainer_ray.py",
    "trainer/main_eval.py",
    "trainer/main_generation_server.py",
)
TREES = ("actor_rollout_ref", "hl")
ENGINES = ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "hl.actor.fsdp_config",
           "hl.ref.fsdp_config", "critic.fsdp", "hl_critic.fsdp")  # fmt: skip

# dotted-path pattern (fnmatch) -> why the key may stay though nothing here reads it by name
ALLOWED = {
    **{
        f"{engine}.turbo_config.*": "verl's FSDP-turbo plan: the engine hands the whole dict to fsdp_turbo, whose "
        "names these are (fsdp_turbo_impl.py); that engine is not installed, so it never runs here"
        for engine in ENGINES
    },
    **{
        f"{tree}.model.lora.{key}": "verl's Megatron LoRA settings: the FSDP engine reads only model.lora.merge "
        "(rank and dropout are refused: config._reject_inert_lora)"
        for tree in (*TREES, "critic", "hl_critic")
        for key in (
            "dropout_position",
            "lora_A_init_method",
            "lora_B_init_method",
            "a2a_experimental",
            "freeze_vision_model",
            "freeze_vision_projection",
            "freeze_language_model",
        )  # fmt: skip
    },
    **{f"{tree}.actor.freeze_vision_tower": "vision-language models only; verl 0.9.1 declares it" for tree in TREES},
    **{
        f"{tree}.nccl_timeout": "verl declares it for actor_rollout_ref and reads none (hl mirrors it)"
        for tree in TREES
    },
    "*.rollout.multi_stage_wake_up": "declared by verl 0.9.1's RolloutConfig, read by none of its servers",
    "transfer_queue.*": "verl's transfer queue: off, and transfer_queue.enable is refused when set (verl_keys)",
    "trainer.use_v1": "chooses between verl's two drivers (main_ppo), both replaced by this trainer",
    "global_profiler.global_tool_config.nsys.*_nsight_options.*": "Nsight Systems command-line options, passed as "
    "one dict by verl's driver; profiling is not wired into this trainer",
    "global_profiler.global_tool_config.torch_memory.kw_args": "keyword arguments handed whole to torch's memory "
    "profiler by verl's driver; profiling is not wired into this trainer",
}


def _leaves(value: object, prefix: str = ""):
    """Dotted paths of every leaf (a list, a scalar or an empty mapping) of a plain container."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix


@cache
def names_read() -> frozenset[str]:
    """Attribute names and quoted identifiers in agent_system/ and in verl less :data:`VERL_DRIVER`."""
    names: set[str] = set()
    files = [*(REPO / "agent_system").rglob("*.py"), *VERL.rglob("*.py")]
    for path in files:
        relative = path.relative_to(VERL).as_posix() if path.is_relative_to(VERL) else ""
        if any(relative.startswith(driver) for driver in VERL_DRIVER):
            continue
        text = path.read_text(errors="ignore")
        names.update(re.findall(r"\.(\w+)", text))
        names.update(re.findall(r"[\"'](\w+)[\"']", text))
    return frozenset(names)


def refused_prefixes() -> list[str]:
    """The subtrees of ``BYPASSED_VERL_KEYS`` on each policy tree: refused when set to other than verl's default."""
    return [
        pattern.replace(POLICY, tree) if tree else pattern
        for pattern in BYPASSED_VERL_KEYS
        for tree in (POLICY_TREES if pattern.startswith(POLICY) else (None,))
    ]


def unread_keys(config) -> list[str]:
    """Leaf keys of ``config`` that nothing reads by name, nothing refuses, and :data:`ALLOWED` does not give."""
    read, refused = names_read(), refused_prefixes()
    return [
        key
        for key in _leaves(OmegaConf.to_container(config, resolve=False))
        if key.rsplit(".", 1)[-1] not in read
        and not any(key == prefix or key.startswith(prefix + ".") for prefix in refused)
        and not any(fnmatch.fnmatchcase(key, pattern) for pattern in ALLOWED)
    ]


@pytest.fixture(scope="module")
def default_config():
    return compose_config([])


def test_every_key_of_the_composed_config_is_read_refused_or_allowed(default_config):
    assert unread_keys(default_config) == []


def test_each_allowed_pattern_is_still_needed(default_config):
    """An allowed pattern must match a key that nothing reads (else it hides nothing and goes)."""
    read = names_read()
    unread = [key for key in _leaves(OmegaConf.to_container(default_config, resolve=False))
              if key.rsplit(".", 1)[-1] not in read]  # fmt: skip
    stale = [pattern for pattern in ALLOWED if not any(fnmatch.fnmatchcase(key, pattern) for key in unread)]
    assert stale == []


def test_a_key_nothing_reads_is_found(default_config):
    config = default_config.copy()
    OmegaConf.set_struct(config, False)
    config.mlmt.reward.unread_weight_of_nothing = 1.0
    config.actor_rollout_ref.rollout.sampling_knob_nobody_reads = 0
    assert unread_keys(config) == [
        "actor_rollout_ref.rollout.sampling_knob_nobody_reads",
        "mlmt.reward.unread_weight_of_nothing",
    ]
