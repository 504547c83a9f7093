"""A decoder-only model's shapes, read from its `config.json`, and its exact parameter count.

Parameter counts follow the module layout transformers 5.x builds for each `model_type` (checked in
`tests/ground_truth/test_architecture.py` against transformers instantiating the same config on the meta device).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from estimator.model.families import MODEL_TYPES, Family, UnknownFamily
from estimator.model.families import family as family_record
from estimator.model.quantized import QuantizationError, check_quantization
from estimator.text import printable, shown


class ConfigError(ValueError):
    """A config.json that does not describe a decoder this estimator can size."""


@dataclass(frozen=True)
class Linear:
    """One linear projection inside a decoder layer: `count` copies of [out, in] (+ bias)."""

    name: str
    in_features: int
    out_features: int
    bias: bool = False
    count: int = 1  # > 1 for MoE experts stored as one 3D parameter
    is_nn_linear: bool = True  # False for fused 3D expert weights (LoRA's all-linear skips them)

    @property
    def params(self) -> int:
        """count × (in × out + out·bias)."""
        return self.count * (self.in_features * self.out_features + (self.out_features if self.bias else 0))


@dataclass(frozen=True)
class Arch:
    """Shapes of a decoder-only transformer, enough to size every memory term."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    layer_linears: tuple[Linear, ...]  # the linear projections of ONE decoder layer
    layer_norm_params: int  # norm weights of one layer (incl. q/k norms)
    final_norm_params: int
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    # ---- parameter counts ----
    @property
    def embedding_params(self) -> int:
        """vocab × hidden."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """vocab × hidden when untied, 0 when tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def layer_params(self) -> int:
        """Σ linears + norms of one decoder layer."""
        return sum(lin.params for lin in self.layer_linears) + self.layer_norm_params

    @property
    def total_params(self) -> int:
        """embedding + layers × layer + final norm + untied lm_head."""
        return (
            self.embedding_params
            + self.num_layers * self.layer_params
            + self.final_norm_params
            + self.lm_head_params
        )

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def family(self) -> Family:
        """The family record of this model_type (estimator/model/families.py)."""
        return family_record(self.model_type)


# Sane upper bounds for the sizes that enter a formula (generous: the largest open models are far below them).
LIMITS = {
    "hidden_size": 2**18,
    "num_hidden_layers": 10_000,
    "num_attention_heads": 2**14,
    "num_key_value_heads": 2**14,
    "head_dim": 2**14,
    "intermediate_size": 2**20,
    "moe_intermediate_size": 2**20,
    "shared_expert_intermediate_size": 2**20,
    "vocab_size": 2**24,
    "num_experts": 2**14,
    "num_local_experts": 2**14,
    "n_routed_experts": 2**14,
    "num_experts_per_tok": 2**14,
    "max_position_embeddings": 2**31,
    "sliding_window": 2
    ** 31,  # a window past any context length is full attention; beyond 2**31 is not a length
    "sliding_window_pattern": 10_000,  # every n-th layer full (Gemma-3); at most num_hidden_layers' limit
}
BOOL_FIELDS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "qkv_bias")
# The attention kinds a decoder layer of MODEL_TYPES takes in `layer_types` (transformers'
# ALLOWED_ATTN_LAYER_TYPES holds more, for architectures this estimator does not model).
LAYER_TYPES = ("full_attention", "sliding_attention")


def _size(cfg: dict, *keys: str, default=None, minimum: int = 1) -> int:
    """The first of `keys` present, as a positive integer within LIMITS; a float, bool, string, NaN, infinity,
    zero, negative or absurd value is a ConfigError naming the field (never truncated or guessed)."""
    key = next((k for k in keys if cfg.get(k) is not None), None)
    if key is None:
        if default is None:
            raise ConfigError(f"config has no {keys[0]!r}; need hidden_size, num_hidden_layers, ...")
        return default
    v = cfg[key]
    limit = LIMITS.get(key, 2**31)
    if not isinstance(v, int) or isinstance(v, bool) or not minimum <= v <= limit:
        raise ConfigError(
            f"config {key} = {shown(v)}: accepted values are integers from {minimum} to {limit}"
        )
    return v


def _flag(cfg: dict, key: str, default: bool) -> bool:
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ConfigError(f"config {key} = {shown(v)}: accepted values are true or false")
    return v


