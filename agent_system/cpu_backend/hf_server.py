"""A Hugging Face ``generate()`` rollout server that speaks verl's token-in/token-out rollout-server protocol.

verl's agent loop and the MLMT episode call ``server.generate(prompt_ids=..., sampling_params=..., request_id=...)``
on a Ray actor and expect a ``TokenOutput`` (response token ids and their log-probs). This server answers those
calls on CPU (or any torch device) with ``transformers``' ``generate()``:

* **Batching.** Concurrent requests are queued; a single loop takes every waiting request with the same sampling
  settings (up to ``max_batch_size``), left-pads them into one batch and runs one ``generate()``. Requests that
  arrive while a batch runs are served by the next one.
* **Sampling is per request.** Each request draws its tokens from its own generator, seeded by its
  ``sampling_params["seed"]`` (as vLLM takes one; the trainer gives each request one under
  ``rollout.full_determinism``) or else by a draw from the server's generator (seeded by ``seed``). A seeded
  request's sample therefore does not depend on which requests shared its batch, so a run is reproducible although
  batches form as requests happen to arrive.
* **Log-probs** are ``log_softmax(logits / temperature)`` over the full vocabulary at the sampled token — the same
  quantity verl's actor computes in ``compute_log_prob`` — recorded by a logits processor that runs before top-k /
  top-p filtering (greedy decoding uses temperature 1).
* **Weights** arrive through :meth:`update_weights` (called by the rollout adapter inside each actor worker, which
  verl's ``CheckpointEngineManager`` drives); generation and weight updates never overlap.
* **Sleep** follows vLLM's sleep mode when ``rollout.free_cache_engine`` is set, at the level verl's vLLM server
  resolves (:meth:`_resolve_sleep_level`, which ``verl_compat.pin_sleep_level`` overrides as on vLLM's): at level 2
  :meth:`sleep` frees the weights (the parameters move to the ``meta`` device) and only the next
  :meth:`update_weights` wakes the server; at level 1 it keeps them and :meth:`wake_up` wakes it. A ``generate`` on a
  sleeping server is an error, so a trainer that forgets verl's wake-before-generate pattern fails loudly.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from agent_system.hf_server_options import HFServerOptions

logger = logging.getLogger(__name__)


def server_device(cuda_visible_devices: str) -> torch.device:
    """Where the server loads its model and generates: ``cuda:0`` of ``cuda_visible_devices`` (the GPU ids Ray gave
    the actor worker it serves, which :meth:`HFRolloutServer.__init__` makes its process's visible devices), the CPU
    when it is empty (a worker on the CPU backend)."""
    return torch.device("cuda", 0) if cuda_visible_devices else torch.device("cpu")


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    seed: int
    future: asyncio.Future = field(repr=False)


class _LogprobRecorder(LogitsProcessor):
    """Scales logits by 1/temperature and records log-probs of the tokens that get sampled.

    At step t the processor sees the token chosen at step t-1 as the last input id, so it gathers that token's
    log-prob from the distribution it kept from the previous step; :meth:`finish` gathers the last one.
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.previous: torch.Tensor | None = None  # (B, V) log-probs of the last step
        self.steps: list[torch.Tensor] = []  # each (B,)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.float() / self.temperature
        if self.previous is not None:
            self.steps.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self.previous = torch.log_softmax(scores, dim=-1)
        return scores

    def finish(self, sequences: torch.LongTensor) -> torch.Tensor:
        """Log-probs of all generated tokens, (B, T_gen)."""
        if self.previous is not None:
            self.steps.append(self.previous.gather(1, sequences[:, -1:]).squeeze(1))
        if not self.steps:
            return torch.zeros(sequences.shape[0], 0)
        return torch.stack(self.steps, dim=1)


class _RequestSampler(LogitsProcessor):
    """Draws each row's next token from that row's own generator (after temperature, top-k and top-p) and leaves
    only that token to ``generate()``'s greedy pick, so a row's sample does not depend on the other rows."""

    def __init__(self, generators: list[torch.Generator]) -> None:
        self.generators = generators

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs = torch.softmax(scores.float(), dim=-1)
        chosen = [torch.multinomial(row, 1, generator=g) for row, g in zip(probs, self.generators, strict=True)]
        return torch.full_like(scores, float("-inf")).scatter_(1, torch.stack(chosen), 0.0)


def _sampling_key(sampling_params: dict[str, Any]) -> tuple[float, float, int]:
    temperature = float(sampling_params.get("temperature", 1.0) or 0.0)
    top_p = float(sampling_params.get("top_p", 1.0) or 1.0)
    top_k = int(sampling_params.get("top_k", -1) or -1)
    return temperature, top_p, top_k


class HFRolloutServer:
    """Ray actor serving ``generate`` for one model replica (see module docstring)."""

    def __init__(
        self,
        model_path: str,
        dtype: str,
        eos_token_ids: list[int],
        pad_token_id: int,
        max_model_len: int,
        default_max_tokens: int,
        options: dict[str, Any] | None = None,
        seed: int = 0,
        free_weights_on_sleep: bool = False,
        cuda_visible_devices: str = "",
    ) -> None:
        if cuda_visible_devices:  # before the first CUDA call: Ray left the variable alone (RAY_EXPERIMENTAL_NOSET_...)
            os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
        self.device = server_device(cuda_visible_devices)
        self.dtype = _DTYPES.get(dtype, torch.float32)
        self.options = HFServerOptions.from_config(options, "engine_kwargs.hf")
        if self.options.num_threads > 0:
            torch.set_num_threads(self.options.num_threads)
        torch.manual_seed(seed)
        self._seeds = torch.Generator().manual_seed(seed)  # a request without a seed of its own gets one from here
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype, attn_implementation="sdpa")
        self.model.to(self.device)
        self.model.eval()
        self.eos_token_ids = eos_token_ids
        self.pad_token_id = pad_token_id
        self.max_model_len = max_model_len
        self.default_max_tokens = default_max_tokens
        self.global_steps: int | None = None
        self.free_weights_on_sleep = free_weights_on_sleep
        self.asleep = False  # sleeping: generate refuses until a wake-up or a weight update
        self.weights_freed = False  # the parameters are on the meta device (a level-2 sleep)
        self._queues: dict[tuple, list[_Request]] = {}
        self._wakeup: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._loop_task: asyncio.Task | None = None
        self.stats = {"batches": 0, "requests": 0, "generated_tokens": 0, "generate_seconds": 0.0, "sleeps": 0}
        logger.info("hf rollout server ready: %s (%s on %s), pid %d", model_path, dtype, self.device, os.getpid())

    # ---------------------------------------------------------------- protocol: generation
    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, **_unused: Any
    ) -> Any:
        """Generate one response; returns verl's ``TokenOutput`` (token ids, log-probs, stop reason)."""
        from agent_system.verl_compat import TokenOutput

        self._ensure_loop()
        if self.asleep:
            raise RuntimeError(
                f"request {request_id}: the hf rollout server is asleep (its weights "
                f"{'freed' if self.weights_freed else 'kept'}); load weights (CheckpointEngineManager.update_weights) "
                "or, when it kept them, wake it (wake_up_replicas) before generating"
            )
        prompt_ids = [int(t) for t in prompt_ids]
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"request {request_id}: prompt of {len(prompt_ids)} tokens leaves no room to generate within "
                f"max_model_len={self.max_model_len}"
            )
        max_tokens = int(sampling_params.get("max_tokens") or sampling_params.get("max_new_tokens") or 0)
        max_tokens = max(1, min(max_tokens or self.default_max_tokens, room))
        seed = sampling_params.get("seed")
        if seed is None:
            seed = int(torch.randint(2**62, (1,), generator=self._seeds))
        future = asyncio.get_running_loop().create_future()
        request = _Request(prompt_ids, max_tokens, int(seed), future)
        self._queues.setdefault(_sampling_key(sampling_params), []).append(request)
        self._wakeup.set()
        token_ids, log_probs, finish_reason = await future
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps, "finish_reason": finish_reason},
        )

    def _ensure_loop(self) -> None:
        if self._loop_task is None:
            self._wakeup = asyncio.Event()
            self._lock = asyncio.Lock()
            self._loop_task = asyncio.get_running_loop().create_task(self._batch_loop())

    async def _batch_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            await asyncio.sleep(self.options.batch_wait_ms / 1000.0)  # let concurrent callers join the batch
            key = next((k for k, q in self._queues.items() if q), None)
            if key is None:
                self._wakeup.clear()
                continue
            queue = self._queues[key]
            batch, self._queues[key] = queue[: self.options.max_batch_size], queue[self.options.max_batch_size :]
            async with self._lock:
                try:
                    results = await asyncio.to_thread(self._generate_batch, batch, *key)
                except Exception as exc:  # noqa: BLE001 - the error belongs to the callers, not to the loop
                    logger.exception("hf rollout server: batch of %d failed", len(batch))
                    for request in batch:
                        if not request.future.done():
                            request.future.set_exception(exc)
                    continue
            for request, result in zip(batch, results, strict=True):
                if not request.future.done():
                    request.future.set_result(result)

    @torch.no_grad()
    def _generate_batch(
        self, batch: list[_Request], temperature: float, top_p: float, top_k: int
    ) -> list[tuple[list[int], list[float], str]]:
        start = time.perf_counter()
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, request in enumerate(batch):  # left padding
            input_ids[i, width - len(request.prompt_ids) :] = torch.tensor(request.prompt_ids)
            attention_mask[i, width - len(request.prompt_ids) :] = 1
        sampling = temperature > 0
        recorder = _LogprobRecorder(temperature if sampling else 1.0)
        processors = LogitsProcessorList([recorder])
        if sampling:
            if top_k > 0:
                processors.append(TopKLogitsWarper(top_k=top_k))
            if top_p < 1.0:
                processors.append(TopPLogitsWarper(top_p=top_p))
            generators = [torch.Generator(self.device).manual_seed(r.seed) for r in batch]
            processors.append(_RequestSampler(generators))
        generation_config = GenerationConfig(  # greedy: a sampled row's processors leave it one token to pick
            max_new_tokens=max(r.max_tokens for r in batch),
            do_sample=False,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
        )
        output = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            generation_config=generation_config,
            logits_processor=processors,
        )
        generated = output.sequences[:, width:].cpu()  # (B, T_gen)
        log_probs = recorder.finish(output.sequences).cpu()  # (B, T_gen)
        results = []
        eos = set(self.eos_token_ids)
        for i, request in enumerate(batch):
            tokens = generated[i].tolist()
            end = next((j + 1 for j, t in enumerate(tokens) if t in eos), None)
            finish_reason = "stop" if end is not None and end <= request.max_tokens else "length"
            end = min(end or len(tokens), request.max_tokens)
            results.append((tokens[:end], log_probs[i, :end].tolist(), finish_reason))
        self.stats["batches"] += 1
        self.stats["requests"] += len(batch)
        self.stats["generated_tokens"] += sum(len(r[0]) for r in results)
        self.stats["generate_seconds"] += time.perf_counter() - start
        return results

    # ---------------------------------------------------------------- protocol: weights and lifecycle
    async def update_weights(self, state_dict: dict[str, torch.Tensor], global_steps: int | None = None) -> None:
        """Load a full (HF-named) state dict into the served model; waits for the running batch to finish."""
        self._ensure_loop()
        async with self._lock:
            if self.weights_freed:  # assigned as they come: put them where and as the server generates
                state_dict = {
                    name: tensor.to(self.device, self.dtype if tensor.is_floating_point() else tensor.dtype)
                    for name, tensor in state_dict.items()
                }
            missing, unexpected = self.model.load_state_dict(state_dict, strict=False, assign=self.weights_freed)
            if self.weights_freed:
                self.model.tie_weights()
                self.weights_freed = False
            self.asleep = False
            tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
            if unexpected or set(missing) - tied:
                raise RuntimeError(
                    f"hf rollout server: weight update does not match the model: missing={sorted(set(missing) - tied)}"
                    f", unexpected={sorted(unexpected)}"
                )
            self.global_steps = global_steps

    def get_stats(self) -> dict[str, float]:
        return dict(self.stats)

    async def wake_up(self) -> None:
        """End a sleep that kept the weights; after one that freed them only :meth:`update_weights` wakes the server."""
        if not self.weights_freed:
            self.asleep = False

    def _resolve_sleep_level(self) -> int:
        """The level :meth:`sleep` sleeps at, as verl's vLLM server names it: 2, the weights freed."""
        return 2

    async def sleep(self) -> None:
        """With ``free_weights_on_sleep``: sleep; at level 2 (:meth:`_resolve_sleep_level`) free the weights until the
        next :meth:`update_weights`, at level 1 keep them for :meth:`wake_up`."""
        if not self.free_weights_on_sleep or self.asleep:
            return
        self._ensure_loop()
        async with self._lock:
            if self._resolve_sleep_level() == 2:
                for module in self.model.modules():  # parameters only: buffers (rotary tables) are not in a state dict
                    for name, param in list(module.named_parameters(recurse=False)):
                        module.register_parameter(name, torch.nn.Parameter(param.to("meta"), requires_grad=False))
                self.weights_freed = True
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()  # give the freed weights back to the device, for the actor's turn
            self.asleep = True
            self.stats["sleeps"] += 1

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        return None

    async def resume_generation(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def start_profile(self, **_kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None
