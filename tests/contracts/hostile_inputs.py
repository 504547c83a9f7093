"""A corpus of hostile inputs for `vram-estimate` (and a few for `grpo-vram-trace`), with a classifier.

The house rule: bad input gets ONE clear line on stderr (`PROG: error: ...`, naming the bad value, cut and escaped,
and what is accepted) and exit 2, never a traceback or a hang. Unlike tests/contracts/test_bad_input.py (one bad
value per schema setting), the cases here are combinations, files of every kind (devices, FIFOs, loops, bombs),
hostile config.json content through every role, output streams and environments.

Each `Case` says what to run (argv, files made in a fresh tmp dir, env, in-process or in a subprocess) and what is
expected: "refused" (exit 2, or 3 for an answer that cannot be written, one clean error line) or "accepted" (exit
0/1, stderr only notes). `classify(case)` runs it and returns one of OUTCOMES. Used by
tests/contracts/test_hostile_inputs.py and benchmarks/hostile_inputs.py.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 20
MAX_LINE = 400

CLASSES = {
    "versions": "pathological version strings (flag and config key)",
    "files": "files of every kind for --config, --model, deepspeed_config_file",
    "model-json": "hostile config.json content, also as reward/value/reference model",
    "combinations": "combinations TRL / vLLM / DeepSpeed refuse",
    "alloc-conf": "PYTORCH_CUDA_ALLOC_CONF strings torch 2.13 refuses",
    "streams": "output streams: stdout closed, /dev/full, a closed pipe",
    "numbers": "every numeric flag with 0, -1, 1e309, nan, inf, 2**64, '', '  ', unicode digits",
    "typos": "typos in flags and config keys",
    "environment": "HOME unset or read-only, offline Hub, LANG=C with non-ASCII paths",
    "trace": "grpo-vram-trace one with hostile flags",
}
OUTCOMES = (
    "clean-refused",
    "clean-accepted",
    "accepted-wrong",
    "refused-wrong",
    "refused-unclear",
    "traceback",
    "hang",
)


@dataclass(frozen=True)
class Special:
    """A file that is not plain text: fifo, dir, loop, unreadable (text), zeros (a size), link (a target)."""

    kind: str
    arg: object = None


@dataclass(frozen=True)
class Case:
    cls: str
    name: str
    argv: tuple[str, ...]  # "{tmp}" is replaced by the case's tmp dir
    expect: str = "refused"  # "refused" | "accepted" | "either" (a clean refusal or a clean answer)
    files: tuple[tuple[str, object], ...] = ()  # (relative path, str | bytes | Special)
    env: tuple[tuple[str, str | None], ...] = ()  # None unsets
    subprocess: bool = False
    shell: str = ""  # appended to the command line (then run through bash)
    needle: str = ""  # the error line must contain it
    out_needle: str = ""  # an accepted answer must contain it
    code: int = 2  # a refusal's exit code
    prog: str = "vram-estimate"
    defect: str = ""  # a known defect: the test marks it xfail(strict=True)
    skip: str = ""  # a reason the case cannot run here

    @property
    def id(self) -> str:
        return f"{self.cls}:{self.name}"


@dataclass
class Result:
    outcome: str
    code: object = None
    detail: str = ""
    err: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- building blocks

QWEN = json.loads((REPO / "estimator" / "catalog" / "Qwen--Qwen2.5-0.5B-Instruct.json").read_text())
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
BIG_COMMENT_BYTES = 64 << 20
_shared: dict[str, str] = {}


def big_comment_file() -> str:
    """A 64 MB YAML comment, written once per process in the temp dir (the reader's cap is 1 MiB)."""
    if "big" not in _shared:
        d = tempfile.mkdtemp(prefix="grpo-vram-hostile-")
        path = os.path.join(d, "big-comment.yaml")
        with open(path, "wb") as fh:
            fh.write(b"#")
            chunk = b"x" * (1 << 20)
            for _ in range(BIG_COMMENT_BYTES >> 20):
                fh.write(chunk)
            fh.write(b"\nbeta: 0.1\n")
        _shared["big"] = path
        atexit.register(shutil.rmtree, d, True)
    return _shared["big"]


def alias_bomb(key: str) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    return "\n".join(lines + [f"{key}: *a8"]) + "\n"


def model_json(**change) -> str:
    cfg = dict(QWEN)
    for k, v in change.items():
        if v is _DROP:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return json.dumps(cfg)


def gemma3_json(**change) -> str:
    """The catalog's Gemma-3 config.json (sliding layers every `sliding_window_pattern`-th full) with `change`."""
    cfg = json.loads((REPO / "estimator" / "catalog" / "google--gemma-3-1b-it.json").read_text())
    return json.dumps(cfg | change)


_DROP = object()
NAN_JSON = model_json(hidden_size=1).replace('"hidden_size": 1', '"hidden_size": NaN')


# ---------------------------------------------------------------- the corpus


def _versions() -> list[Case]:
    bad = {
        "bang": "0.14aaaaaaaaaaaaaaaaaaaaaaaaaaaa!",
        "long": "1." + "1" * 5000,
        "unicode": "１.１６",
        "arabic-digits": "١.١٦",
        "control": "1.16\x1b[31m\r\n",
        "nul-less-bidi": "1.16\u202e61.1",
        "triple": "1.16.0.dev0+" + "x" * 300,
        "empty": "",
        "spaces": "   ",
        "negative": "-1.16",
        "future": "99.0",
        "before-0.14": "0.13",
    }
    out = []
    for name, v in bad.items():
        needle = "MAJOR.MINOR" if name not in ("future", "before-0.14") else "0.14 to 1.16"
        out.append(Case("versions", f"flag-{name}", ("--model", "0.5B", "--trl-version", v), needle=needle))
        out.append(
            Case(
                "versions",
                f"config-{name}",
                ("--model", "0.5B", "--config", "{tmp}/grpo.yaml"),
                files=(("grpo.yaml", f"trl_version: {json.dumps(v)}\n"),),
            )
        )
    for v in ("1.16", "0.14"):
        out.append(
            Case("versions", f"flag-ok-{v}", ("--model", "0.5B", "--trl-version", v), expect="accepted")
        )
    out.append(Case("versions", "transformers-bad", ("--model", "0.5B", "--transformers-version", "5.2\x00")))
    return out


def _files() -> list[Case]:
    kinds: dict[str, tuple[object, str]] = {  # name -> (file spec, expected)
        "dev-zero": (Special("link", "/dev/zero"), "refused"),
        "dev-urandom": (Special("link", "/dev/urandom"), "refused"),
        "fifo": (Special("fifo"), "refused"),
        "directory": (Special("dir"), "refused"),
        "symlink-loop": (Special("loop"), "refused"),
        "unreadable": (Special("unreadable", "beta: 0.1\n"), "refused"),
        "2MiB": (Special("zeros", 2 << 20), "refused"),
        "binary": (bytes(range(256)) * 4, "refused"),
        "invalid-utf8": (b"beta: 0.1\nmodel_name_or_path: caf\xe9\n", "refused"),
        "empty": ("", "refused"),
        "yaml-list": ("- a\n- b\n", "refused"),
        "json-number": ("42\n", "refused"),
        "nul-bytes": ("beta: 0.1\x00\n", "refused"),
        "bom-ok": ("\ufeffbeta: 0.1\n", "accepted"),
        "deep-flow-known-key": ("beta: " + "[" * 10000 + "]" * 10000 + "\n", "refused"),
        "deep-flow-unknown-key": ("foo: " + "{a: " * 10000 + "1" + "}" * 10000 + "\n", "refused"),
        # block nesting as deep as fits in the 1 MiB cap (10k levels of block YAML is 100 MB: refused by size)
        "deep-block-700": (
            "".join("  " * i + f"k{i}:\n" for i in range(700)) + "  " * 700 + "v: 1\n",
            "refused",
        ),
        "tab-indent": ("beta:\n\t0.1\n", "refused"),
    }
    out = []
    for name, (spec, expect) in kinds.items():
        skip = "running as root: permissions do not apply" if name == "unreadable" and AS_ROOT else ""
        out.append(
            Case(
                "files",
                f"config-{name}",
                ("--model", "0.5B", "--config", "{tmp}/grpo.yaml"),
                expect=expect,
                files=(("grpo.yaml", spec),),
                subprocess=name == "fifo",
                skip=skip,
            )
        )
    for name in (
        "dev-zero",
        "fifo",
        "directory",
        "symlink-loop",
        "unreadable",
        "2MiB",
        "binary",
        "invalid-utf8",
        "empty",
        "yaml-list",
        "json-number",
    ):
        spec, _ = kinds[name]
        skip = "running as root: permissions do not apply" if name == "unreadable" and AS_ROOT else ""
        out.append(
            Case(
                "files",
                f"model-{name}",
                ("--model", "{tmp}/m/config.json"),
                files=(("m/config.json", spec),),
                subprocess=name == "fifo",
                skip=skip,
            )
        )
        out.append(
            Case(
                "files",
                f"deepspeed_config_file-{name}",
                ("--model", "0.5B", "--config", "{tmp}/acc.yaml"),
                files=(
                    ("ds.json", spec),
                    (
                        "acc.yaml",
                        "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                        "  deepspeed_config_file: {tmp}/ds.json\n",
                    ),
                ),
                subprocess=name == "fifo",
                skip=skip,
            )
        )
    out.append(
        Case("files", "model-folder-without-config", ("--model", "{tmp}/m"), files=(("m/README.md", "hi\n"),))
    )
    out.append(
        Case(
            "files",
            "deepspeed_config_file-missing",
            ("--model", "0.5B", "--config", "{tmp}/acc.yaml"),
            files=(
                (
                    "acc.yaml",
                    "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: nope.json\n",
                ),
            ),
        )
    )
    out.append(
        Case(
            "files",
            "deepspeed_config_file-self",
            ("--model", "0.5B", "--config", "{tmp}/acc.yaml"),
            files=(
                (
                    "acc.yaml",
                    "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: {tmp}/acc.yaml\n",
                ),
            ),
        )
    )
    cyc = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: {tmp}/%s.yaml\n"
    out.append(
        Case(
            "files",
            "deepspeed_config_file-cycle",
            ("--model", "0.5B", "--config", "{tmp}/a.yaml"),
            files=(("a.yaml", cyc % "b"), ("b.yaml", cyc % "a")),
        )
    )
    out.append(
        Case(
            "files",
            "model-64MB",
            ("--model", "{tmp}/m/config.json"),
            files=(("m/config.json", Special("link", "@big")),),
        )
    )
    out.append(
        Case(
            "files",
            "reward-dev-urandom",
            ("--model", "0.5B", "--reward-model", "{tmp}/m/config.json"),
            files=(("m/config.json", Special("link", "/dev/urandom")),),
        )
    )
    out.append(
        Case(
            "files",
            "value-fifo",
            ("--model", "0.5B", "--value-model", "{tmp}/m/config.json"),
            files=(("m/config.json", Special("fifo")),),
            subprocess=True,
        )
    )
    out.append(
        Case(
            "files",
            "from-command-dev-zero",
            ("--model", "0.5B", "--from-command", "trl grpo --config /dev/zero"),
        )
    )
    # JSON nested deeper than Python's recursion limit: in a command's dict argument, a TRL YAML's dict field
    # given as a JSON string, and a whole JSON --config file
    deep = "[" * 40_000 + "]" * 40_000
    out.append(
        Case(
            "files",
            "from-command-deep-json-argument",
            ("--model", "0.5B", "--gpus", "1", "--from-command", f"trl grpo --model_init_kwargs '{deep}'"),
            needle="--model_init_kwargs '[[[",
        )
    )
    out.append(
        Case(
            "files",
            "config-deep-json-string-field",
            ("--model", "0.5B", "--config", "{tmp}/grpo.yaml"),
            files=(("grpo.yaml", f"model_init_kwargs: '{{\"a\": {deep}}}'\n"),),
            needle="model_init_kwargs",
        )
    )
    out.append(
        Case(
            "files",
            "config-json-100k-deep",
            ("--model", "0.5B", "--config", "{tmp}/grpo.json"),
            files=(("grpo.json", '{"beta": ' + "[" * 100_000 + "]" * 100_000 + "}"),),
            needle="not valid YAML/JSON",
        )
    )
    out.append(
        Case(
            "files",
            "from-command-fifo",
            ("--model", "0.5B", "--from-command", "accelerate launch --config_file {tmp}/f.yaml trl grpo"),
            files=(("f.yaml", Special("fifo")),),
            subprocess=True,
        )
    )
    out.append(
        Case("files", "config-64MB-comment", ("--model", "0.5B", "--config", "@big"), needle="at most")
    )
    # pasted blocks: read as bash reads them, or refused naming each command
    for name, block, expect, needle in (
        ("from-command-two-commands", "trl vllm-serve --model Q\ntrl grpo --model_name_or_path Q", "refused",
         "2 commands"),
        ("from-command-comment-ends-continuation", "accelerate launch \\\n # --use_peft \\\n trl grpo", "refused",
         "2 commands"),
        ("from-command-only-comments", "# a heading\n\n# nothing else\n", "refused", "names no command"),
        ("from-command-quote-never-closed", "trl grpo --system_prompt 'a\nb", "refused", "shell quoting"),
        ("from-command-another-trainer", "python -m openrlhf.cli.train_ppo_ray --pretrain Q", "refused",
         "OpenRLHF"),
        ("from-command-hub-kernel-unknown", "trl grpo --attn_implementation org/flash-mla-x", "refused",
         "Hub kernel"),
        ("from-command-crlf-continuation", "trl grpo --num_processes 1 \\\r\n --num_generations 4\r\n", "accepted", ""),
    ):  # fmt: skip
        out.append(
            Case("files", name, ("--model", "0.5B", "--from-command", block), expect=expect, needle=needle)
        )
    out.append(
        Case(
            "files",
            "accelerate-config-with-deepspeed-keys-on-top",
            ("--model", "0.5B", "--config", "{tmp}/acc.json"),
            files=(
                (
                    "acc.json",
                    '{"distributed_type": "MULTI_GPU", "num_processes": 2, "zero_optimization": {}}',
                ),
            ),
            needle="accelerate refuses unknown keys",
        )
    )
    # a DeepSpeed JSON without a zero_optimization section runs DeepSpeed's default, stage 0: not modelled
    out.append(
        Case(
            "files",
            "deepspeed-json-without-zero-section",
            ("--model", "0.5B", "--config", "{tmp}/ds.json"),
            files=(("ds.json", '{"bf16": {"enabled": "auto"}, "gradient_clipping": "auto"}'),),
            needle="zero_optimization.stage 0",
        )
    )
    for key in (
        "num_generations",
        "foo_unknown_key",
    ):  # a known key (refused) and an unknown one (a note, unread)
        out.append(
            Case(
                "files",
                f"alias-bomb-{key}",
                ("--model", "0.5B", "--config", "{tmp}/bomb.yaml"),
                files=(("bomb.yaml", alias_bomb(key)),),
                subprocess=True,
                expect="accepted" if key.startswith("foo") else "refused",
            )
        )
    out.append(
        Case(
            "files",
            "alias-bomb-accelerate-deepspeed_config",
            ("--model", "0.5B", "--config", "{tmp}/bomb.yaml"),
            files=(
                (
                    "bomb.yaml",
                    alias_bomb("deepspeed_config").replace(
                        "deepspeed_config:", "distributed_type: DEEPSPEED\ndeepspeed_config:"
                    ),
                ),
            ),
            subprocess=True,
        )
    )
    out.append(
        Case(
            "files",
            "alias-bomb-model_init_kwargs",
            ("--model", "0.5B", "--config", "{tmp}/bomb.yaml"),
            files=(("bomb.yaml", alias_bomb("model_init_kwargs")),),
            subprocess=True,
        )
    )
    out.append(
        Case(
            "files",
            "same-kind-twice",
            ("--model", "0.5B", "--config", "{tmp}/a.yaml", "--config", "{tmp}/b.yaml"),
            files=(("a.yaml", "beta: 0.1\n"), ("b.yaml", "beta: 0.2\n")),
        )
    )
    return out


def _model_json() -> list[Case]:
    contents = {
        "quant-string": model_json(quantization_config="gptq"),
        "quant-list": model_json(quantization_config=[1, 2]),
        "bits-four": model_json(quantization_config={"quant_method": "gptq", "bits": "four"}),
        "bits-huge": model_json(quantization_config={"quant_method": "gptq", "bits": 10**30}),
        "group-size-0": model_json(quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 0}),
        "hidden-size-huge": model_json(hidden_size=10**15),
        "layers-negative": model_json(num_hidden_layers=-3),
        "nan": NAN_JSON,
        "bool-for-int": model_json(num_attention_heads=True),
        "missing-model_type": model_json(model_type=_DROP),
        "unknown-model_type": model_json(model_type="bogus-arch\x1b[31m"),
        "text_config-not-object": model_json(text_config="qwen2"),
        "vocab-huge": model_json(vocab_size=2**64),
        "infinity": model_json(hidden_size=1).replace('"hidden_size": 1', '"hidden_size": Infinity'),
        "top-level-list": "[1, 2, 3]",
        "duplicate-keys-nested": '{"model_type": "qwen2", "model_type": {"a": 1}}',
    }
    out = []
    for name, text in contents.items():
        files = (("m/config.json", text),)
        out.append(Case("model-json", f"model-{name}", ("--model", "{tmp}/m/config.json"), files=files))
        out.append(
            Case(
                "model-json",
                f"reward-{name}",
                ("--model", "0.5B", "--reward-model", "{tmp}/m/config.json"),
                files=files,
            )
        )
        out.append(
            Case(
                "model-json",
                f"value-{name}",
                ("--model", "0.5B", "--value-model", "{tmp}/m/config.json@own:2"),
                files=files,
            )
        )
    for name in ("nan", "quant-list", "missing-model_type"):
        out.append(
            Case(
                "model-json",
                f"reference-folder-{name}",
                ("--model", "0.5B", "--reference-model", "{tmp}/m"),
                files=(("m/config.json", contents[name]),),
            )
        )
    # The fields that decide which layers keep a sliding window: name -> (config.json, the field the line names)
    windows = {
        "sliding_window-string": (model_json(sliding_window="abc"), "sliding_window = 'abc'"),
        "sliding_window-list": (model_json(sliding_window=[1]), "sliding_window = [1]"),
        "sliding_window-negative": (model_json(sliding_window=-4096), "sliding_window = -4096"),
        "sliding_window-zero": (model_json(sliding_window=0), "sliding_window = 0"),
        "sliding_window-float": (model_json(sliding_window=1.5), "sliding_window = 1.5"),
        "sliding_window-huge": (model_json(sliding_window=10**30), "sliding_window = 1000000"),
        "use_sliding_window-string": (model_json(use_sliding_window="no"), "use_sliding_window = 'no'"),
        "layer_types-int": (model_json(layer_types=5), "layer_types = 5"),
        "layer_types-string": (model_json(layer_types="full_attention"), "layer_types = 'full_attention'"),
        "layer_types-bogus": (model_json(layer_types=["bogus"] * 24), "layer_types entry 'bogus'"),
        "layer_types-short": (model_json(layer_types=["full_attention"] * 3), "layer_types has 3 entries"),
        "pattern-string": (gemma3_json(sliding_window_pattern="x"), "sliding_window_pattern = 'x'"),
        "pattern-negative": (gemma3_json(sliding_window_pattern=-1), "sliding_window_pattern = -1"),
        "pattern-zero": (gemma3_json(sliding_window_pattern=0), "sliding_window_pattern = 0"),
    }
    for name, (text, needle) in windows.items():
        files = (("m/config.json", text),)
        for role, argv in (
            ("model", ("--model", "{tmp}/m/config.json")),
            ("reward", ("--model", "0.5B", "--reward-model", "{tmp}/m/config.json")),
            ("value", ("--model", "0.5B", "--value-model", "{tmp}/m/config.json@own:1")),
        ):
            out.append(Case("model-json", f"{role}-{name}", argv, files=files, needle=needle))
    for name, text in {
        "layer_types-ok": model_json(layer_types=["sliding_attention", "full_attention"] * 12),
        "gemma3-pattern-ok": gemma3_json(sliding_window_pattern=2),
    }.items():
        files = (("m/config.json", text),)
        out.append(
            Case("model-json", name, ("--model", "{tmp}/m/config.json"), expect="accepted", files=files)
        )
    ok_name = model_json(_name_or_path="evil\n\x1b[31mRED\x1b[0m\r\u202ename")
    out.append(
        Case(
            "model-json",
            "name-with-escapes",
            ("--model", "{tmp}/m/config.json"),
            expect="accepted",
            files=(("m/config.json", ok_name),),
        )
    )
    out.append(
        Case(
            "model-json",
            "reward-name-with-escapes",
            ("--model", "0.5B", "--reward-model", "{tmp}/m/config.json", "--detail"),
            expect="accepted",
            files=(("m/config.json", ok_name),),
        )
    )
    return out


