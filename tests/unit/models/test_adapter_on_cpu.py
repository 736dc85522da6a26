"""PEFT adapter folders (agent_system/models/adapter.py): the merged model computes what PEFT's adapter-on-base
computes, is written once and reused, and an adapter of another model is refused by name. And the evaluator
(agent_system/eval/math500.py) runs an adapter folder as its base with the adapter merged in, recording the base.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from shared_data import shared_data

from agent_system.models.adapter import AdapterError, is_adapter_folder, merged_model_folder, recorded_base
from agent_system.models.tiny import build_tiny_model


def _adapter(
    base: str,
    out: Path,
    seed: int,
    record_base: bool = True,
    targets: tuple[str, ...] = ("q_proj", "v_proj", "up_proj"),
) -> str:
    """A LoRA adapter over ``base`` whose B matrices are random (a fresh PEFT adapter computes exactly the base)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
        LoraConfig(r=4, lora_alpha=8, target_modules=list(targets)),
    )
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name or "lora_embedding" in name:  # (an embedding's A starts at 0, its B random)
                weight.normal_(0, 0.5)
    model.save_pretrained(str(out))
    config_path = out / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = base if record_base else None
    config_path.write_text(json.dumps(config))
    return str(out)


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("base") / "model", seed=0)


def test_the_merged_folder_computes_the_adapter_on_its_base_and_is_reused(base, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = _adapter(base, tmp_path / "adapter", seed=1)
    assert is_adapter_folder(adapter) and not is_adapter_folder(base) and recorded_base(adapter) == base
    merged = merged_model_folder(adapter, base, tmp_path / "cache")

    ids = torch.tensor([[5, 17, 42, 99, 3, 250, 7]])
    base_model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with_adapter = _logits(PeftModel.from_pretrained(base_model, adapter), ids)
    merged_logits = _logits(AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32), ids)
    plain = _logits(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), ids)
    assert (with_adapter - plain).abs().max() > 0.1  # the adapter changes the model
    assert torch.allclose(merged_logits, with_adapter, atol=1e-4)
    assert (Path(merged) / "tokenizer.json").is_file()
    assert json.loads((Path(merged) / "merged_from.json").read_text())["base"] == str(Path(base).resolve())

    written = (Path(merged) / "model.safetensors").stat().st_mtime_ns
    assert merged_model_folder(adapter, base, tmp_path / "cache") == merged  # the same pair: reused, not rewritten
    assert (Path(merged) / "model.safetensors").stat().st_mtime_ns == written
    other = merged_model_folder(_adapter(base, tmp_path / "other", seed=2), base, tmp_path / "cache")
    assert other != merged  # another adapter: another folder


# verl wraps the model with PEFT's defaults, so PEFT warns when an adapter targets a tied layer (the case tested here)
# and when it saves the adapter of an embedding layer
@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
@pytest.mark.filterwarnings("ignore:Setting `save_embedding_layers`:UserWarning")
@pytest.mark.parametrize(
    ("targets", "untied"),
    [(("down_proj", "lm_head"), True), (("embed_tokens", "q_proj"), True), (("q_proj", "v_proj"), False)],
    ids=["lm_head", "embed_tokens", "no-embedding"],
)
def test_a_model_with_tied_embeddings_merges_to_what_the_adapter_computes(tmp_path, targets, untied):
    """SmolLM2 and the small Qwen2.5 models share the input embeddings' weight with the output layer. An adapter on one
    of the two, merged into the shared weight, changed both: before, the merged model's logits were far from the
    adapter's (the output layer changed the inputs too). The merged model is now saved untied, and only then."""
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    tied = build_tiny_model(tmp_path / "tied", seed=0, tie_word_embeddings=True)
    adapter = _adapter(tied, tmp_path / "adapter", seed=1, targets=targets)
    merged = merged_model_folder(adapter, tied, tmp_path / "cache")

    ids = torch.tensor([[5, 17, 42, 99, 3, 250, 7]])
    with_adapter = _logits(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tied), adapter), ids)
    plain = _logits(AutoModelForCausalLM.from_pretrained(tied), ids)
    assert (with_adapter - plain).abs().max() > 0.1
    merged_logits = _logits(AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32), ids)
    assert torch.allclose(merged_logits, with_adapter, atol=1e-4), (merged_logits - with_adapter).abs().max()
    assert AutoConfig.from_pretrained(merged).tie_word_embeddings is not untied  # untied only where it must be


