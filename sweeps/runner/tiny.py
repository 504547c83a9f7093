"""Tiny and small Qwen2-style models with random weights and a WordLevel tokenizer, built in code (no hub)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(4)
DIGITS = tuple(str(i) for i in range(10))
WORDS = (
    "the a an of to and in is was for on with how many much what does did if each has have had he she they it "
    "more less than total left after before then + - * / = $ . , ? ! #### answer"
).split()


@dataclass(frozen=True)
class TinySpec:
    """Shape of one in-code Qwen2 model (vocab = WordLevel tokenizer size)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    tie_word_embeddings: bool = False


TINY_MODELS: dict[str, TinySpec] = {
    "tiny-2M": TinySpec(2048, 128, 6, 4, 2, 512),
    "tiny-10M": TinySpec(4096, 256, 8, 8, 2, 1024),
    "small-50M": TinySpec(8192, 512, 12, 8, 2, 1792),
}


def is_tiny(name: str) -> bool:
    """True for the names of models built in code."""
    return name in TINY_MODELS


def vocabulary(size: int) -> list[str]:
    """Specials, digits, a few words, then filler words w0, w1, ... up to `size` entries."""
    base = list(SPECIALS) + list(DIGITS) + [w for w in WORDS if w not in DIGITS]
    if size < len(base):
        raise ValueError(f"vocab_size {size} is below the {len(base)} fixed tokens")
    return base + [f"w{i}" for i in range(size - len(base))]


def hf_config(name: str) -> dict:
    """The config.json dict of a tiny model (Qwen2ForCausalLM), as save_pretrained would write it."""
    s = TINY_MODELS[name]
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": s.vocab_size,
        "hidden_size": s.hidden_size,
        "num_hidden_layers": s.num_hidden_layers,
        "num_attention_heads": s.num_attention_heads,
        "num_key_value_heads": s.num_key_value_heads,
        "intermediate_size": s.intermediate_size,
        "tie_word_embeddings": s.tie_word_embeddings,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }


def spec_dict(name: str) -> dict:
    """The shape of a tiny model as a plain dict (goes into the run variant so a reshaped model is a new key)."""
    return asdict(TINY_MODELS[name])


def build_tokenizer(vocab_size: int):
    """A WordLevel PreTrainedTokenizerFast: whitespace split, space-joined decode, left padding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(vocabulary(vocab_size))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="</s>",
        bos_token="<s>",
        unk_token="<unk>",
        padding_side="left",
    )
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
        "{% if add_generation_prompt %}assistant : {% endif %}"
    )
    return tok


def build_model(name: str, seed: int = 0):
    """A randomly initialised Qwen2ForCausalLM of the named shape (float32)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = hf_config(name)
    cfg.pop("architectures")
    cfg.pop("model_type")
    model = Qwen2ForCausalLM(Qwen2Config(**cfg))
    gc = model.generation_config
    gc.pad_token_id, gc.bos_token_id, gc.eos_token_id = PAD_ID, BOS_ID, EOS_ID
    return model


def save_tiny(name: str, directory: str, seed: int = 0) -> str:
    """save_pretrained the tiny model and its tokenizer into `directory`; returns the directory."""
    build_model(name, seed).save_pretrained(directory)
    build_tokenizer(TINY_MODELS[name].vocab_size).save_pretrained(directory)
    return directory