def _combinations() -> list[Case]:
    M = ("--model", "0.5B")
    rows = [
        (
            "vllm-tp3",
            ("--use-vllm", "--vllm-tensor-parallel-size", "3"),
            "refused",
            "--vllm-tensor-parallel-size 3",
        ),
        (
            "vllm-tp3-gpus4-fsdp",
            ("--use-vllm", "--vllm-tensor-parallel-size", "3", "--gpus", "4", "--fsdp"),
            "refused",
            "must divide",
        ),
        (
            "vllm-max-len-100",
            ("--model", "1.5B", "--use-vllm", "--vllm-max-model-length", "100"),
            "refused",
            "--vllm-max-model-length 100",
        ),
        ("trl014-chunked", ("--trl-version", "0.14", "--logprob-head", "chunked"), "refused", "chunked"),
        ("reward-own-65537", ("--reward-model", "0.5B@own:65537"), "refused", "65537"),
        ("reference-own-65537", ("--reference-model", "0.5B@own:65537"), "refused", "65537"),
        ("value-own-65537", ("--value-model", "0.5B@own:65537"), "refused", "65537"),
        ("reward-own-0", ("--reward-model", "0.5B@own:0"), "refused", ""),
        ("reward-own-empty-group", ("--reward-model", "0.5B@own=:2"), "refused", ""),
        ("reward-at-garbage", ("--reward-model", "0.5B@@@"), "refused", ""),
        # digits int() refuses though str.isdigit() holds for them
        ("reward-own-superscript", ("--reward-model", "0.5B@own:\u00b2"), "refused", "'0.5B@own:\\xb2'"),
        ("reward-own-circled", ("--reward-model", "0.5B@own:\u2460"), "refused", "'0.5B@own:\\u2460'"),
        ("value-own-group-superscript", ("--value-model", "0.5B@own=g:\u00b9"), "refused", "=g:\\xb9"),
        (
            "group-two-sizes",
            ("--reward-model", "0.5B@own=a:2", "--reference-model", "0.5B@own=a:3"),
            "refused",
            "GPU group 'a' is given two sizes: 2",
        ),
        ("roles-2000", ("--reward-model", *["0.5B"] * 2000), "refused", "2000 models beside the policy"),
        ("roles-64-ok", ("--gpu", "T4", "--reward-model", *["0.5B"] * 64), "accepted", ""),
        (
            "group-one-size-ok",
            (
                "--reward-model",
                "0.5B@own=a:2",
                "--reference-model",
                "0.5B@own=a",
                "--value-model",
                "0.5B@own=a:2",
            ),
            "accepted",
            "",
        ),
        # a denormal share is a number vLLM takes and then fails start-up with: the answer says so (see out_needle)
        ("vllm-util-denormal", ("--use-vllm", "--vllm-gpu-memory-utilization", "5e-324"), "accepted", ""),
        (
            "vllm-util-denormal-server",
            ("--use-vllm", "--vllm-mode", "server", "--vllm-server-utilization", "5e-324"),
            "accepted",
            "",
        ),
        ("gpus-65537", ("--gpus", "65537"), "refused", "65537"),
        ("zero3-one-gpu-offload-param-no-shard", ("--offload-param",), "refused", "--offload-param"),
        ("zero-and-fsdp", ("--zero", "3", "--fsdp"), "refused", ""),
        ("sleep-level-without-sleep", ("--use-vllm", "--vllm-sleep-level", "1"), "accepted", ""),
        ("num-generations-1", ("--num-generations", "1"), "refused", "--num-generations"),
        (
            "batch-not-divisible-by-gens",
            ("--per-device-train-batch-size", "3", "--num-generations", "4"),
            "refused",
            "",
        ),
        ("cpu-with-vllm", ("--device", "cpu", "--use-vllm"), "refused", ""),
        ("solve-without-gpu", ("--solve", "num_generations"), "refused", "--gpu"),
        ("gpu-unknown", ("--gpu", "H100\x1b[2J" + "x" * 500), "refused", ""),
        ("from-command-garbage", ("--from-command", "accelerate launch --config_file"), "refused", ""),
        ("from-command-unbalanced-quote", ("--from-command", "trl grpo --beta '0.1"), "refused", ""),
        # trl vllm-serve runs data parallel x tensor parallel GPUs; vLLM splits the 14 attention heads by TP
        (
            "vllm-server-1-gpu-tp2",
            ("--use-vllm", "--vllm-mode", "server", "--vllm-tensor-parallel-size", "2"),
            "refused",
            "--vllm-server-gpus 1",
        ),
        (
            "vllm-server-3-gpus-tp2",
            (
                "--use-vllm",
                "--vllm-mode",
                "server",
                "--vllm-server-gpus",
                "3",
                "--vllm-tensor-parallel-size",
                "2",
            ),
            "refused",
            "--vllm-server-gpus 3",
        ),
        (
            "vllm-tp4-14-heads",
            ("--use-vllm", "--gpus", "4", "--vllm-tensor-parallel-size", "4"),
            "refused",
            "14 attention heads",
        ),
        ("gpu-and-other-memory", ("--gpu", "H100", "--gpu-memory-gib", "200"), "refused", "--gpu-memory-gib"),
    ]
    out = [
        Case(
            "combinations",
            n,
            M + a,
            expect=e,
            needle=nd,
            out_needle="vLLM start-up" if "denormal" in n else "",
        )
        for n, a, e, nd in rows
    ]
    for name, ds, gpus in (
        ("ds-train-batch-64-gpus2", {"train_batch_size": 64}, "2"),
        ("ds-train-batch-negative", {"train_batch_size": -16}, "2"),
        ("ds-micro-0", {"train_micro_batch_size_per_gpu": 0}, "1"),
        ("ds-ga-string", {"gradient_accumulation_steps": "four"}, "1"),
        ("ds-stage-string", {"zero_optimization": {"stage": "3"}}, "1"),
        ("ds-zero-not-object", {"zero_optimization": [3]}, "1"),
    ):
        body = {"zero_optimization": {"stage": 2}, **ds}
        out.append(
            Case(
                "combinations",
                name,
                M + ("--gpus", gpus, "--config", "{tmp}/ds.json"),
                files=(("ds.json", json.dumps(body)),),
            )
        )
    huge = "x" * 100_000
    for flag in ("--gpus", "--beta", "--optim", "--dtype", "--format", "--solve", "--zero", "--use_peft"):
        out.append(Case("combinations", f"huge-value{flag}", M + (flag, huge), needle=flag.split("_")[0]))
    out.append(
        Case(
            "combinations",
            "lora-target-modules-escape-10k",
            M + ("--lora", "--lora-target-modules", "\x1b[2J" + "y" * 10_000),
            needle="--lora-target-modules \\x1b[2J",
        )
    )
    for detail in ((), ("--detail",)):  # a role group's name is the user's text: escaped in the layout
        out.append(
            Case(
                "combinations",
                "reward-group-escape" + "".join(detail),
                M + ("--reward-model", "0.5B@own=\x1b[2Jevil:2", *detail),
                expect="accepted",
                out_needle="\\x1b[2Jevil",
            )
        )
    out.append(
        Case(
            "combinations",
            "config-name-escape",
            M + ("--config", "{tmp}/acc\x1b[2J\n.yaml"),
            files=(("acc\x1b[2J\n.yaml", 'distributed_type: MULTI_GPU\nnum_processes: 2\nuse_cpu: "yes"\n'),),
            needle="acc\\x1b[2J\\n.yaml: use_cpu",
        )
    )
    for name, line in (
        ("acc-use-cpu-yes", 'use_cpu: "yes"'),
        ("acc-use-cpu-5", "use_cpu: 5"),
        ("acc-num-machines-0", "num_machines: 0"),
        ("acc-num-machines-two", "num_machines: two"),
    ):  # accelerate would read a truthy string as use_cpu True; a machine count is a positive integer
        out.append(
            Case(
                "combinations",
                name,
                M + ("--config", "{tmp}/acc.yaml"),
                files=(("acc.yaml", f"distributed_type: MULTI_GPU\nnum_processes: 2\n{line}\n"),),
                needle=line.split(":")[0],
            )
        )
    out.append(
        Case(
            "combinations",
            "ds-batch-vs-flag-gpus-via-accelerate",
            M + ("--config", "{tmp}/acc.yaml"),
            files=(
                ("ds.json", json.dumps({"train_batch_size": 7, "zero_optimization": {"stage": 2}})),
                (
                    "acc.yaml",
                    "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  deepspeed_config_file: {tmp}/ds.json\n",
                ),
            ),
        )
    )
    return out