def _check_windows(cfg: dict, n_layers: int) -> None:
    """The fields `layer_windows` reads, as transformers accepts them: `sliding_window` null or a positive
    integer, `use_sliding_window` a bool, `sliding_window_pattern` null or a positive integer (Gemma-3's
    `(i + 1) % pattern`), `layer_types` null or a list of num_hidden_layers LAYER_TYPES entries
    (`PreTrainedConfig.validate_layer_type`); anything else is a ConfigError naming the field."""
    for key in ("sliding_window", "sliding_window_pattern"):
        if cfg.get(key) is not None:
            _size(cfg, key)
    _flag(cfg, "use_sliding_window", False)
    types = cfg.get("layer_types")
    if types is None:
        return
    accepted = (
        f"accepted: null or a list of {n_layers} (num_hidden_layers) of {', '.join(map(repr, LAYER_TYPES))}"
    )
    if not isinstance(types, list):
        raise ConfigError(f"config layer_types = {shown(types)}: {accepted}")
    bad = next((t for t in types if not isinstance(t, str) or t not in LAYER_TYPES), None)
    if bad is not None:
        raise ConfigError(f"config layer_types entry {shown(bad)}: {accepted}")
    if len(types) != n_layers:
        raise ConfigError(f"config layer_types has {len(types)} entries: {accepted}")


def check_model_type(cfg: dict) -> str:
    """The config's model_type when this estimator models it, else a ConfigError naming the ones it does."""
    model_type = cfg.get("model_type")
    try:
        return family_record(model_type).model_type
    except UnknownFamily:
        pass
    what = f"model_type {model_type!r}" if model_type else "a config without model_type"
    raise ConfigError(
        f"{what} is not a decoder-only architecture this estimator models; supported: {', '.join(MODEL_TYPES)}"
    )


def _attention_linears(
    fam: Family, h: int, q_dim: int, kv_dim: int, bias: bool, o_bias: bool
) -> list[Linear]:
    """q/k/v (or Phi-3's fused qkv) and o_proj of one decoder layer."""
    if fam.fused_qkv:
        qkv = [Linear("qkv_proj", h, q_dim + 2 * kv_dim, bias)]
    else:
        qkv = [
            Linear("q_proj", h, q_dim, bias),
            Linear("k_proj", h, kv_dim, bias),
            Linear("v_proj", h, kv_dim, bias),
        ]
    return qkv + [Linear("o_proj", q_dim, h, o_bias)]


def _mlp_linears(
    cfg: dict, fam: Family, h: int, inter: int, bias: bool
) -> tuple[list[Linear], int, int, int]:
    """The MLP of one decoder layer (gated, Phi-3's fused gate_up, or a MoE block with its router and shared
    expert) -> (linears, experts, experts per token, expert intermediate size)."""
    n_experts = _size(cfg, "num_experts", "num_local_experts", "n_routed_experts", default=0, minimum=0)
    top_k = _size(cfg, "num_experts_per_tok", default=0, minimum=0)
    if n_experts and not 1 <= top_k <= n_experts:
        raise ConfigError(
            f"config num_experts_per_tok = {top_k}: accepted values are 1 to num_experts ({n_experts})"
        )
    moe_inter = _size(cfg, "moe_intermediate_size", default=inter)
    if not n_experts:
        if fam.fused_gate_up:
            return (
                [Linear("gate_up_proj", h, 2 * inter, bias), Linear("down_proj", inter, h, bias)],
                0,
                top_k,
                0,
            )
        gated = [Linear("gate_proj", h, inter, bias), Linear("up_proj", h, inter, bias)]
        return gated + [Linear("down_proj", inter, h, bias)], 0, top_k, 0
    # transformers 5.x stores experts as fused 3D parameters (e.g. Qwen3MoeExperts): not nn.Linear.
    linears = [
        Linear("router", h, n_experts, False, is_nn_linear=False),
        Linear("experts.gate_up_proj", h, 2 * moe_inter, False, count=n_experts, is_nn_linear=False),
        Linear("experts.down_proj", moe_inter, h, False, count=n_experts, is_nn_linear=False),
    ]
    shared = _size(cfg, "shared_expert_intermediate_size", default=0, minimum=0)
    if shared:
        linears += [
            Linear("shared_expert.gate_proj", h, shared, False),
            Linear("shared_expert.up_proj", h, shared, False),
            Linear("shared_expert.down_proj", shared, h, False),
            Linear("shared_expert_gate", h, 1, False),
        ]
    return linears, n_experts, top_k, moe_inter


