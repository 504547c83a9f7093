"""Loading a bitsandbytes 4-bit model: how many full-precision weights the GPU holds while it is quantized.

transformers quantizes a `load_in_4bit` model as it loads it: each checkpoint tensor is read onto the GPU in the
load dtype, then packed (`Bnb4bitQuantize`). The releases modelled read a tensor only when the quantizer asks for
it, so one full-precision weight at a time waits beside the packed ones, well under the step's own peak
(https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/core_model_loading.py#L1719-L1731:
no reader threads "when doing on-the-fly quantization").

transformers 5.0-5.3 hand every tensor of the checkpoint to 4 reader threads before the first is quantized
(https://github.com/huggingface/transformers/blob/v5.3.0/src/transformers/core_model_loading.py#L1105-L1110, the
reads submitted from L1126, the quantizing loop from L1210). The readers run ahead of the quantizer, so up to the
whole model sits on the GPU in the load dtype at once. transformers' own table for a 4-bit Qwen2.5-7B-Instruct
load with those readers: 5.46 GB allocated, 13.47 GB reserved (huggingface/transformers#44576, which made these
loads sequential from 5.4; huggingface/transformers#43032: a 14B 4-bit load out of memory on a 16 GB card under
5.0). The reserve is cached and a short card releases it and retries, so what can run out of memory is the load
itself, before any step.
"""

from __future__ import annotations

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.settings.version_text import Version, parse_version
from estimator.terms.weights import dense_weights
from estimator.units import gib

# the transformers releases (inclusive) whose loader reads ahead of the quantizer; sequential from 5.4
READ_AHEAD_RELEASES: tuple[Version, Version] = ((5, 0), (5, 3))


def read_ahead_load_bytes(cfg: RunConfig, arch: Arch) -> int:
    """P × bytes(load dtype): at worst every weight is on the GPU unquantized before the first one is packed."""
    return dense_weights(arch, cfg.dtype)


def reads_ahead(cfg: RunConfig, transformers: str | None) -> bool:
    """Whether this 4-bit load, under the installed transformers release, reads weights ahead of the quantizer."""
    if not cfg.load_in_4bit or transformers is None:
        return False
    try:
        v = parse_version(transformers)
    except ValueError:
        return False
    return READ_AHEAD_RELEASES[0] <= v <= READ_AHEAD_RELEASES[1]


def read_ahead_note(cfg: RunConfig, arch: Arch, transformers: str | None) -> list[str]:
    """One line when the installed transformers reads a 4-bit load ahead of its quantizer, with the load's worst case."""
    if not reads_ahead(cfg, transformers):
        return []
    return [
        f"transformers {transformers} is installed: its loader reads a 4-bit model's weights onto the GPU in "
        f"{cfg.dtype} ahead of the quantizer, up to {gib(read_ahead_load_bytes(cfg, arch)):.1f} GiB at once before "
        f"the first step (estimated; the figures below model {cfg.transformers_version}, which reads one at a "
        "time); set HF_DEACTIVATE_ASYNC_LOAD=1 or install transformers>=5.4 (huggingface/transformers#44576)"
    ]
