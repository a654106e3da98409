"""Write a Hugging Face tokenizer whose tokens are single ASCII characters, offline.

The reference engine's tokenizer is byte-level: one byte, one token. Third-party benchmark clients
(vLLM's `vllm bench serve`, GuideLLM) need a Hugging Face tokenizer to make prompts of a given
length; with this one, a prompt they make of N tokens is N ASCII bytes, so N tokens for the
engine too. Run with a Python that has `tokenizers` and `transformers` (the vLLM environment):

    python bench/char_tokenizer.py OUTDIR
"""
import string
import sys
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
chars = [c for c in string.printable if c not in "\r\x0b\x0c"]  # letters, digits, punctuation, space, \t, \n
vocab = {"<s>": 0, "</s>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
# an unknown character (non-ASCII text) becomes "?", still one byte
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
tok.decoder = decoders.Fuse()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="?",
                               model_max_length=1_000_000_000, clean_up_tokenization_spaces=False)
fast.save_pretrained(out)
text = "Hello, world!\n\n\t x"
assert fast.decode(fast.encode(text, add_special_tokens=False)) == text and len(fast.encode(text, add_special_tokens=False)) == len(text)
print(out)
