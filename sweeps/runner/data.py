"""Prompts for the sweeps: shipped GSM8K questions, or synthetic prompts of an exact token length."""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

GSM8K_DIR = Path(__file__).parent / "data" / "gsm8k"
_CANDIDATE_WORDS = (" the", " a", " 1", " x", " w0", " and")


def gsm8k(split: str = "train", n: int | None = None) -> list[dict]:
    """GSM8K rows as {"prompt", "answer"} (answer = the number after '####'), first `n` of the split."""
    rows = []
    with gzip.open(GSM8K_DIR / f"{split}.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            item = json.loads(line)
            answer = item["answer"].split("####")[-1].strip().replace(",", "")
            rows.append({"prompt": item["question"], "answer": answer})
            if n is not None and len(rows) >= n:
                break
    return rows


def repeat_word(tokenizer) -> str:
    """A word that the tokenizer encodes as one token each time it is repeated."""
    for word in _CANDIDATE_WORDS:
        ids = tokenizer(word * 8, add_special_tokens=False)["input_ids"]
        if len(ids) == 8 and len(set(ids)) == 1:
            return word
    raise ValueError("no single-token repeatable word found for this tokenizer")


def synthetic(tokenizer, length: int, n: int, seed: int = 0) -> list[dict]:
    """`n` prompts of exactly `length` tokens (a word-level vocab gets random words; others a repeated word)."""
    vocab = tokenizer.get_vocab()
    words = sorted(w for w in vocab if re.fullmatch(r"w\d+|\d", w))
    rng = random.Random(seed)
    out = []
    if words:
        for _ in range(n):
            out.append({"prompt": " ".join(rng.choice(words) for _ in range(length)), "answer": ""})
    else:
        word = repeat_word(tokenizer)
        out = [{"prompt": (word * length).strip(), "answer": ""} for _ in range(n)]
    for row in out[:1]:
        got = len(tokenizer(row["prompt"], add_special_tokens=False)["input_ids"])
        if got != length:
            raise ValueError(f"synthetic prompt has {got} tokens, wanted {length}")
    return out


def prompt_rows(kind: str, tokenizer, length: int, n: int, seed: int = 0) -> list[dict]:
    """Prompt rows of the given kind: 'gsm8k' or 'synthetic'."""
    if kind == "gsm8k":
        return gsm8k("train", n)
    if kind == "synthetic":
        return synthetic(tokenizer, length, n, seed)
    raise ValueError(f"prompts={kind!r}: accepted values are 'gsm8k', 'synthetic'")
