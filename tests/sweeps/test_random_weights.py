"""run.weights=random: real-size catalog models with random weights, loaded by path as a TRL user loads them."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize

from sweeps.runner import grpo_setup, schema, tiny
from sweeps.runner.job import BadInput, to_job

REPO = Path(__file__).resolve().parents[2]
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
CATALOG_JSON = REPO / "estimator" / "catalog" / "HuggingFaceTB--SmolLM2-135M-Instruct.json"


def _compose(*overrides):
    schema.register()  # the trainer/default node the config composes (the app registers it the same way)
    with initialize(config_path="../../sweeps/runner/conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _meta_params(config: dict) -> int:
    """Parameter count of the architecture, from transformers on the meta device (no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    d = {
        k: v for k, v in config.items() if k not in ("architectures", "torch_dtype", "transformers.js_config")
    }
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(d.pop("model_type"), **d))
    return sum(p.numel() for p in model.parameters())


def test_not_in_catalog_is_one_clear_error():
    with pytest.raises(
        ValueError, match=r"model 'my/model': run.weights=random .* accepted names are .*Qwen"
    ):
        tiny.catalog_config("my/model")
    with pytest.raises(BadInput, match="run.weights='hub': accepted values are pretrained, random"):
        to_job(_compose("run.weights=hub"))
    with pytest.raises(BadInput, match="--model nope/x: not in the catalog"):
        to_job(_compose("model.name=nope/x", "run.weights=random"))


def test_variant_names_random_weights_and_pretrained_keys_are_unchanged():
    random = to_job(_compose("model=smollm2-135m", "run.weights=random"))
    assert random.variant["weights"] == "random"
    pretrained = to_job(_compose("model=smollm2-135m"))
    assert "weights" not in pretrained.variant  # rows measured before run.weights existed keep their keys
    assert random.key != pretrained.key
    tiny_job = to_job(_compose("model=tiny-2M", "run.weights=random"))
    assert "weights" not in tiny_job.variant  # tiny models are random whatever the setting


SMALL_RUN = (
    "model=smollm2-135m",
    "run.weights=random",
    "trainer.bf16=false",
    "trainer.per_device_train_batch_size=2",
    "trainer.num_generations=2",
    "trainer.max_prompt_length=6",
    "trainer.max_completion_length=5",
    "trainer.gradient_checkpointing=false",
    "run.num_prompts=4",
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One random SmolLM2-135M checkpoint for the module (built by the first test that needs it)."""
    path = tmp_path_factory.mktemp("random-weights")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tiny.CACHE_ENV, str(path))
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield path


@pytest.mark.slow
def test_random_smollm2_loads_by_path_in_the_run_dtype_and_generates_full_length(tmp_path, cache):
    job = to_job(_compose(*SMALL_RUN, "trainer.dtype=float32"))
    built = grpo_setup.build(job.config, job.variant, tmp_path / "run")
    saved = Path(built.model_path)
    assert saved.parent == cache and (saved / "model.safetensors").is_file()

    # the checkpoint: the catalog's shape, the hub's dtype, every tensor the architecture has (tied head once)
    catalog = json.loads(CATALOG_JSON.read_text())
    on_disk = json.loads((saved / "config.json").read_text())
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert on_disk[k] == catalog[k]
    from safetensors import safe_open

    with safe_open(str(saved / "model.safetensors"), "pt") as f:
        stored = {k: f.get_slice(k) for k in f.keys()}
        n_stored = sum(int(__import__("math").prod(s.get_shape())) for s in stored.values())
        assert {s.get_dtype() for s in stored.values()} == {"BF16"}
    assert n_stored == _meta_params(catalog) == 134_515_008  # SmolLM2-135M's published size

    # loaded by path through TRL's model_init_kwargs: fp32 as asked, not the checkpoint's bf16
    model = built.trainer.model
    assert isinstance(built.trainer.args.model_init_kwargs, dict)
    assert {p.dtype for p in model.parameters()} == {__import__("torch").float32}
    assert sum(p.numel() for p in model.parameters()) == n_stored
    assert len(built.tokenizer) == catalog["vocab_size"]

    built.trainer.train()
    logs = [e for e in built.trainer.state.log_history if "completions/min_length" in e]
    assert len(logs) == 2
    assert all(e["completions/min_length"] == 5 and e["completions/max_length"] == 5 for e in logs)

    # a second run reuses the checkpoint (no rebuild)
    mtime = (saved / "model.safetensors").stat().st_mtime_ns
    assert tiny.save_random(SMOL, seed=0) == saved
    assert (saved / "model.safetensors").stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_random_smollm2_qlora_takes_the_bitsandbytes_load_path(tmp_path, cache):
    """The same checkpoint with method=qlora: transformers' bnb quantizer packs every Linear but the head."""
    import bitsandbytes as bnb
    import torch

    job = to_job(_compose(*SMALL_RUN, "method=qlora", "trainer.dtype=bfloat16"))
    model = grpo_setup.build(job.config, job.variant, tmp_path / "run").trainer.model
    catalog = json.loads(CATALOG_JSON.read_text())
    linear4 = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(linear4) == 7 * catalog["num_hidden_layers"]  # q k v o gate up down per layer; lm_head stays
    assert all(m.weight.dtype == torch.uint8 for m in linear4)
    base, trainable = grpo_setup.count_params(model)
    assert base == _meta_params(catalog)  # 4-bit weights counted unpacked: the same architecture
    assert 0 < trainable < base // 100  # LoRA adapters only


def test_building_the_checkpoint_frees_the_model_before_returning(tmp_path, monkeypatch):
    # a transformers model holds reference cycles, so `del` alone would leave its weights alive until a later
    # cyclic collection: on CUDA they would then sit in the allocator's cache through the measured run
    import gc
    import weakref

    built = []
    real_build = tiny.build_random_model

    def build(*args, **kwargs):
        model = real_build(*args, **kwargs)
        built.append(weakref.ref(next(model.parameters())))
        return model

    monkeypatch.setattr(tiny, "build_random_model", build)
    gc.disable()
    try:
        tiny.save_random(SMOL, seed=3, cache_dir=tmp_path)
        assert built and built[0]() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("use_cache", [True, False])
def test_the_runner_says_whether_generate_keeps_a_cache(tmp_path, use_cache):
    """The checkpoint's generation config decides otherwise (tests/ground_truth/test_generation_without_cache.py):
    the catalog's Qwen3-4B config.json says use_cache false, so its random-weight checkpoint would generate
    without a cache whatever the run's settings say. TRL builds its GenerationConfig from generation_kwargs."""
    from estimator.settings.config import RunConfig

    cfg = RunConfig(model="tiny-2M", device="cpu", max_completion_length=8, generation_use_cache=use_cache)
    args = grpo_setup.grpo_args(cfg, dict(grpo_setup.VARIANT_DEFAULTS), tmp_path)
    assert args.generation_kwargs == {"min_new_tokens": 8, "use_cache": use_cache}
    assert tiny.catalog_config("Qwen/Qwen3-4B")["use_cache"] is False
