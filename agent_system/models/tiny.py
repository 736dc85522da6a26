"""Tiny Qwen2 models and a byte-level BPE chat tokenizer, built offline in seconds (tests, CPU smoke runs).

    python -m agent_system.models.tiny --out /tmp/tiny-qwen2 [--seed 0]

The tokenizer is trained on a small built-in corpus (arithmetic, chat words, LaTeX, Python) and uses ChatML
(``<|im_start|>`` / ``<|im_end|>``), with ``<|im_end|>`` as eos and a separate pad token, or, with
``pad_token=False``, no pad token anywhere (tokenizer, model config, generation config), as Llama-3.x ships.
Attention heads have head_dim 64, the smallest size vLLM's CPU attention supports.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
from pathlib import Path

logger = logging.getLogger(__name__)

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    words = (
        "problem solve step by step answer final boxed feedback attempt mistake hint check the a is of and to "
        "what how many apples has buys more total sum product difference correct wrong tutor student please "
        "refine corrected solution because therefore so we get compute add subtract multiply divide equals "
        "def return for in range if else print assert import lambda x y z n"
    ).split()
    lines = []
    for _ in range(3000):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        op = rng.choice(["+", "-", "*"])
        lines.append(f"What is {a} {op} {b}? The answer is \\boxed{{{eval(f'{a}{op}{b}')}}}.")
        lines.append(" ".join(rng.choice(words) for _ in range(12)))
    lines += ["\\frac{1}{2} \\sqrt{3} x^{2} \\pi \\left( \\right) \\dfrac \\text{cm} 10\\%", "def f(x):\n    return x"]
    return lines


def build_tiny_tokenizer(out_dir: str | os.PathLike, vocab_size: int = 512, seed: int = 0, pad_token: bool = True):
    """Train and save a byte-level BPE chat tokenizer; returns the ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>" if pad_token else None,
        unk_token=None,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.padding_side = "left"
    wrapped.save_pretrained(out_dir)
    return wrapped


def build_tiny_model(
    out_dir: str | os.PathLike,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 2,
    vocab_size: int = 512,
    pad_token: bool = True,
    tie_word_embeddings: bool = False,
) -> str:
    """Build a random tiny Qwen2 causal LM with its tokenizer in ``out_dir`` (idempotent); returns the path.

    ``hidden_size`` / 64 attention heads (head_dim 64); ``pad_token=False`` leaves the pad token unset everywhere;
    ``tie_word_embeddings=True`` shares the input embeddings' weight with the output layer (as SmolLM2 and the small
    Qwen2.5 models do).
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return str(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(out, vocab_size=vocab_size, seed=seed, pad_token=pad_token)
    heads = max(hidden_size // 64, 1)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=2048,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out)
    logger.info("built tiny Qwen2 (%d params) in %s", sum(p.numel() for p in model.parameters()), out)
    return str(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output folder (Hugging Face format)")
    parser.add_argument("--seed", type=int, default=0, help="weight and tokenizer-corpus seed")
    parser.add_argument("--vocab-size", type=int, default=512, help="BPE vocabulary size")
    parser.add_argument("--no-pad-token", action="store_true", help="no pad token anywhere (Llama-3.x style)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    build_tiny_model(args.out, seed=args.seed, vocab_size=args.vocab_size, pad_token=not args.no_pad_token)


if __name__ == "__main__":
    main()
