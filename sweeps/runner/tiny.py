"""Models with random weights and a WordLevel tokenizer, built in code (no hub).

Tiny and small Qwen2-style models of fixed shapes, and real-size catalog models (`run.weights=random`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

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


# --- Real-size catalog models with random weights (run.weights=random) -----------------------------------------
# Memory does not depend on weight values, so a GPU run needs no weights from the hub: the model is built from the
# catalog's config.json with transformers' own initialisation, saved (config.json + model.safetensors, in the
# checkpoint dtype the hub ships) and then loaded by path exactly as a TRL user's model is. The tokenizer is the
# WordLevel one above with the model's vocabulary size, so every id the model can emit decodes.
WEIGHTS = ("pretrained", "random")  # run.weights: the hub checkpoint, or a catalog config with random weights
RANDOM_DTYPE = "bfloat16"  # the catalog models' torch_dtype: what from_pretrained reads from a hub checkpoint
CACHE_ENV = "GRPO_VRAM_RANDOM_WEIGHTS_DIR"
_DROP_KEYS = ("transformers_version", "transformers.js_config", "quantization_config", "torch_dtype", "dtype")


def catalog_config(name: str) -> dict:
    """The catalog's config.json for `name` with this tokenizer's special ids (ValueError if not in the catalog)."""
    from estimator.model import catalog

    hf_id = catalog.catalog_id(name)
    if hf_id is None:
        raise ValueError(
            f"model {name!r}: run.weights=random builds models from estimator/catalog/*.json; "
            f"accepted names are {', '.join(catalog.catalog())}"
        )
    cfg = {k: v for k, v in catalog.load_config(catalog.catalog()[hf_id]).items() if k not in _DROP_KEYS}
    cfg.update(pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    return cfg


def random_cache_dir() -> Path:
    """Where random-weight checkpoints are kept between runs: $GRPO_VRAM_RANDOM_WEIGHTS_DIR or ~/.cache/grpo-vram."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "grpo-vram" / "random-weights"


def build_random_model(name: str, seed: int = 0, device: str = "cpu"):
    """The catalog model `name` with transformers' random initialisation, in RANDOM_DTYPE on `device`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = catalog_config(name)
    cfg.pop("architectures", None)
    conf = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(conf, dtype=getattr(torch, RANDOM_DTYPE))
    gc = model.generation_config
    gc.pad_token_id, gc.bos_token_id, gc.eos_token_id = PAD_ID, BOS_ID, EOS_ID
    return model


def save_random(name: str, seed: int = 0, device: str = "cpu", cache_dir: Path | None = None) -> Path:
    """Directory holding the random-weight checkpoint and tokenizer of `name` (built and saved once, then reused).

    Written to a temporary sibling and renamed, so a crash never leaves a half checkpoint that a later run loads;
    two jobs racing keep whichever rename lands first. On CUDA the model is initialised on the GPU (seconds for
    7B) and the allocator's cache is emptied afterwards so the run starts from the bare context.
    """
    import gc
    import shutil
    import tempfile

    from estimator.model import catalog

    root = Path(cache_dir) if cache_dir is not None else random_cache_dir()
    target = root / f"{catalog.catalog_id(name).replace('/', '--')}-seed{seed}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=root))
    try:
        model = build_random_model(name, seed, device)
        model.save_pretrained(str(tmp))
        # a transformers model holds reference cycles: `del` alone leaves its tensors to a later cyclic
        # collection, which on CUDA hands them to the allocator's cache after empty_cache ran, where they stay
        # reserved (and in nvidia-smi) through the run that built them
        del model
        gc.collect()
        if device == "cuda":
            import torch

            torch.cuda.empty_cache()
        build_tokenizer(catalog_config(name)["vocab_size"]).save_pretrained(str(tmp))
        try:
            os.rename(tmp, target)
        except OSError:  # another job saved it first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