def _alloc_conf() -> list[Case]:
    bad = [
        "roundup_power2_divisions:3",
        "large_segment_size_mb:0",
        ":",
        "expandable_segments:true",
        "max_split_size_mb:10",
        "max_split_size_mb:",
        ",",
        "max_split_size_mb",
        "max_split_size_mb:nan",
        "max_split_size_mb:1e309",
        "max_split_size_mb:" + "9" * 400,
        "garbage_collection_threshold:1.5",
        "garbage_collection_threshold:0",
        "expandable_segments:True,expandable_segments:False,bogus:1",
        "backend:cudaMallocAsyncX",
        "expandable_segments:\x1b[31mTrue",
        "roundup_power2_divisions:[>:3]",
        "roundup_power2_divisions:[" * 50,
        "max_split_size_mb:\u0663\u0660\u0660",  # Arabic-Indic digits: torch's std::isdigit takes ASCII only
        "large_segment_size_mb:\u0661\u0662",
        "roundup_power2_divisions:\u0664",
    ]
    out = [Case("alloc-conf", f"flag-{i}", ("--model", "0.5B", "--alloc-conf", v)) for i, v in enumerate(bad)]
    out += [
        Case(
            "alloc-conf",
            f"config-{i}",
            ("--model", "0.5B", "--config", "{tmp}/g.yaml"),
            files=(("g.yaml", f"pytorch_cuda_alloc_conf: {json.dumps(v)}\n"),),
        )
        for i, v in enumerate(bad[:6])
    ]
    for v in (
        "",
        "  ",
        "expandable_segments:True",
        "max_split_size_mb:128,roundup_power2_divisions:4",
    ):  # "" = unset
        out.append(Case("alloc-conf", f"ok-{v}", ("--model", "0.5B", "--alloc-conf", v), expect="accepted"))
    out.append(
        Case(
            "alloc-conf",
            "env-var-bad",
            ("--model", "0.5B"),
            expect="either",
            env=(("PYTORCH_CUDA_ALLOC_CONF", "roundup_power2_divisions:3"),),
            subprocess=True,
        )
    )
    return out


