"""The upstream functions the tracer copies or patches, and a hash of their source per installed version.

The tracer re-implements or replaces pieces of TRL, transformers, accelerate, torch and bitsandbytes (see
`TARGETS`: what each one is, and which tracer code follows it). `upstream.json` holds the sha256 of the source
text of each (its `def`/`class` block with decorators, read from the installed file without importing it: bnb's
CUDA backend cannot be imported on a CPU build of torch), keyed by the installed version of its package; `tests/contracts/test_tracer_upstream.py` fails
when a source differs from the table, or the installed version has no entry, so an upgrade cannot silently rot
the tracer. After re-reading the changed functions and updating the tracer code named with them:

    PYTHONPATH=. .venv/bin/python -m sweeps.trace.upstream     # records the installed versions' hashes
"""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass
from importlib.metadata import distribution, version
from pathlib import Path

TABLE = Path(__file__).with_name("upstream.json")


@dataclass(frozen=True)
class Target:
    """One upstream object (`module:qualname`), its distribution, and the tracer code that follows it."""

    name: str
    package: str
    used_by: str


TARGETS = (
    # TRL
    Target(
        "trl.trainer.utils:add_fused_lm_head",
        "trl",
        "patches.use_gpu_fused_head (copies _fused_forward's CUDA path, reads its closure cells by name)",
    ),
    Target(
        "trl.kernels.chunked_logprob:ChunkedLogProbFunction",
        "trl",
        "patches.use_gpu_fused_head (its apply() arguments) and the tile no-ops in patches._replacements",
    ),
    Target(
        "trl.kernels.chunked_logprob:_forward_tile", "trl", "patches._replacements (no-op: allocates nothing)"
    ),
    Target(
        "trl.kernels.chunked_logprob:_backward_tile",
        "trl",
        "patches._replacements (no-op: allocates nothing)",
    ),
    Target("trl.kernels.chunked_logprob:_addmm_fp32", "trl", "patches._replacements (no-op on CUDA)"),
    Target("trl.trainer.utils:nanmin", "trl", "patches._replacements (metric-only, replaced by min)"),
    Target("trl.trainer.utils:nanmax", "trl", "patches._replacements (metric-only, replaced by max)"),
    Target(
        "trl.trainer.grpo_trainer:GRPOTrainer.__init__",
        "trl",
        "step.build (beta set after __init__, the reference model attached and prepared as __init__ does)",
    ),
    Target(
        "trl.trainer.grpo_trainer:GRPOTrainer._generate_single_turn",
        "trl",
        "step.run's generate phase and sweeps/trace/generate.py (transformers backend, unwrap_model_for_generation)",
    ),
    Target(
        "trl.trainer.grpo_trainer:GRPOTrainer._generate_and_score_completions",
        "trl",
        "step._score (the batch it leaves and the no-grad log-prob passes it runs)",
    ),
    Target("trl.trainer.grpo_trainer:GRPOTrainer._prepare_inputs", "trl", "step._micro_batches"),
    # transformers
    Target(
        "transformers.masking_utils:_ignore_causal_mask_sdpa",
        "transformers",
        "patches._ignore_mask_fake_as_ones (wraps it, passes its positional arguments by position)",
    ),
    Target(
        "transformers.generation.utils:GenerationMixin._sample", "transformers", "sweeps/trace/generate.py"
    ),
    Target(
        "transformers.cache_utils:DynamicLayer",
        "transformers",
        "generate._fast_forward_cache (replaces layer.keys / layer.values)",
    ),
    Target(
        "transformers.trainer:Trainer.train",
        "transformers",
        "step.build (gradient checkpointing enabled as train() enables it)",
    ),
    Target(
        "transformers.integrations.bitsandbytes:replace_with_bnb_linear",
        "transformers",
        "fake_model.emulate_4bit (which Linears become Linear4bit)",
    ),
    # accelerate
    Target(
        "accelerate.utils.operations:ConvertOutputsToFp32",
        "accelerate",
        "generate._forward (fp32 copy of bf16/fp16 logits)",
    ),
    # torch
    Target("torch.nn.modules.module:Module._apply", "torch", "patches._apply (FakeTensor variant of it)"),
    Target("torch.nn.functional:dropout", "torch", "patches._fused_dropout (wraps it)"),
    Target("torch.nn.functional:softmax", "torch", "patches._cuda_softmax (wraps it)"),
    Target(
        "torch.optim.optimizer:_default_to_fused_or_foreach",
        "torch",
        "step.use_cuda_optimizer_defaults (foreach on CUDA)",
    ),
    # bitsandbytes
    Target(
        "bitsandbytes.autograd._functions:MatMul4Bit",
        "bitsandbytes",
        "fake_model._Matmul4bit (transient dequantized weight in backward)",
    ),
    Target(
        "bitsandbytes.functional:dequantize_4bit",
        "bitsandbytes",
        "fake_model._Matmul4bit backward (with nested quant, one fp32 absmax beside the dequantized weight)",
    ),
    Target(
        "bitsandbytes.backends.cuda.ops:_gemm_4bit_kernel_impl",
        "bitsandbytes",
        "fake_model._Matmul4bit (the fused kernel: the output only)",
    ),
    Target(
        "bitsandbytes.backends.cuda.ops:_dequant_linear_fallback",
        "bitsandbytes",
        "fake_model._Matmul4bit (the transient dequantized weight in the input's dtype, then F.linear)",
    ),
    Target(
        "bitsandbytes.backends.cuda.ops:_gemm_4bit_use_custom_cuda",
        "bitsandbytes",
        "bnb_dispatch.dequantizes (compiled from the installed source) and bnb_dispatch.FALLBACK_PAST_M",
    ),
    Target(
        "bitsandbytes.optim.optimizer:Optimizer2State.init_state",
        "bitsandbytes",
        "optim8bit.Emulated8bitAdamW.step (the state tensors it creates)",
    ),
)


