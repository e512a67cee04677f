"""Write a tiny Llama, weights and word-level tokenizer generated from a seed, for a live engine run.

Runs in the engine's environment (``torch``, ``transformers``,
``tokenizers``): ``python -m schedconf.conformance.live.model FOLDER [--seed N]``.
Nothing is downloaded. The model is random (its text is noise) but it is a
real ``LlamaForCausalLM`` that vLLM loads and runs: hidden 256, 4 heads of
64 (vLLM's CPU attention kernels refuse a head size of 16), 2 layers, a
vocabulary of :data:`NUM_WORDS` words ``w0 w1 ...`` plus ``<unk> <s> </s>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

NUM_WORDS = 509
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
"""Token ids 0, 1, 2 (EOS is 2); word ``wK`` is token ``K + 3``."""
EOS_TOKEN_ID = 2


def get_word(token_id: int) -> str:
    """The word of a (non-special) token id."""
    return f"w{token_id - len(SPECIAL_TOKENS)}"


def write_model(folder: str, seed: int = 0) -> str:
    """Write config, weights, tokenizer and generation config into ``folder``; return it."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(folder, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i + len(SPECIAL_TOKENS) for i in range(NUM_WORDS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    fast.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=EOS_TOKEN_ID,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # a wider spread than the default init, so sampling is not uniform noise
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    model.save_pretrained(folder, safe_serialization=True)
    with open(os.path.join(folder, "schedconf-model.json"), "w", encoding="utf-8") as handle:
        json.dump({"seed": seed, "num_words": NUM_WORDS, "eos_token_id": EOS_TOKEN_ID}, handle)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m schedconf.conformance.live.model", description=__doc__.splitlines()[0]
    )
    parser.add_argument("folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_model(args.folder, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
