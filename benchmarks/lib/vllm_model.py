"""Build the tiny model that a real vLLM serves in fairq's benchmarks.

Run only with the python of vLLM's own venv (``benchmarks.vllm_engine`` does): it needs
torch, transformers and tokenizers, which the project's venv does not have, so its
imports stay inside ``main`` and nothing in the project imports this file.

    .vllm/venv/bin/python benchmarks/vllm_model.py --out .vllm/model

What it writes is deterministic for a given seed and Python standard library: a
byte-level BPE tokenizer (about 4,096 tokens) trained on the standard library's ``.py``
files, saved as a ``PreTrainedTokenizerFast`` with a chat template, and a random-weight
``LlamaForCausalLM`` (2 layers, hidden 128, 4 heads, 512 positions) in bf16
safetensors. Its text is gibberish by design: the benchmarks send ``"ignore_eos": true``
to get exactly ``max_tokens`` tokens. No model hub is needed.
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path
from typing import Any

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLES = ("<|system|>", "<|user|>", "<|assistant|>")
# Each message: its role marker, its text, the end-of-sequence token.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _training_files() -> list[str]:
    """The standard library's top-level modules, sorted: the same text on every run."""
    return sorted(str(p) for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def _tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS, *ROLES],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train(_training_files(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLES),
        chat_template=CHAT_TEMPLATE,
        model_max_length=512,
    )


def _model(tokenizer: Any, seed: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the model folder to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args()

    tokenizer = _tokenizer(args.vocab_size)
    model = _model(tokenizer, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(args.out)
    model.save_pretrained(args.out, safe_serialization=True)
    print(f"wrote {args.out}: vocab {len(tokenizer)}, {model.num_parameters():,} parameters")


if __name__ == "__main__":
    main()
