"""The ``hf`` rollout server's options (``<tree>.rollout.engine_kwargs.hf.*``): set on the command line like any key
(no Hydra ``+``: before, the keys existed only in the CPU overlay, applied after Hydra composed the config, so
``hl.rollout.engine_kwargs.hf.max_batch_size=1``, the key a dead server's message names, was refused), reaching the
level's server and acting there; an option that is not one, out of range, or set on a level whose rollout is not
``hf`` is refused at start-up by name."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pytest

from agent_system.config import ConfigError, compose_config, validate_config
from agent_system.cpu_backend.hf_server import HFRolloutServer
from agent_system.hf_server_options import HFServerOptions

HF_HL = "hl.rollout.name=hf"
KEY = "hl.rollout.engine_kwargs.hf"


def _hl_options(overrides: list[str]) -> HFServerOptions:
    config = compose_config(overrides)
    validate_config(config)
    return HFServerOptions.from_config(config.hl.rollout.engine_kwargs.hf, KEY)


def test_each_option_is_set_without_a_plus_and_unset_ones_keep_the_server_default():
    assert _hl_options([HF_HL]) == HFServerOptions()
    options = _hl_options([HF_HL, f"{KEY}.max_batch_size=1", f"{KEY}.batch_wait_ms=0", f"{KEY}.num_threads=1"])
    assert options == HFServerOptions(max_batch_size=1, batch_wait_ms=0.0, num_threads=1)
    ll = compose_config(
        ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.engine_kwargs.hf.max_batch_size=3"]
    )
    validate_config(ll)
    assert ll.actor_rollout_ref.rollout.engine_kwargs.hf.max_batch_size == 3
    assert ll.hl.rollout.engine_kwargs.hf.max_batch_size is None  # each level its own


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ([HF_HL, f"+{KEY}.max_batchsize=1"], f"{KEY}.max_batchsize: not an option of the hf rollout server"),
        ([HF_HL, f"{KEY}.max_batch_size=0"], f"{KEY}.max_batch_size=0: use a whole number >= 1"),
        ([HF_HL, f"{KEY}.max_batch_size=2.5"], f"{KEY}.max_batch_size=2.5: use a whole number >= 1"),
        ([HF_HL, f"{KEY}.batch_wait_ms=-1"], f"{KEY}.batch_wait_ms=-1: use a number >= 0"),
        ([HF_HL, f"{KEY}.num_threads=two"], f"{KEY}.num_threads='two': use a whole number >= 0"),
        # vllm on that level: no hf server reads the option
        ([f"{KEY}.max_batch_size=1", f"{KEY}.num_threads=1"],
         f"{KEY}.max_batch_size, {KEY}.num_threads cannot act: hl.rollout.name=vllm"),
    ],
)  # fmt: skip
def test_an_option_that_cannot_be_read_or_cannot_act_is_refused_by_name(overrides, says):
    config = compose_config(overrides)
    with pytest.raises(ConfigError, match="^" + re.escape(says)):
        validate_config(config)


def test_max_batch_size_reaches_the_server_and_bounds_its_batches(tmp_path):
    from agent_system.models.tiny import build_tiny_model

    tiny = build_tiny_model(tmp_path / "model")

    def batches(options: HFServerOptions) -> int:
        server = HFRolloutServer(tiny, "float32", [0], 0, 64, 4, dataclasses.asdict(options))

        async def together():
            calls = [server.generate([5, 17, 42 + i], {"max_tokens": 4, "seed": i}, f"r{i}") for i in range(4)]
            return await asyncio.gather(*calls)

        asyncio.run(together())
        return server.stats["batches"]

    assert batches(_hl_options([HF_HL])) == 1  # the default: the four requests in one batch
    assert batches(_hl_options([HF_HL, f"{KEY}.max_batch_size=2"])) == 2
