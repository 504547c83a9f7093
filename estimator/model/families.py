"""One record per decoder family: what differs between the `model_type`s this estimator sizes.

Every term, the validator, the architecture builder and the tracer read a family's facts from here; a
`model_type` with no record is refused (`family()` raises), never sized as a Llama. Each field cites the
transformers 5.23 modeling code (or peft 0.21.2 table) it copies; `tests/test_architecture.py` checks the
layouts against transformers instantiating each family on the meta device.

To add a family: one `Family(...)` entry below, a catalog config.json, and the tests (see docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

TF = "https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models"
PEFT_TARGETS_SOURCE = (
    "https://github.com/huggingface/peft/blob/v0.21.2/src/peft/utils/constants.py#L67-L107 "
    "(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)"
)
PEFT_VERSION = "0.21.2"
TRANSFORMERS_VERSION = "5.23.0"

# transformers-4 names peft 0.21 maps onto a MoE block's fused experts and router (`_convert_peft_config_moe`)
QWEN2_MOE_EXPERTS = {"gate_up": ("gate_proj", "up_proj"), "down": ("down_proj",), "router": ("gate",)}
MIXTRAL_EXPERTS = {"gate_up": ("w1", "w3"), "down": ("w2",), "router": ("gate",)}


@dataclass(frozen=True)
class Family:
    """How one `model_type` lays out and runs a decoder layer (transformers 5.23)."""

    model_type: str
    modeling: str  # the modeling file the facts below are read from
    fused_qkv: bool = False  # one qkv_proj [H, q + 2kv] (Phi-3) instead of q/k/v_proj
    fused_gate_up: bool = False  # one gate_up_proj [H, 2I] (Phi-3) instead of gate/up_proj
    attention_bias_key: str = "attention_bias"  # the config key that turns q/k/v biases on
    attention_bias_default: bool = False  # its value when the config omits it
    o_proj_bias_follows: bool = True  # False where the modeling code hard-wires o_proj bias=False
    qk_norm: bool = False  # RMSNorm on q and k after their projections
    qk_norm_scope: str = "head"  # head: over head_dim, per head (Qwen3, Gemma3); full: over q_dim / kv_dim
    tie_word_embeddings_default: bool = False  # the config class's default when config.json omits the key
    gemma_norm: bool = False  # RMSNorm computes `x * (1 + w.float())` in fp32 and returns `type_as(x)`
    norm_weight_fp32: bool = False  # RMSNorm returns `(w * x_hat).to(input_dtype)`: weight multiply in fp32
    norm_placement: str = "pre"  # pre: norms feed attention / MLP; post: norms on their outputs (OLMo-2)
    rotary_fp32: bool = False  # cos/sin stay fp32 and rotary casts q/k back: `q_embed.to(q.dtype)` (OLMo-2)
    sandwich_norms: bool = False  # pre/post feed-forward norms beside the two usual ones (4 per layer)
    rotary_per_layer_kind: bool = (
        False  # one cos/sin pair per attention kind (Gemma3's local and global rope)
    )
    sliding_layers: str = (
        "all"  # with a sliding_window and no layer_types: all, alternate, or pattern (every n-th full)
    )
    peft_default_targets: tuple[str, ...] | None = (
        "q_proj",
        "v_proj",
    )  # peft's defaults; None: peft has none
    sdpa_refused: str | None = None  # why transformers refuses attn_implementation="sdpa", when it does
    moe_expert_names: dict[str, tuple[str, ...]] | None = field(
        default=None, hash=False
    )  # peft MoE conversion

    @property
    def layer_norms(self) -> int:
        """H-sized RMSNorms in one decoder layer: input + post-attention (OLMo-2: post-attention + post-feedforward),
        and Gemma's two feed-forward ones."""
        return 4 if self.sandwich_norms else 2

    @property
    def fp32_norm_product(self) -> bool:
        """The RMSNorm multiplies its weight into the fp32 normalized value and casts the product back to the input
        dtype (Gemma's `x_hat * (1 + w.float())` then `type_as(x)`, OLMo-2's `(w * x_hat).to(input_dtype)`): it
        saves the fp32 normalized value for the weight's gradient and returns the input's dtype."""
        return self.gemma_norm or self.norm_weight_fp32

    @property
    def layer_period(self) -> int:
        """Decoder layers after which the layer kinds repeat (sliding / full attention): the fewest a trace needs."""
        return {"alternate": 2, "pattern": 6}.get(self.sliding_layers, 1)


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("llama", f"{TF}/llama/modeling_llama.py"),
        # MistralAttention: o_proj bias=False whatever attention_bias says
        Family("mistral", f"{TF}/mistral/modeling_mistral.py", o_proj_bias_follows=False),
        Family("mixtral", f"{TF}/mixtral/modeling_mixtral.py", moe_expert_names=MIXTRAL_EXPERTS),
        # Qwen2Attention: q/k/v bias=True hard-wired, o_proj bias=False
        Family(
            "qwen2",
            f"{TF}/qwen2/modeling_qwen2.py",
            attention_bias_key="qkv_bias",
            attention_bias_default=True,
            o_proj_bias_follows=False,
        ),
        Family(
            "qwen2_moe",
            f"{TF}/qwen2_moe/modeling_qwen2_moe.py",
            attention_bias_key="qkv_bias",
            attention_bias_default=True,
            o_proj_bias_follows=False,
            peft_default_targets=None,
            moe_expert_names=QWEN2_MOE_EXPERTS,
        ),
        Family("qwen3", f"{TF}/qwen3/modeling_qwen3.py", qk_norm=True),
        Family(
            "qwen3_moe",
            f"{TF}/qwen3_moe/modeling_qwen3_moe.py",
            qk_norm=True,
            peft_default_targets=None,
            moe_expert_names=QWEN2_MOE_EXPERTS,
        ),
        Family(
            "phi3",
            f"{TF}/phi3/modeling_phi3.py",
            fused_qkv=True,
            fused_gate_up=True,
            o_proj_bias_follows=False,
            peft_default_targets=None,
        ),
        # Olmo2DecoderLayer (modeling_olmo2.py#L287-L315): no input_layernorm; q/k/v_proj and the MLP read the
        # residual stream, post_attention_layernorm / post_feedforward_layernorm normalize the attention and MLP
        # outputs before each residual add (#L307, #L313). Olmo2Attention (#L213-L214, #L227-L228): q_norm / k_norm
        # are RMSNorms over all of q_dim / kv_dim, on q_proj / k_proj's outputs before the head reshape.
        # Olmo2RMSNorm.forward (#L59-L64): `(self.weight * hidden_states).to(input_dtype)`. Olmo2RotaryEmbedding
        # returns fp32 cos/sin (#L108-L113) and apply_rotary_pos_emb casts back (#L172-L177). o_proj's bias follows
        # attention_bias. peft 0.21.2 has no olmo2 entry in its default target table.
        Family(
            "olmo2",
            f"{TF}/olmo2/modeling_olmo2.py",
            qk_norm=True,
            qk_norm_scope="full",
            norm_weight_fp32=True,
            norm_placement="post",
            rotary_fp32=True,
            peft_default_targets=None,
        ),
        Family(
            "gemma2",
            f"{TF}/gemma2/modeling_gemma2.py",
            tie_word_embeddings_default=True,  # Gemma2Config
            gemma_norm=True,
            sandwich_norms=True,
            sliding_layers="alternate",  # configuration_gemma2.py: sliding where (i + 1) % 2
            sdpa_refused="sdpa does not support Gemma2's attention logit softcapping",  # _supports_sdpa = False
        ),
        Family(
            "gemma3_text",
            f"{TF}/gemma3/modeling_gemma3.py",
            tie_word_embeddings_default=True,  # Gemma3TextConfig
            qk_norm=True,
            gemma_norm=True,
            sandwich_norms=True,
            rotary_per_layer_kind=True,  # Gemma3TextModel: rotary_emb and rotary_emb_local
            sliding_layers="pattern",  # configuration_gemma3.py: full every sliding_window_pattern-th (6)
        ),
    )
}
MODEL_TYPES = tuple(FAMILIES)


class UnknownFamily(ValueError):
    """A `model_type` with no record here."""


def family(model_type: str) -> Family:
    """The record for `model_type`; UnknownFamily (naming the supported ones) when there is none."""
    try:
        return FAMILIES[model_type]
    except (KeyError, TypeError):
        raise UnknownFamily(model_type) from None
