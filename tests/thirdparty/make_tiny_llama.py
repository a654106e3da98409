"""Write a tiny random-weight Llama (GQA: 4 attention heads, 2 KV heads) with a word-level tokenizer
to a directory, offline.

Run with the Python of the vLLM environment (it has transformers and tokenizers):
    python tests/thirdparty/make_tiny_llama.py OUTDIR
"""
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(1021)}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
fast.save_pretrained(out)
# Grouped-query attention: 4 query heads share 2 KV heads of 64 dims (vLLM's CPU attention wants head_dim >= 64);
# KV cache per token: K and V x 2 KV heads x 64 dims x 2 layers x 2 bytes (bf16) = 1,024 bytes.
cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                  bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
torch.manual_seed(0)
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
print(out)
