"""A RunConfig for one TRL release: that release's defaults, batch meaning and rules (estimator/settings/trl_versions.py).

`release_values(version, given)` turns the settings a user gave, in that release's own terms
(per_device_train_batch_size counts prompts in 0.14), into RunConfig field values with `trl_version` set;
RunConfig's derived properties (reference model, old-policy pass, generation batch) read the release's rules.
"""

from __future__ import annotations

from dataclasses import fields

from estimator.settings.config import RunConfig
from estimator.settings.trl_versions import fmt, parse_version, profile
from estimator.settings.versions import NEWEST_TRANSFORMERS

# Defaults fields with their own rule below (dtype "auto", an absent prompt cap, vLLM's mode and server share)
_OWN_RULE = ("dtype", "max_prompt_length", "vllm_gpu_memory_utilization", "vllm_mode")


def release_values(version: str, given: dict) -> dict:
    """The config TRL `version` runs for the settings in `given` (RunConfig field names, the user's values).

    Unset fields take that release's defaults; a model given by name loads in the release's dtype ("auto" is
    resolved with the model by the caller); in 0.14 per_device_train_batch_size counts prompts and becomes
    prompts × num_generations completions; settings the release does not have are a ValueError.
    """
    rel = profile(version)
    known = {f.name for f in fields(RunConfig)}
    unknown = sorted(set(given) - known - {"trl_version"})
    if unknown:
        raise ValueError(f"unknown setting {unknown[0]!r}")
    d = dict(given)
    d.setdefault("transformers_version", NEWEST_TRANSFORMERS)  # a dict without it is a record made under 5.23
    for f in fields(rel.defaults):  # the release's own default for every other setting it defines
        if f.name not in _OWN_RULE:
            d.setdefault(f.name, getattr(rel.defaults, f.name))
    if "dtype" not in d and not d.get("load_in_4bit"):
        d["dtype"] = rel.defaults.dtype  # "auto" (0.26): the checkpoint's, resolved with the model
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
    if rel.vllm_modes == ("separate_device",) and d.get("vllm_gpu_memory_utilization") is not None:
        # 0.14-0.15: vllm_gpu_memory_utilization is the share of vLLM's own device, modelled as a server's GPU
        d.setdefault("vllm_server_utilization", d["vllm_gpu_memory_utilization"])
    if not rel.has_vllm_importance_sampling:
        d["vllm_importance_sampling_correction"] = False
    if rel.batch_unit == "prompts":
        d["per_device_train_batch_size"] = d["per_device_train_batch_size"] * d["num_generations"]
    if d.get("logprob_head") == "chunked" and rel.logprob_path != "chunked":
        raise ValueError(f"logprob_head=chunked: {label} has no fused chunked log-prob head (from 1.15)")
    d.setdefault("logprob_head", rel.logprob_path)
    d["trl_version"] = fmt(parse_version(version))
    return d


def for_release(version: str, given: dict) -> RunConfig:
    """RunConfig of `release_values(version, given)` ("auto" dtype taken as the catalog checkpoints' bfloat16)."""
    d = release_values(version, given)
    if d.get("dtype") == "auto":
        d["dtype"] = "bfloat16"
    return RunConfig.from_dict(d)