def _streams() -> list[Case]:
    rows = [
        ("stdout-closed", ">&-", "refused", "stdout is closed"),
        ("stdout-closed-json", ">&- --json", "refused", "stdout is closed"),
        ("dev-full", ">/dev/full", "refused", "No space left"),
        ("dev-full-detail", "--detail >/dev/full", "refused", "No space left"),
        ("dev-full-json", "--json >/dev/full", "refused", "No space left"),
        # a reader that left: no verdict (exit 3) and no error line, as a shell pipeline expects
        ("closed-pipe", "--detail | { exec 0<&-; sleep 0.5; }; exit ${PIPESTATUS[0]}", "pipe", ""),
        ("head-c1", "--detail | head -c1 >/dev/null; exit ${PIPESTATUS[0]}", "pipe", ""),
        ("stderr-closed-bad-input", "--gpus 0 2>&-", "refused-silent", ""),
        ("stderr-dev-full-bad-input", "--gpus 0 2>/dev/full", "refused-silent", ""),
        ("stdin-closed", "<&-", "accepted", ""),
        ("both-closed", ">&- 2>&-", "refused-silent", ""),
    ]
    out = []
    for name, shell, expect, needle in rows:
        code = 2 if "--gpus 0" in shell else 3
        out.append(
            Case(
                "streams",
                name,
                ("--model", "0.5B", "--dtype", "bfloat16"),
                expect=expect,
                shell=shell,
                needle=needle,
                code=code,
                subprocess=True,
            )
        )
    if not Path("/dev/full").exists():
        out = [c if "full" not in c.shell else _replace(c, skip="no /dev/full") for c in out]
    return out


