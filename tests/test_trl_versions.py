"""TRL release semantics (estimator/settings/trl_versions.py, estimator/settings/release_config.py) against the releases' own source.

Defaults are checked against the GRPOConfig / TrainingArguments source of every release whose environment is
present (the installed TRL, and .venvs/trl-X.Y from `make sweep-legacy`), parsed with `ast` (no import).
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from estimator.settings.config import NEWEST_TRL, RunConfig
from estimator.settings.release_config import for_release
from estimator.settings.trl_versions import NEWEST, OLDEST, TABLE, fmt, parse_version, profile
from estimator.step.estimate import estimate

REPO = Path(__file__).resolve().parent.parent
MINORS = [(0, m) for m in range(14, 30)] + [(1, m) for m in range(0, 17)]


def test_every_minor_release_maps_to_exactly_one_row():
    for v in MINORS:
        assert sum(row.covers(v) for row in TABLE) == 1, v
    assert OLDEST == (0, 14) and NEWEST == (1, 16)
    assert fmt(NEWEST) == NEWEST_TRL


def test_rows_are_contiguous_and_cite_a_source():
    for prev, row in zip(TABLE, TABLE[1:], strict=False):
        assert prev.last < row.first
        assert not any(prev.last < v < row.first for v in MINORS), (prev.label, row.label)
    for row in TABLE:
        assert row.changes and all(("PR #" in c) or (".py" in c) for c in row.changes), row.label


def test_version_parsing_and_unknown_releases():
    assert parse_version("0.14.0") == (0, 14)
    assert parse_version("v1.16.2") == (1, 16)
    assert parse_version("0.19.0.dev0") == (0, 19)
    for bad in ("0.13", "2.0", "0.30"):
        with pytest.raises(ValueError, match="accepted 0.14 to 1.16"):
            profile(bad)
    with pytest.raises(ValueError, match="MAJOR.MINOR"):
        profile("latest")


# ---------------------------------------------------------------- defaults against the releases' source


def _class_defaults(path: Path, cls: str) -> dict:
    """Literal `default=` values of a dataclass's fields, read from source."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
                    v = st.value
                    if isinstance(v, ast.Call):
                        v = next((k.value for k in v.keywords if k.arg == "default"), None)
                    try:
                        out[st.target.id] = ast.literal_eval(v)
                    except (ValueError, TypeError, SyntaxError):
                        pass
    return out


def _environments() -> list[tuple[str, Path]]:
    """(site-packages, TRL version) for the installed TRL and every built legacy environment."""
    envs = []
    spec = importlib.util.find_spec("trl")
    if spec and spec.origin:
        envs.append(Path(spec.origin).parent.parent)
    envs += sorted(REPO.glob(".venvs/trl-*/lib/python3*/site-packages"))
    out = []
    for site in envs:
        dist = sorted(site.glob("trl-*.dist-info"))
        if dist and (site / "trl/trainer/grpo_config.py").exists():
            out.append((dist[0].name.removesuffix(".dist-info").split("-")[1], site))
    return out


ENVS = _environments()


@pytest.mark.skipif(not ENVS, reason="no TRL installed and no .venvs/trl-X.Y built")
@pytest.mark.parametrize("version,site", ENVS, ids=[v for v, _ in ENVS])
def test_defaults_match_the_release_source(version, site):
    row = profile(version)
    grpo = {}
    for path in (site / "trl/trainer/base_config.py", site / "trl/trainer/grpo_config.py"):
        if path.exists():
            for cls in ("BaseConfig", "_BaseConfig", "GRPOConfig"):
                grpo |= _class_defaults(path, cls)
    targs = _class_defaults(site / "transformers/training_args.py", "TrainingArguments")
    d = row.defaults
    assert grpo["beta"] == d.beta
    assert grpo["num_generations"] == d.num_generations
    assert grpo["max_completion_length"] == d.max_completion_length
    assert grpo.get("max_prompt_length") == d.max_prompt_length
    assert grpo.get("per_device_train_batch_size", targs["per_device_train_batch_size"]) == (
        d.per_device_train_batch_size
    )
    assert grpo.get("gradient_accumulation_steps", targs["gradient_accumulation_steps"]) == (
        d.gradient_accumulation_steps
    )
    bf16 = grpo.get("bf16", targs["bf16"])
    assert (bf16 is None or bf16) == d.bf16  # None = "not fp16", i.e. True (GRPOConfig.__post_init__)
    gc = grpo.get("gradient_checkpointing", targs["gradient_checkpointing"])
    assert gc == d.gradient_checkpointing
    assert grpo.get("vllm_gpu_memory_utilization") == d.vllm_gpu_memory_utilization
    assert (grpo.get("num_iterations") is not None) == row.has_num_iterations
    assert ("steps_per_generation" in grpo) == row.has_steps_per_generation
    trainer = (site / "trl/trainer/grpo_trainer.py").read_text()
    if row.logprob_path == "rowwise":
        assert "log_softmax(dim=-1)" in trainer and "selective_log_softmax" not in trainer
    if row.logprob_path == "chunked":
        assert "add_fused_lm_head" in trainer


