"""llamacpp_convert.py — llama.cpp's own convert_hf_to_gguf.py, with two shims, for the bench
scripts that compare pollen with llama.cpp (cpu-vs-llamacpp.sh, quality.sh).

    PYTHONPATH=LLAMA_CPP_SRC:LLAMA_CPP_SRC/gguf-py python llamacpp_convert.py HF_DIR --outtype f16 --outfile OUT.gguf

The shims: torch 1.13 (Debian's python3-torch) lacks the float8 dtypes the converter's tables
name, so they are stubbed; and a synthetic tokenizer's fingerprint is in none of the converter's
lists, so it is declared BLOOM's pre-tokenizer (both tools are fed token ids in the benchmarks, so
nothing timed depends on it). For a Llama-family model the converter first looks for
tokenizer.model and a byte-fallback tokenizer.json; `pollen synth` writes a byte-level BPE one, so
it reaches the same fingerprint.
"""
import runpy
import sys

import torch

for name in ("float8_e4m3fn", "float8_e5m2"):
    if not hasattr(torch, name):
        setattr(torch, name, torch.uint8)

import conversion.base as base  # noqa: E402  (after the shim: the module reads torch's dtypes)

for cls in vars(base).values():
    if isinstance(cls, type) and "get_vocab_base_pre" in vars(cls):
        orig = cls.get_vocab_base_pre

        def pre(self, tokenizer, _orig=orig):
            try:
                return _orig(self, tokenizer)
            except NotImplementedError:
                return "bloom"

        cls.get_vocab_base_pre = pre

sys.argv[0] = sys.modules["conversion"].__file__.rsplit("/conversion/", 1)[0] + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
