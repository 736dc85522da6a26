"""A vLLM server's engine port comes from its own block outside the kernel's ephemeral range (agent_system.vllm_port).

The race it closes: vLLM picks the engine's ``torch.distributed`` port by binding port 0 and closing it; the engine
binds it later, and on a busy node an outgoing connection can take it meanwhile (EADDRINUSE, "Engine core
initialization failed"). The integration test of two policies checks the port a real server listens on.
"""

from __future__ import annotations

import logging
import os
import random
import socket

import pytest

from agent_system import vllm_port

DEFAULT_EPHEMERAL = (32768, 60999)


def test_the_pool_lies_outside_the_ephemeral_range_and_above_rays_worker_ports():
    assert vllm_port.port_pool(DEFAULT_EPHEMERAL) == range(20000, 32768)
    assert vllm_port.port_pool((1024, 40000)) == range(40001, 65536)  # the larger stretch, above
    assert vllm_port.port_pool((15000, 65000)) is None  # 535 ports above, none below: too few
    assert vllm_port.port_pool((1024, 65535)) is None


def test_each_server_draws_its_own_block_even_after_the_same_seed():
    drawn = set()
    for _ in range(40):
        random.seed(0)  # a trainer's seeding must not make every server draw the same block
        env: dict[str, str] = {}
        vllm_port.choose_vllm_port(env, DEFAULT_EPHEMERAL)
        port = int(env["VLLM_PORT"])
        assert 20000 <= port <= 32768 - vllm_port.BLOCK_PORTS and (port - 20000) % vllm_port.BLOCK_PORTS == 0
        drawn.add(port)
    assert len(drawn) > 30


def test_a_port_the_user_set_is_kept_and_no_room_leaves_vllm_its_own_pick(caplog):
    env = {"VLLM_PORT": "41000"}
    vllm_port.choose_vllm_port(env, DEFAULT_EPHEMERAL)
    assert env == {"VLLM_PORT": "41000"}
    env = {}
    with caplog.at_level(logging.WARNING, logger="agent_system.vllm_port"):
        vllm_port.choose_vllm_port(env, (1024, 65535))
    assert env == {} and "no room outside the ephemeral port range (1024, 65535)" in caplog.text


def test_the_ephemeral_range_is_read_from_the_kernel_file(tmp_path):
    (tmp_path / "range").write_text("32768\t60999\n")
    assert vllm_port.read_ephemeral_range(tmp_path / "range") == DEFAULT_EPHEMERAL
    assert vllm_port.read_ephemeral_range(tmp_path / "missing") is None


@pytest.mark.external  # binds ports on this machine
def test_vllm_scans_from_the_chosen_port(monkeypatch):
    """vLLM's own port pick starts at the chosen port, and steps past one that is taken."""
    from vllm.utils.network_utils import get_open_port

    with socket.socket() as taken:
        for _ in range(5):  # a block whose first port another program holds: draw again
            monkeypatch.delenv("VLLM_PORT", raising=False)
            vllm_port.choose_vllm_port()
            base = int(os.environ["VLLM_PORT"])
            try:
                taken.bind(("", base))
                break
            except OSError:
                continue
        taken.listen()
        assert taken.getsockname()[1] == base
        assert base < get_open_port() < base + vllm_port.BLOCK_PORTS


def test_the_plugin_leaves_a_process_outside_ray_alone(monkeypatch):
    """A driver that starts the Ray cluster passes its environment to every worker: one port for all servers."""
    from agent_system.cpu_backend.vllm_plugin import register

    monkeypatch.delenv("VLLM_PORT", raising=False)
    register()
    assert "VLLM_PORT" not in os.environ