# ---------------------------------------------------------------- a release's config


def test_014_batch_counts_prompts_and_reference_exists_whatever_beta():
    cfg = for_release("0.14", {"model": "0.5B", "per_device_train_batch_size": 1, "num_generations": 4})
    assert cfg.per_device_train_batch_size == 4  # 1 prompt × 4 completions
    assert cfg.beta == 0.04 and cfg.gradient_accumulation_steps == 8 and cfg.max_completion_length == 256
    no_kl = for_release("0.14", {"model": "0.5B", "beta": 0.0})
    assert no_kl.has_reference_model and no_kl.runs_reference_pass
    # Qwen2.5-0.5B: 494,032,768 parameters (tied embeddings), float32 by default -> a second 4-byte copy
    est = estimate(no_kl)
    assert est.phases["optimizer"]["reference_weights"] == 494_032_768 * 4
    assert not for_release("0.16", {"model": "0.5B", "beta": 0.0}).has_reference_model


def test_defaults_move_with_the_release():
    old, mid, new = (for_release(v, {"model": "0.5B"}) for v in ("0.18", "0.19", "0.22"))
    assert (old.beta, old.bf16, old.gradient_checkpointing) == (0.04, False, False)
    assert (mid.beta, mid.bf16, mid.gradient_checkpointing) == (0.0, True, False)
    assert new.gradient_checkpointing
    assert for_release("0.26", {"model": "0.5B"}).dtype == "bfloat16"  # dtype="auto": the checkpoint's
    assert for_release("0.27", {"model": "0.5B"}).dtype == "float32"
    assert for_release("1.16", {}) == RunConfig()  # the newest release is the estimator's own defaults


def test_settings_a_release_does_not_have_are_refused():
    with pytest.raises(ValueError, match="from 0.16"):
        for_release("0.15", {"num_iterations": 2})
    with pytest.raises(ValueError, match="from 0.18"):
        for_release("0.17", {"steps_per_generation": 2})
    with pytest.raises(ValueError, match="colocate from 0.18"):
        for_release("0.17", {"use_vllm": True, "vllm_mode": "colocate"})


def test_old_policy_pass_rules():
    ahead = {"gradient_accumulation_steps": 2, "steps_per_generation": 4}
    assert not for_release("0.18", ahead).runs_old_logprob_pass  # only num_iterations > 1
    assert for_release("0.19", ahead).runs_old_logprob_pass  # + steps_per_generation > GA (PR #3493)
    assert for_release("0.16", {"num_iterations": 2}).runs_old_logprob_pass
    assert not for_release("0.15", {"gradient_accumulation_steps": 4}).runs_old_logprob_pass
    vllm = {"use_vllm": True, "vllm_mode": "server"}
    assert not for_release("0.22", vllm).runs_old_logprob_pass
    assert for_release("0.23", vllm).runs_old_logprob_pass  # vLLM importance-sampling correction


def test_log_prob_heads_by_release():
    assert for_release("0.14", {}).logprob_head == "rowwise"
    assert for_release("1.14", {}).logprob_head == "selective"
    assert for_release("1.15", {}).logprob_head == "chunked"
    # a materialized head holds at least the [B, C, V] logits; 0.5B vocab 151936, 8 × 256 completion tokens
    est = estimate(for_release("0.15", {"model": "0.5B"}))
    assert est.phases["train"]["logprob_head"] >= 8 * 256 * 151936 * 4


def test_cli_names_the_release_and_refuses_unknown_ones():
    run = [sys.executable, "-m", "estimator.interface.cli", "--model", "0.5B"]
    ok = subprocess.run([*run, "--trl-version", "0.14"], capture_output=True, text=True, cwd=REPO)
    assert ok.returncode == 0 and "modelled TRL release: 0.14" in ok.stdout
    bad = subprocess.run([*run, "--trl-version", "0.12"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "accepted 0.14 to 1.16" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
