"""A RunConfig for one TRL release: that release's defaults, batch meaning and rules (estimator/trl_versions.py).

`ReleaseRunConfig` is RunConfig plus `trl_version` (the field the one-schema RunConfig needs); its derived
properties follow the release's rules instead of TRL 1.16's. `for_release(version, given)` builds one from the
settings a user gave, in that release's own terms (per_device_train_batch_size counts prompts in 0.14).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from estimator.config import RunConfig
from estimator.trl_versions import NEWEST, TrlProfile, fmt, parse_version, profile


@dataclass(frozen=True)
class ReleaseRunConfig(RunConfig):
    """RunConfig whose semantics are those of TRL `trl_version` (MAJOR.MINOR); per_device_train_batch_size counts completions here."""

    trl_version: str = fmt(NEWEST)

    @property
    def release(self) -> TrlProfile:
        return profile(self.trl_version)

    @property
    def resolved_steps_per_generation(self) -> int:
        """Per micro-batch generation (≤0.16): 1; one per accumulation cycle (0.17): GA; 0.18+: TRL's own rule."""
        unit = self.release.generation_unit
        if unit == "micro_batch":
            return 1
        if unit == "accumulated":
            return self.gradient_accumulation_steps
        return super().resolved_steps_per_generation

    @property
    def has_reference_model(self) -> bool:
        """0.14-0.15: a reference copy whenever PEFT is off, whatever beta; 0.16+: only with beta != 0 (PR #2806)."""
        if not self.release.reference_needs_beta:
            return not self.use_peft
        return super().has_reference_model

    @property
    def runs_reference_pass(self) -> bool:
        """0.14-0.15 always compute reference log-probs; 0.16+ only with beta != 0."""
        return True if not self.release.reference_needs_beta else super().runs_reference_pass

    @property
    def runs_old_logprob_pass(self) -> bool:
        """The old-policy pass under the release's rule (trl_versions.OLD_PASS_RULES)."""
        rule = self.release.old_pass_rule
        spg, ga, it = (
            self.resolved_steps_per_generation,
            self.gradient_accumulation_steps,
            self.num_iterations,
        )
        if rule == "never":
            return False
        if rule == "num_iterations":
            return it > 1
        if rule == "iterations_or_spg":
            return it > 1 or spg > ga
        if rule == "ga_modulo":
            return ga % (spg * it) != 0
        return super().runs_old_logprob_pass


_DEFAULTED = (
    "beta",
    "bf16",
    "gradient_checkpointing",
    "num_generations",
    "max_completion_length",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
)


def for_release(version: str, given: dict) -> ReleaseRunConfig:
    """The config TRL `version` runs for the settings in `given` (RunConfig field names, the user's values).

    Unset fields take that release's defaults; a model given by name loads in the release's dtype ("auto" is
    modelled as the checkpoint's bfloat16); in 0.14 per_device_train_batch_size counts prompts and becomes
    prompts × num_generations completions; settings the release does not have are a ValueError.
    """
    rel = profile(version)
    known = {f.name for f in fields(RunConfig)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"unknown setting {unknown[0]!r}")
    d = dict(given)
    for name in _DEFAULTED:
        d.setdefault(name, getattr(rel.defaults, name))
    if "dtype" not in d and not d.get("load_in_4bit"):
        d["dtype"] = "bfloat16" if rel.defaults.dtype == "auto" else rel.defaults.dtype
    if rel.defaults.max_prompt_length is not None:
        d.setdefault("max_prompt_length", rel.defaults.max_prompt_length)
    label = f"TRL {fmt(parse_version(version))}"
    if not rel.has_num_iterations and d.get("num_iterations", 1) != 1:
        raise ValueError(f"num_iterations={d['num_iterations']}: {label} has no num_iterations (from 0.16)")
    for name in ("steps_per_generation", "generation_batch_size"):
        if not rel.has_steps_per_generation and d.get(name) is not None:
            raise ValueError(f"{name}={d[name]}: {label} has no {name} (from 0.18)")
    if d.get("use_vllm"):
        mode = d.get("vllm_mode", rel.defaults.vllm_mode)
        if mode == "colocate" and "colocate" not in rel.vllm_modes:
            raise ValueError(
                f"vllm_mode=colocate: {label} runs vLLM only as {' / '.join(rel.vllm_modes)} (colocate from 0.18)"
            )
        d["vllm_mode"] = "server" if mode == "separate_device" else mode
    elif "vllm_mode" not in d:
        d["vllm_mode"] = "server" if rel.defaults.vllm_mode == "separate_device" else rel.defaults.vllm_mode
    if rel.defaults.vllm_gpu_memory_utilization is not None:
        d.setdefault("vllm_gpu_memory_utilization", rel.defaults.vllm_gpu_memory_utilization)
    if not rel.has_vllm_importance_sampling:
        d["vllm_importance_sampling_correction"] = False
    if rel.batch_unit == "prompts":
        d["per_device_train_batch_size"] = d["per_device_train_batch_size"] * d["num_generations"]
    d["logprob_head"] = rel.logprob_path
    return ReleaseRunConfig.from_dict({**d, "trl_version": fmt(parse_version(version))})
