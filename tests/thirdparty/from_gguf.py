"""A GGUF model file, made into what each consumer of it in the tests needs, offline:

    OUTDIR/config.json, generation_config.json    the Hugging Face config (longctx's model.hf_config)
    OUTDIR/tokenizer.json, tokenizer_config.json  the Hugging Face tokenizer (longctx's model.tokenizer:
                                                  text prompts of exact lengths)
    OUTDIR/model.safetensors                      the weights, dequantized, in bfloat16 (vLLM serves them)

llama.cpp serves the GGUF itself; vLLM and longctx read the directory. transformers reads the GGUF (its
metadata, vocabulary and merges, and the tensors, dequantized with the `gguf` package) and writes the
directory. Run with the Python of the vLLM environment (it has transformers, torch and gguf):

    python tests/thirdparty/from_gguf.py MODEL.gguf OUTDIR

tests/realmodel.py calls it once per GGUF (its cache is keyed by the file's sha256).
"""
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
tok.save_pretrained(out)
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
# transformers marks a model read from a GGUF as quantized (QuantizationMethod.GGUF) and will not save it, though
# its tensors are dequantized already: the config is written without that mark, the tensors with safetensors
# (an embedding tied to the output layer once, as Hugging Face checkpoints hold it)
model.config.__dict__.pop("quantization_config", None)
model.config.save_pretrained(out)
model.generation_config.save_pretrained(out)
state = {k: v.contiguous() for k, v in model.state_dict().items()}
if model.config.tie_word_embeddings:
    state.pop("lm_head.weight", None)
save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
print(out)