NUMERIC_FLAGS = [
    "--lora-r",
    "--lora-dropout",
    "--per-device-train-batch-size",
    "--gradient-accumulation-steps",
    "--num-generations",
    "--max-completion-length",
    "--max-prompt-length",
    "--steps-per-generation",
    "--generation-batch-size",
    "--num-iterations",
    "--beta",
    "--vllm-gpu-memory-utilization",
    "--vllm-max-model-length",
    "--vllm-tensor-parallel-size",
    "--vllm-server-gpus",
    "--vllm-server-utilization",
    "--torch-empty-cache-steps",
    "--gpu-memory-gib",
    "--gpus",
    "--host-ram",
]
NUMBERS = {
    "0": "0",
    "-1": "-1",
    "1e309": "1e309",
    "nan": "nan",
    "inf": "inf",
    "2**64": str(2**64),
    "empty": "",
    "spaces": "  ",
    "unicode-digits": "\u0663",
}  # ARABIC-INDIC DIGIT THREE


def _number_expected(flag: str, text: str) -> str:
    """What the schema's own bounds (TRL's) say of the parsed value; never-finite and blank text is refused."""
    from estimator.settings.config import check_value, schema

    f = next(f for f in schema() if f.flag == flag)
    if not text.strip() or text.strip().lower() in ("nan", "inf", "1e309"):
        return "refused"
    if not text.isascii():  # int("\u0663") == 3 as in TRL's parser; 3 itself may clash with other settings
        return "either"
    value = float(text) if flag in FLOAT_FLAGS else int(text)  # int("\u0663") == 3, as TRL's parser reads it
    return "accepted" if check_value(f, value) is None else "refused"