def test_an_adapter_of_another_model_is_refused_by_name(base, tmp_path):
    adapter = _adapter(base, tmp_path / "adapter", seed=1)
    wider = build_tiny_model(tmp_path / "wider", seed=0, hidden_size=192)
    with pytest.raises(AdapterError, match="does not fit the base model .*wider"):
        merged_model_folder(adapter, wider, tmp_path / "cache")
    assert not any((tmp_path / "cache").iterdir())  # nothing half-written left


def _eval_args(tmp_path: Path, data: Path, out: str, ll: str, ll_base: str | None = None) -> argparse.Namespace:
    from agent_system.eval.math500 import add_run_options

    parser = argparse.ArgumentParser()
    add_run_options(parser)
    args = parser.parse_args(
        ["--data", str(data), "--limit", "2", "--engine", "hf", "--max-tokens", "12", "--max-prompt-tokens", "2048"]
    )
    args.__dict__.update(ll=ll, hl=None, self_correct=False, out=str(tmp_path / out), ll_base=ll_base, hl_base=None)
    return args


@pytest.fixture(scope="module")
def math500(tmp_path_factory) -> Path:
    from agent_system.data.preprocess import preprocess

    path = tmp_path_factory.mktemp("data") / "test.parquet"
    preprocess("math500", str(path), input_path=str(shared_data("math500", "test.jsonl")), limit=2)
    return path


@pytest.mark.external
def test_the_evaluator_runs_an_adapter_folder_as_its_merged_base(base, math500, tmp_path, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_system.eval.math500 import evaluate

    monkeypatch.setenv("MLMT_CACHE", str(tmp_path / "cache"))
    adapter = _adapter(base, tmp_path / "adapter", seed=1)
    by_hand = tmp_path / "merged_by_hand"  # PEFT's merge, done here, evaluated as an ordinary model folder
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    PeftModel.from_pretrained(model, adapter).merge_and_unload().save_pretrained(str(by_hand))
    AutoTokenizer.from_pretrained(base).save_pretrained(str(by_hand))

    evaluate(_eval_args(tmp_path, math500, "adapter", adapter))
    evaluate(_eval_args(tmp_path, math500, "by_hand", str(by_hand)))
    evaluate(_eval_args(tmp_path, math500, "base", base))
    turns = {
        run: [json.loads(line)["samples"][0]["turns"] for line in (tmp_path / run / "records.jsonl").open()]
        for run in ("adapter", "by_hand", "base")
    }
    assert turns["adapter"] == turns["by_hand"]  # greedy: the same answers token for token
    assert turns["adapter"] != turns["base"]
    config = json.loads((tmp_path / "adapter" / "config.json").read_text())
    assert config["ll"] == adapter and config["ll_base"] == base
    assert json.loads((tmp_path / "base" / "config.json").read_text())["ll_base"] is None


@pytest.mark.external
def test_adapter_arguments_that_cannot_act_are_refused_by_name(base, math500, tmp_path):
    from agent_system.eval.math500 import EvalSettingsError, evaluate

    baseless = _adapter(base, tmp_path / "baseless", seed=1, record_base=False)
    with pytest.raises(EvalSettingsError, match="names no base model: .* --ll-base PATH"):
        evaluate(_eval_args(tmp_path, math500, "a", baseless))
    with pytest.raises(EvalSettingsError, match="--ll-base .* is not a PEFT adapter folder"):
        evaluate(_eval_args(tmp_path, math500, "b", base, ll_base=base))
    with pytest.raises(FileNotFoundError, match="--ll-base=.*missing: no such folder"):
        evaluate(_eval_args(tmp_path, math500, "c", baseless, ll_base=str(tmp_path / "missing")))
    assert not any((tmp_path / name).exists() for name in ("a", "b", "c"))  # refused before --out is written


def test_training_given_an_adapter_folder_as_a_model_says_where_it_goes(base, tmp_path):
    from agent_system.models.resolve import ModelPathError, resolve_model_path

    adapter = _adapter(base, tmp_path / "adapter", seed=1)
    with pytest.raises(ModelPathError, match="a PEFT adapter folder, not a model: .*lora_adapter_path"):
        resolve_model_path(adapter, "actor_rollout_ref.model.path")