def module_file(module: str, package: str) -> Path:
    """The installed source file of `module` (a module of distribution `package`), found without importing it."""
    dist = distribution(package)
    rel = module.replace(".", "/")
    for candidate in (f"{rel}.py", f"{rel}/__init__.py"):
        path = Path(str(dist.locate_file(candidate)))
        if path.is_file():
            return path
    raise FileNotFoundError(f"{module} is not in the installed {package} {dist.version}")


def source(target: Target) -> str:
    """The `def`/`class` block (decorators included) `target.name` = `module:Qual.name` names in its file."""
    module, _, qualname = target.name.partition(":")
    text = module_file(module, target.package).read_text()
    body: list[ast.stmt] = ast.parse(text).body
    node = None
    for part in qualname.split("."):
        defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        node = next((n for n in body if isinstance(n, defs) and n.name == part), None)
        if node is None:
            raise LookupError(
                f"{target.name}: no {part!r} in {module} ({target.package} {installed_version(target.package)})"
            )
        body = node.body
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return "\n".join(text.splitlines()[first - 1 : node.end_lineno]) + "\n"


def source_hash(target: Target) -> str:
    """sha256 of `source(target)`."""
    return hashlib.sha256(source(target).encode()).hexdigest()


def installed_version(package: str) -> str:
    """The installed version without its local label (torch `2.13.0+cpu` and `2.13.0+cu128` ship the same source)."""
    return version(package).split("+")[0]


def installed_versions() -> dict[str, str]:
    return {p: installed_version(p) for p in sorted({t.package for t in TARGETS})}


def load_table(path: Path = TABLE) -> dict[str, dict[str, dict[str, str]]]:
    """{package: {version: {target name: sha256}}}."""
    return json.loads(path.read_text())


def record_installed(path: Path = TABLE) -> dict:
    """Add (or replace) the installed versions' hashes in the table; other versions' entries are kept."""
    table = load_table(path) if path.exists() else {}
    versions = installed_versions()
    for pkg, ver in versions.items():
        table.setdefault(pkg, {})[ver] = {t.name: source_hash(t) for t in TARGETS if t.package == pkg}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return versions


if __name__ == "__main__":
    print("recorded", record_installed())