FLOAT_FLAGS = {
    "--lora-dropout",
    "--beta",
    "--vllm-gpu-memory-utilization",
    "--vllm-server-utilization",
    "--gpu-memory-gib",
    "--host-ram",
}
_NEEDS = {  # flags that act only with another setting
    "--lora-r": ("--lora",),
    "--lora-dropout": ("--lora",),
    "--vllm-gpu-memory-utilization": ("--use-vllm",),
    "--vllm-max-model-length": ("--use-vllm",),
    "--vllm-tensor-parallel-size": ("--use-vllm",),
    "--vllm-server-gpus": ("--use-vllm", "--vllm-mode", "server"),
    "--vllm-server-utilization": ("--use-vllm", "--vllm-mode", "server"),
}


def _numbers() -> list[Case]:
    out = []
    for flag in NUMERIC_FLAGS:
        for label, text in NUMBERS.items():
            out.append(
                Case(
                    "numbers",
                    f"{flag}={label}",
                    ("--model", "0.5B", *_NEEDS.get(flag, ()), f"{flag}={text}", "--json"),
                    expect=_number_expected(flag, text),
                )
            )
    return out


def _typos() -> list[Case]:
    M = ("--model", "0.5B")
    flags = [
        "--per-device-train-batch-sise",
        "--num-generatoins",
        "--max-completion-lenght",
        "--use-vlm",
        "--gradient_acumulation_steps",
        "--betta",
        "--trl_verison",
        "--alloc-cnf",
    ]
    out = [Case("typos", f"flag{f}", M + (f, "3"), needle="did you mean") for f in flags]
    keys = [
        "per_device_train_batch_sise",
        "num_generation",
        "max_completion_lenght",
        "use_vlm",
        "betaa",
        "gradient_acumulation_steps",
    ]
    out += [
        Case(
            "typos",
            f"key-{k}",
            M + ("--config", "{tmp}/g.yaml"),
            files=(("g.yaml", f"{k}: 4\n"),),
            needle="did you mean",
        )
        for k in keys
    ]
    out.append(Case("typos", "choice-typo", M + ("--optim", "adamw_torch_fusd"), needle="adamw_torch_fused"))
    out.append(
        Case(
            "typos",
            "accelerate-key-typo",
            M + ("--config", "{tmp}/acc.yaml"),
            files=(
                (
                    "acc.yaml",
                    "distributed_type: DEEPSPEED\nnum_proceses: 2\ndeepspeed_config:\n  zero_stage: 2\n",
                ),
            ),
            needle="did you mean",
        )
    )
    out.append(
        Case(
            "typos",
            "ds-json-key-typo",
            M + ("--config", "{tmp}/ds.json"),
            files=(
                (
                    "ds.json",
                    json.dumps({"zero_optimisation": {"stage": 3}, "train_micro_batch_size_per_gpu": 2}),
                ),
            ),
            needle="did you mean",
        )
    )
    return out


def _environment() -> list[Case]:
    M = ("--model", "0.5B")
    out = [
        Case("environment", "home-unset", M, expect="accepted", env=(("HOME", None),), subprocess=True),
        Case(
            "environment",
            "home-read-only",
            M,
            expect="accepted",
            env=(("HOME", "{tmp}/ro"),),
            files=(("ro", Special("readonly-dir")),),
            subprocess=True,
        ),
        Case(
            "environment",
            "home-is-a-file",
            M,
            expect="accepted",
            env=(("HOME", "{tmp}/f"),),
            files=(("f", "x"),),
            subprocess=True,
        ),
        Case(
            "environment",
            "hf-offline-unknown",
            ("--model", "org/unknown-model"),
            env=(("HF_HUB_OFFLINE", "1"),),
            subprocess=True,
            needle="org/unknown-model",
        ),
        Case(
            "environment",
            "hf-home-garbage",
            ("--model", "org/unknown-model"),
            env=(("HF_HUB_OFFLINE", "1"), ("HF_HOME", "{tmp}/f"), ("HF_HUB_CACHE", "/dev/null/x")),
            files=(("f", "x"),),
            subprocess=True,
            needle="org/unknown-model",
        ),
    ]
    # A local HF cache whose snapshot config.json is not a small regular file: refused, never read without end
    snap = "hub/models--org--m/snapshots/abc/config.json"
    cache = (("HF_HUB_OFFLINE", "1"), ("HF_HUB_CACHE", "{tmp}/hub"))
    for name, spec, needle in (
        ("fifo", Special("fifo"), "(a FIFO)"),
        ("dev-zero", Special("link", "/dev/zero"), "(a device)"),
        ("directory", Special("dir"), "(a directory)"),
        ("5MiB", Special("zeros", 5 << 20), "4194304 bytes at most"),
    ):
        for role, argv in (
            ("model", ("--model", "org/m")),
            ("reward", ("--model", "0.5B", "--reward-model", "org/m")),
        ):
            out.append(
                Case(
                    "environment",
                    f"hf-cache-{role}-{name}",
                    argv,
                    env=cache,
                    files=((snap, spec),),
                    subprocess=True,
                    needle=needle,
                )
            )
    out.append(
        Case(
            "environment",
            "hf-cache-ok",
            ("--model", "org/m"),
            "accepted",
            files=((snap, model_json()),),
            env=cache,
        )
    )
    out += [
        Case(
            "environment",
            "lang-c-non-ascii-path",
            ("--model", "{tmp}/modèle/config.json"),
            expect="accepted",
            env=(("LANG", "C"), ("LC_ALL", "C"), ("PYTHONUTF8", "0"), ("PYTHONIOENCODING", None)),
            files=(("modèle/config.json", model_json()),),
            subprocess=True,
        ),
        Case(
            "environment",
            "lang-c-non-ascii-bad-config",
            ("--model", "0.5B", "--config", "{tmp}/é.yaml"),
            env=(("LANG", "C"), ("LC_ALL", "C"), ("PYTHONUTF8", "0"), ("PYTHONIOENCODING", None)),
            files=(("é.yaml", "beta: bétä\n"),),
            subprocess=True,
        ),
        Case(
            "environment",
            "lang-c-non-ascii-flag",
            ("--model", "mödel-ünknown"),
            env=(("LANG", "C"), ("LC_ALL", "C"), ("PYTHONUTF8", "0"), ("PYTHONIOENCODING", None)),
            subprocess=True,
        ),
        Case(
            "environment",
            "lang-c-name-with-escapes",
            ("--model", "{tmp}/m/config.json", "--detail"),
            expect="accepted",
            env=(("LANG", "C"), ("LC_ALL", "C"), ("PYTHONUTF8", "0"), ("PYTHONIOENCODING", None)),
            files=(("m/config.json", model_json(_name_or_path="é\u202e\x1b[31m")),),
            subprocess=True,
        ),
        Case(
            "environment", "columns-garbage", M, expect="accepted", env=(("COLUMNS", "-5"),), subprocess=True
        ),
        Case(
            "environment",
            "columns-huge",
            ("--model", "0.5B", "--help"),
            expect="accepted",
            env=(("COLUMNS", str(2**64)),),
            subprocess=True,
        ),
        Case("environment", "cwd-deleted-relative-config", M + ("--config", "g.yaml"), subprocess=True),
    ]
    if AS_ROOT:
        out = [
            _replace(c, skip="running as root: a read-only HOME is writable")
            if c.name == "home-read-only"
            else c
            for c in out
        ]
    return out