def _layer_norm_params(fam: Family, h: int, head_dim: int, q_dim: int, kv_dim: int) -> int:
    """Norm weights of one decoder layer: the family's H-sized norms (input + post-attention, Gemma's pre/post
    feed-forward, OLMo-2's post-attention + post-feedforward) and q/k norms over head_dim or over all heads."""
    norms = fam.layer_norms * h
    if fam.qk_norm and fam.qk_norm_scope == "full":
        norms += q_dim + kv_dim  # OLMo-2: q_norm over q_dim, k_norm over kv_dim
    elif fam.qk_norm:
        norms += 2 * head_dim  # q_norm, k_norm over head_dim
    return norms


def from_config(cfg: dict, name: str | None = None) -> Arch:
    """Build an Arch from a Hugging Face config.json dict (dense and MoE decoders of MODEL_TYPES)."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"config is a JSON {type(cfg).__name__}, not an object")
    text = cfg.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ConfigError("config text_config is not an object")
    cfg = dict(text or {}) | {k: v for k, v in cfg.items() if k != "text_config"}
    model_type = check_model_type(cfg)
    fam = family_record(model_type)
    try:
        check_quantization(cfg)
    except QuantizationError as e:
        raise ConfigError(str(e)) from None
    h = _size(cfg, "hidden_size")
    n_layers = _size(cfg, "num_hidden_layers")
    n_heads = _size(cfg, "num_attention_heads")
    vocab = _size(cfg, "vocab_size")
    n_kv = _size(cfg, "num_key_value_heads", default=n_heads)
    if n_heads % n_kv:
        raise ConfigError(
            f"config num_attention_heads = {n_heads} is not a multiple of num_key_value_heads = {n_kv}"
        )
    if cfg.get("head_dim") is None and h % n_heads:
        raise ConfigError(
            f"config hidden_size = {h} is not a multiple of num_attention_heads = {n_heads} (and no head_dim)"
        )
    head_dim = _size(cfg, "head_dim", default=h // n_heads)
    inter = _size(cfg, "intermediate_size", default=4 * h)
    if cfg.get("max_position_embeddings") is not None:
        _size(cfg, "max_position_embeddings")
    _check_windows(cfg, n_layers)
    tie = _flag(cfg, "tie_word_embeddings", fam.tie_word_embeddings_default)
    attn_bias = _flag(cfg, fam.attention_bias_key, fam.attention_bias_default)
    q_dim, kv_dim = n_heads * head_dim, n_kv * head_dim
    attention = _attention_linears(fam, h, q_dim, kv_dim, attn_bias, attn_bias and fam.o_proj_bias_follows)
    mlp, n_experts, top_k, moe_inter = _mlp_linears(cfg, fam, h, inter, _flag(cfg, "mlp_bias", False))
    return Arch(
        name=printable(str(name or cfg.get("_name_or_path") or model_type or "custom")),
        model_type=model_type,
        hidden_size=h,
        num_layers=n_layers,
        num_heads=n_heads,
        num_kv_heads=n_kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=tie,
        layer_linears=tuple(attention + mlp),
        layer_norm_params=_layer_norm_params(fam, h, head_dim, q_dim, kv_dim),
        final_norm_params=h,
        num_experts=n_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=moe_inter,
        extra={"config": cfg},
    )


def layer_windows(arch: Arch) -> list[int | None]:
    """Per decoder layer, the sliding window its cache keeps (None = full attention), as transformers 5.23 decides.

    `cache_utils.get_layer_types_and_kwargs`: `config.layer_types` when set, else "sliding_attention" wherever
    `sliding_window` is not None (Phi-3). Config classes fill `layer_types` in `__post_init__`: Gemma2 alternates
    (`(i + 1) % 2`, https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/gemma2/configuration_gemma2.py#L95-L98), Gemma3 is sliding except every `sliding_window_pattern`-th
    (default 6, https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/gemma3/configuration_gemma3.py#L106-L112); Qwen2/Qwen3 use sliding windows only with `use_sliding_window`.
    """
    conf = (arch.extra or {}).get("config") or {}
    window = conf.get("sliding_window")
    n = arch.num_layers
    types = conf.get("layer_types")
    if not types:
        if window is None or conf.get("use_sliding_window") is False:
            types = ["full_attention"] * n
        elif arch.family.sliding_layers == "alternate":
            types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
        elif arch.family.sliding_layers == "pattern":
            pattern = int(conf.get("sliding_window_pattern") or 6)
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
        else:
            types = ["sliding_attention"] * n
    if window is None:
        return [None] * n
    return [window if t == "sliding_attention" else None for t in list(types)[:n]] + [None] * (n - len(types))


def layer_kinds(arch: Arch) -> int:
    """How many attention kinds the decoder layers use (full, sliding): 1 or 2 (`layer_windows`)."""
    return len({w is None for w in layer_windows(arch)})
