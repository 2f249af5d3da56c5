"""sglang_tiny.py [OUT=/tmp/tiny]: a tiny random-weight Llama for SGLang on the GPU machine, with no download.

4 layers, hidden 512, 8 heads, 32,768 positions, bf16 safetensors, and a word-level tokenizer over a made-up
vocabulary of 8,000 entries (special tokens, single bytes' characters, then syllable words), with a small chat
template. Built from the image's torch, transformers and tokenizers in a few seconds. Its text is nonsense; the
load it puts on the engine is real (a request without max_tokens runs to the context length).
"""

from __future__ import annotations

import itertools
import json
import os
import sys


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny"
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
    vocab: dict[str, int] = {}
    for w in specials + [chr(c) for c in range(33, 127)]:
        vocab.setdefault(w, len(vocab))
    letters = "abcdefghijklmnopqrstuvwxyz"
    for n in (2, 3):
        for t in itertools.product(letters, repeat=n):
            if len(vocab) >= 8000:
                break
            vocab.setdefault("".join(t), len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials)  # matched whole, before the pre-tokenizer splits "<|user|>"
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                 pad_token="<pad>")
    hf.chat_template = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> "
                        "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}")
    hf.model_max_length = 32768
    hf.save_pretrained(out)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=32768,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=hf.bos_token_id,
                      eos_token_id=hf.eos_token_id, pad_token_id=hf.pad_token_id, torch_dtype="bfloat16")
    torch.manual_seed(42)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    print(json.dumps({"out": out, "vocab": len(vocab), "files": sorted(os.listdir(out))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