def _trace() -> list[Case]:
    rows = [
        ("trl-version-bang", ("--trl-version", "0.14aaaaaaaaaaaaaaaaaaaaaaaaaaaa!")),
        ("alloc-conf", ("--alloc-conf", "roundup_power2_divisions:3")),
        ("gpus-huge", ("--gpus", str(2**64))),
        ("beta-1e309", ("--beta", "1e309")),
        ("num-generations-spaces", ("--num-generations", "  ")),
        ("flag-typo", ("--num-generatoins", "4")),
        ("model-fifo", ("--model", "{tmp}/m/config.json")),
        ("model-nan-json", ("--model", "{tmp}/n/config.json")),
        ("vllm-tp3", ("--use-vllm", "--vllm-tensor-parallel-size", "3")),
        ("control-chars", ("--model", "x\x1b[31m\r\ny")),
        ("unicode-digit", ("--num-generations", "\u0664")),  # int() reads it as 4; flags take ASCII digits
    ]
    files = (("m/config.json", Special("fifo")), ("n/config.json", NAN_JSON))
    out = []
    for name, argv in rows:
        ok = name.endswith(
            "-ok"
        )  # in-process with the trace stubbed out; the refusals run `python -m sweeps.trace`
        out.append(
            Case(
                "trace",
                f"one-{name}",
                ("one", *argv),
                expect="accepted" if ok else "refused",
                files=files,
                prog="grpo-vram-trace",
                needle={"flag-typo": "did you mean", "unicode-digit": "invalid integer"}.get(name, ""),
                subprocess=not ok,
            )
        )
    rows_files = (
        ("zero.jsonl", Special("link", "/dev/zero")),
        ("fifo.jsonl", Special("fifo")),
        ("dir.jsonl", Special("dir")),
        ("bin.jsonl", bytes(range(256)) * 4),
        ("list.jsonl", "[1, 2]\n"),
        ("empty.jsonl", ""),
    )
    others = [
        ("retrace-dev-zero", ("retrace", "--tag", "x", "{tmp}/zero.jsonl")),
        ("retrace-fifo", ("retrace", "--tag", "x", "{tmp}/fifo.jsonl")),
        ("retrace-directory", ("retrace", "--tag", "x", "{tmp}/dir.jsonl")),
        ("retrace-binary", ("retrace", "--tag", "x", "{tmp}/bin.jsonl")),
        ("retrace-json-list-row", ("retrace", "--tag", "x", "{tmp}/list.jsonl")),
        ("retrace-missing", ("retrace", "--tag", "x", "{tmp}/nope.jsonl")),
        # a --where value that is not JSON is compared as text (sweeps/trace/retrace.py): good input
        ("retrace-where-text-ok", ("retrace", "--tag", "x", "--where", "beta=[", "{tmp}/empty.jsonl")),
        ("retrace-timeout-nan", ("retrace", "--tag", "x", "--timeout", "nan", "{tmp}/empty.jsonl")),
        ("grid-bogus-escape", ("grid", "bogus\x1b[2J")),
        ("grid-timeout-nan", ("grid", "smoke", "--timeout", "nan")),
        ("grid-timeout-negative", ("grid", "smoke", "--timeout", "-1")),
        ("grid-limit-negative", ("grid", "smoke", "--limit", "-1")),
        ("grid-out-directory", ("grid", "smoke", "--out", "{tmp}/dir.jsonl", "--limit", "1")),
        ("no-subcommand-typo", ("oen", "--model", "0.5B")),
    ]
    for name, argv in others:
        expect = "accepted" if name.endswith("-ok") else "refused"
        out.append(
            Case(
                "trace", name, argv, expect=expect, files=rows_files, prog="grpo-vram-trace", subprocess=True
            )
        )
    return out


def _replace(case: Case, **kw) -> Case:
    from dataclasses import replace

    return replace(case, **kw)


def corpus() -> list[Case]:
    cases = (
        _versions()
        + _files()
        + _model_json()
        + _combinations()
        + _alloc_conf()
        + _streams()
        + _numbers()
        + _typos()
        + _environment()
        + _trace()
    )
    return [_replace(c, defect=KNOWN_DEFECTS.get(c.id, c.defect)) for c in cases]


# Cases that fail because of a known defect in the estimator or the tracer: id -> the defect. The test marks them
# xfail(strict=True): a fix makes them pass, and then the entry must go. Empty: every case is clean.
KNOWN_DEFECTS: dict[str, str] = {}


# ---------------------------------------------------------------- running a case


def _make_files(case: Case, tmp: str) -> None:
    for rel, spec in case.files:
        path = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if isinstance(spec, Special):
            if spec.kind == "fifo":
                os.mkfifo(path)
            elif spec.kind == "dir":
                os.makedirs(path, exist_ok=True)
            elif spec.kind == "readonly-dir":
                os.makedirs(path, exist_ok=True)
                os.chmod(path, 0o555)
            elif spec.kind == "loop":
                os.symlink(path + ".other", path)
                os.symlink(path, path + ".other")
            elif spec.kind == "link":
                os.symlink(big_comment_file() if spec.arg == "@big" else str(spec.arg), path)
            elif spec.kind == "unreadable":
                Path(path).write_text(str(spec.arg))
                os.chmod(path, 0)
            elif spec.kind == "zeros":
                with open(path, "wb") as fh:
                    fh.write(b"#" + b"x" * (int(spec.arg) - 2) + b"\n")
            else:
                raise ValueError(spec.kind)
        elif isinstance(spec, bytes):
            Path(path).write_bytes(spec)
        else:
            Path(path).write_text(spec.replace("{tmp}", tmp), encoding="utf-8")


def _argv(case: Case, tmp: str) -> list[str]:
    return [big_comment_file() if a == "@big" else a.replace("{tmp}", tmp) for a in case.argv]


class _Hang(BaseException):
    pass


def _run_in_process(case: Case, argv: list[str]) -> tuple[object, str, str, str]:
    """(exit code, stdout, stderr, traceback text or '') with an alarm-based timeout."""
    import traceback

    if case.prog == "grpo-vram-trace":
        from sweeps.trace import cli as trace_cli

        def main(a):
            saved = trace_cli.make_row, trace_cli._print_row
            trace_cli.make_row = lambda cfg, sweep: {"status": "ok", "config": cfg.to_dict()}
            trace_cli._print_row = lambda row: None
            try:
                return trace_cli.main(a)
            finally:
                trace_cli.make_row, trace_cli._print_row = saved
    else:
        from estimator.interface.cli import main

    out, err = io.StringIO(), io.StringIO()

    def on_alarm(signum, frame):
        raise _Hang()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, TIMEOUT_S)
    tb = ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
            except _Hang:
                code = "hang"
            except Exception:
                code, tb = "traceback", traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return code, out.getvalue(), err.getvalue(), tb


