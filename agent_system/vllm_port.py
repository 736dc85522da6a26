"""The port a vLLM server's engine listens on for its ``torch.distributed`` store, kept out of the ephemeral range.

vLLM picks that port by binding port 0, closing the socket and handing the number to the engine, which binds it a
moment later (``vllm.utils.network_utils.get_open_port``). Port 0 is served from the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), the same range every outgoing connection
(Ray's gRPC, HTTP clients, other servers' probes) takes its local port from. On a busy node one of them can take the
port in between, and the engine dies at start-up with "Engine core initialization failed" (its log:
``EADDRINUSE``). A clean-clone CI run lost an end-to-end test to exactly that.

vLLM scans upward from ``VLLM_PORT`` instead when it is set. :func:`choose_vllm_port` gives each server process its
own ``VLLM_PORT``: a block of :data:`BLOCK_PORTS` ports drawn at random from below the ephemeral range and above
Ray's worker ports (10002-19999 by default), where nothing binds port 0 or connects out. The draw uses the operating
system's randomness, so servers whose trainers seeded ``random`` alike still draw apart. A ``VLLM_PORT`` the user
set is kept (each server then scans from the same port, so servers that start at once can race each other).
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import MutableMapping
from pathlib import Path

logger = logging.getLogger(__name__)

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
FIRST_PORT = 20000  # above Ray's default worker ports (10002-19999)
LAST_PORT = 65535
BLOCK_PORTS = 16  # a server takes one or two ports from its VLLM_PORT upward
MIN_POOL_PORTS = 1024  # fewer free ports than this and two servers would too often draw the same block


def port_pool(ephemeral: tuple[int, int]) -> range | None:
    """The ports a server's block is drawn from: the larger stretch outside ``ephemeral`` above :data:`FIRST_PORT`.

    Args:
        ephemeral: the kernel's ephemeral range, first and last port.

    Returns:
        The pool, or None when neither stretch holds :data:`MIN_POOL_PORTS` ports.
    """
    low, high = ephemeral
    below = range(FIRST_PORT, max(FIRST_PORT, low))
    above = range(max(FIRST_PORT, high + 1), LAST_PORT + 1)
    pool = max(below, above, key=len)
    return pool if len(pool) >= MIN_POOL_PORTS else None


def read_ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's ephemeral port range, or None where the file is missing or unreadable (not Linux)."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def choose_vllm_port(env: MutableMapping[str, str] = os.environ, ephemeral: tuple[int, int] | None = None) -> None:
    """Set ``VLLM_PORT`` in ``env`` to a random block's first port outside the ephemeral range, unless it is set.

    Args:
        env: the environment to set it in (this process's by default).
        ephemeral: the ephemeral range; read from the kernel when None.
    """
    if "VLLM_PORT" in env:
        return
    ephemeral = ephemeral or read_ephemeral_range()
    pool = port_pool(ephemeral) if ephemeral else None
    if pool is None:
        logger.warning(
            "MLMT-RL: no room outside the ephemeral port range %s for vLLM's engine port; vLLM picks it from that "
            "range, where a busy node can take it before the engine binds it (set VLLM_PORT per server to avoid it)",
            ephemeral,
        )
        return
    block = secrets.randbelow(len(pool) // BLOCK_PORTS)
    env["VLLM_PORT"] = str(pool.start + block * BLOCK_PORTS)
    logger.debug("MLMT-RL: vLLM's engine ports start at %s", env["VLLM_PORT"])