def _limit_memory() -> None:
    """A case that reads /dev/zero into memory fails at 4 GiB instead of taking the machine."""
    import resource

    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def _run_subprocess(case: Case, argv: list[str], tmp: str) -> tuple[object, str, str, str]:
    env = {k: v for k, v in os.environ.items()}
    env["PYTHONPATH"] = str(REPO)
    env.setdefault("HF_HUB_OFFLINE", "1")
    for k, v in case.env:
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v.replace("{tmp}", tmp)
    module = "estimator.interface.cli" if case.prog == "vram-estimate" else "sweeps.trace"
    cmd = [sys.executable, "-m", module, *argv]
    cwd = str(REPO)
    if case.name == "cwd-deleted-relative-config":
        cwd = os.path.join(tmp, "gone")
        os.makedirs(cwd)
        shell = f"cd {shlex.quote(cwd)} && rmdir {shlex.quote(cwd)} && exec {shlex.join(cmd)}"
        run = ["bash", "-c", shell]
        cwd = tmp
    elif case.shell:
        run = ["bash", "-c", shlex.join(cmd) + " " + case.shell]
    else:
        run = cmd
    try:
        done = subprocess.run(
            run,
            capture_output=True,
            env=env,
            cwd=cwd,
            timeout=TIMEOUT_S * 3,
            stdin=subprocess.DEVNULL,
            preexec_fn=_limit_memory,
        )
    except subprocess.TimeoutExpired:
        return "hang", "", "", ""
    err = done.stderr.decode("utf-8", "replace")
    tb = err if "Traceback (most recent call last)" in err else ""
    return done.returncode, done.stdout.decode("utf-8", "replace"), err, tb


def _unclean(line: str) -> str:
    if len(line) > MAX_LINE:
        return f"line of {len(line)} chars (> {MAX_LINE})"
    bad = [ch for ch in line if unicodedata.category(ch).startswith("C")]
    if bad:
        return f"unescaped control/format characters {bad[:3]!r}"
    return ""


def classify(case: Case) -> Result:
    if case.skip:
        return Result("skipped", detail=case.skip)
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        try:
            _make_files(case, tmp)
            argv = _argv(case, tmp)
            if case.subprocess or case.shell or case.env:
                code, out, err, tb = _run_subprocess(case, argv, tmp)
            else:
                code, out, err, tb = _run_in_process(case, argv)
        finally:
            for root, dirs, _ in os.walk(tmp):  # a read-only dir blocks the cleanup
                for d in dirs:
                    with contextlib.suppress(OSError):
                        os.chmod(os.path.join(root, d), 0o755)
    prog = case.prog
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if not ln.startswith(f"{prog}: note: ")]
    if code == "hang":
        return Result("hang", code, "no answer in time", lines[-3:])
    if tb or code == "traceback" or any("Traceback" in ln for ln in lines):
        last = (tb or err).strip().splitlines()[-1:] if (tb or err).strip() else []
        return Result("traceback", code, last[0] if last else "", lines[-3:])
    if code is None:
        code = 0
    refused_codes = (case.code,) if case.expect != "either" else (2, 3)
    if case.expect == "pipe":  # the reader left: no verdict, or the answer got out first; never an error line
        ok = code in (0, 3) and not errors
        return Result("clean-refused" if ok else "refused-unclear", code, "" if ok else f"exit {code}", lines)
    if case.expect == "refused-silent":  # stderr itself unusable: only the exit code can speak
        ok = code == case.code and not tb
        return Result("clean-refused" if ok else "refused-unclear", code, "" if ok else f"exit {code}", lines)
    if code in (0, 1):
        if case.expect == "refused":
            return Result("accepted-wrong", code, f"exit {code}", lines)
        if errors:
            return Result(
                "refused-unclear", code, f"non-note stderr on exit {code}: {errors[0][:200]!r}", lines
            )
        if "--json" in argv and code in (0, 1) and out:
            try:
                json.loads(out, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
            except ValueError as exc:
                return Result("accepted-wrong", code, f"JSON output: {exc}", lines)
        if case.out_needle and case.out_needle not in out:
            return Result("accepted-wrong", code, f"the answer lacks {case.out_needle!r}", lines)
        bad_out = _unclean_output(out)
        if bad_out:
            return Result("accepted-wrong", code, bad_out, lines)
        return Result("clean-accepted", code, "", lines)
    if code in refused_codes or code in (2, 3):
        if len(errors) != 1 or len(lines) != len(errors) + sum(
            ln.startswith(f"{prog}: note: ") for ln in lines
        ):
            return Result("refused-unclear", code, f"{len(errors)} error lines", lines[:3])
        line = errors[0]
        if not line.startswith(f"{prog}: error: "):
            return Result("refused-unclear", code, f"not '{prog}: error:': {line[:200]!r}", lines)
        why = _unclean(line)
        if why:
            return Result("refused-unclear", code, why, [line[:300]])
        if case.expect == "accepted":
            return Result("refused-wrong", code, line[:200], [line[:300]])
        if case.needle and case.needle not in line:
            return Result("refused-unclear", code, f"the line lacks {case.needle!r}", [line[:300]])
        if code not in refused_codes:
            return Result("refused-unclear", code, f"exit {code}, expected {refused_codes}", [line[:300]])
        if case.expect == "accepted":
            return Result("refused-wrong", code, line[:200], [line[:300]])
        return Result("clean-refused", code, "", [line[:300]])
    return Result("refused-unclear", code, f"exit {code}", lines[:3])


def _unclean_output(out: str) -> str:
    bad = {ch for ch in out if ch not in "\n\t" and unicodedata.category(ch) in ("Cc", "Cf")}
    return f"raw control/format characters {sorted(bad)[:3]!r} in stdout" if bad else ""


def expected_outcomes(case: Case) -> tuple[str, ...]:
    return {
        "refused": ("clean-refused",),
        "refused-silent": ("clean-refused",),
        "accepted": ("clean-accepted",),
        "either": ("clean-refused", "clean-accepted"),
        "pipe": ("clean-refused",),
    }[case.expect]


def run_all(cases: list[Case] | None = None, progress=None) -> list[tuple[Case, Result]]:
    results = []
    for case in cases or corpus():
        r = classify(case)
        results.append((case, r))
        if progress:
            progress(case, r)
    return results


def counts(results: list[tuple[Case, Result]]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for case, r in results:
        row = table.setdefault(case.cls, {"tried": 0, "clean": 0, **{o: 0 for o in OUTCOMES}, "skipped": 0})
        if r.outcome == "skipped":
            row["skipped"] += 1
            continue
        row["tried"] += 1
        row[r.outcome] += 1
        if r.outcome in expected_outcomes(case):
            row["clean"] += 1
    return table


if __name__ == "__main__":  # quick look: python tests/contracts/hostile_inputs.py [CLASS]
    only = sys.argv[1:]
    for c, r in run_all([c for c in corpus() if not only or c.cls in only]):
        if r.outcome not in expected_outcomes(c):
            print(f"{c.id}: {r.outcome} ({r.code}) {r.detail} {r.err[:2]}")
    print("done")
