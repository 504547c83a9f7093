"""The web page (web/, built by `make web` into build/web/) in a real browser: headless Chromium drives it.

For each case the page is given a URL hash (its form state) and the CLI is run in-process on the command line
that state stands for, written out here by hand (so the page's form -> argv mapping is checked too). The page's
answer must be the CLI's JSON exactly, the JSON it displays too, its verdict line the one the CLI's text report
prints, its fits table the CLI's bytes in GiB as the CLI prints them; a refused input shows the CLI's one-line
error. Every request must stay on 127.0.0.1 (the page vendors Pyodide; the driver aborts and records any other).

In the browser no upstream package is installed, so the CLI models the newest releases it knows; the in-process
CLI is run the same way (package metadata hidden), else an installed transformers 5.23 would change the numbers.

Skips, with the reason, where Chromium, node, the driver (web/node_modules) or the built site is missing.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import threading
import urllib.parse
from pathlib import Path

import cli_json  # the in-process CLI (its `cli` module) the other tests use too
import pytest

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "build" / "web"
DRIVER = REPO / "web" / "drive.mjs"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
TIMING_OUT = REPO / "build" / "web-first-answer.json"  # the measured times (git-ignored); see benchmarks/
GIB = 2**30


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


GRPO_YAML = (REPO / "examples" / "case5_trl_user_files" / "grpo.yaml").read_text()
ACCELERATE_YAML = (REPO / "examples" / "case5_trl_user_files" / "accelerate_zero3.yaml").read_text()
ZERO3_JSON = (REPO / "examples" / "case5_trl_user_files" / "zero3.json").read_text()
BAD_YAML = "per_device_train_batch_size: [4\n"  # an unclosed list
# a GPTQ checkpoint's config.json, pasted into the page's model box
GPTQ_CONFIG = (
    REPO / "examples" / "case1_gptq_qlora_vllm_colocate" / "Qwen2.5-7B-Instruct-GPTQ-Int4.config.json"
).read_text()

# (URL hash the page is given, the vram-estimate flags that state stands for, files in the CLI's folder)
# The page adds --advice unless advice=0 (its checkbox is on by default).
LORA = "--use-peft --no-load-in-4bit"
CASES = [
    ("model=7B&method=lora&gpu=A10G", f"--model 7B {LORA} --gpu A10G", {}),
    (
        "model=Qwen%2FQwen3-8B&method=qlora&gens=16&bs=16&completion=1024&gpu=A100-40",
        "--model Qwen/Qwen3-8B --qlora --num-generations 16 --max-completion-length 1024 "
        "--per-device-train-batch-size 16 --gpu A100-40",
        {},
    ),
    (
        "model=meta-llama%2FLlama-3.1-8B-Instruct&method=full&dtype=bfloat16&ckpt=off&optim=adamw_bnb_8bit"
        "&bs=4&ga=2&gpu=H100",
        "--model meta-llama/Llama-3.1-8B-Instruct --no-use-peft --no-load-in-4bit --dtype bfloat16 "
        "--no-gradient-checkpointing --optim adamw_bnb_8bit --per-device-train-batch-size 4 "
        "--gradient-accumulation-steps 2 --gpu H100",
        {},
    ),
    (
        "model=1.5B&method=lora&lora_r=64&targets=all-linear&beta=0.04&prompt=512&completion=2048&gpu=L4",
        f"--model 1.5B {LORA} --lora-r 64 --lora-target-modules all-linear --beta 0.04 "
        "--max-prompt-length 512 --max-completion-length 2048 --gpu L4",
        {},
    ),
    (
        "model=7B&method=lora&vllm=colocate&vutil=0.4&gpu=H100",
        f"--model 7B {LORA} --use-vllm --vllm-mode colocate --vllm-gpu-memory-utilization 0.4 --gpu H100",
        {},
    ),
    (  # vLLM's 0.3 share cannot hold its own bf16 weights: the plan lets it start
        "model=7B&method=lora&dtype=bfloat16&vllm=colocate&vutil=0.3&bs=2&gens=2&gpu=A100-40",
        f"--model 7B {LORA} --dtype bfloat16 --use-vllm --vllm-mode colocate --vllm-gpu-memory-utilization 0.3 "
        "--num-generations 2 --per-device-train-batch-size 2 --gpu A100-40",
        {},
    ),
    (
        "model=7B&method=lora&vllm=server&vsgpus=1&vsutil=0.8&gpus=2&gpu=H100",
        f"--model 7B {LORA} --use-vllm --vllm-mode server --vllm-server-gpus 1 --vllm-server-utilization 0.8 "
        "--gpus 2 --gpu H100",
        {},
    ),
    (
        "model=32B&method=full&dtype=bfloat16&gpus=4&sharding=zero3&gpu=A100-80",
        "--model 32B --no-use-peft --no-load-in-4bit --dtype bfloat16 --gpus 4 --sharding zero3 --gpu A100-80",
        {},
    ),
    (
        "model=3B&method=lora&gpu=A100-40&solve=num_generations",
        f"--model 3B {LORA} --gpu A100-40 --solve num_generations",
        {},
    ),
    (  # the accelerate YAML names its DeepSpeed JSON by a relative path: the page puts the file there
        f"gpu=H100&file%3Agrpo.yaml={b64(GRPO_YAML)}&file%3Aaccelerate_zero3.yaml={b64(ACCELERATE_YAML)}"
        f"&near%3Azero3.json={b64(ZERO3_JSON)}",
        "--gpu H100 --config grpo.yaml --config accelerate_zero3.yaml",
        {
            "grpo.yaml": GRPO_YAML,
            "accelerate_zero3.yaml": ACCELERATE_YAML,
            "examples/case5_trl_user_files/zero3.json": ZERO3_JSON,
        },
    ),
    (
        f"modelcfg={b64(GPTQ_CONFIG)}&method=lora&gpu=L4",
        f"--model model/config.json {LORA} --gpu L4",
        {"model/config.json": GPTQ_CONFIG},
    ),
    (
        "model=0.5B&gpu=A100-40&advice=0&extra=--reward-model+0.5B+--trl-version+0.19",
        "--model 0.5B --gpu A100-40 --reward-model 0.5B --trl-version 0.19",
        {},
    ),
    ("model=14B&method=lora&advice=0", f"--model 14B {LORA}", {}),
]
# refused inputs: the page shows the CLI's one error line
FAILING = [
    ("model=llama-9b", "--model llama-9b", {}),
    ("model=some-org%2Fsome-model", "--model some-org/some-model", {}),  # a Hub id: no fetch from the page
    ("model=7B&gens=1", "--model 7B --num-generations 1", {}),
    (f"file%3Abad.yaml={b64(BAD_YAML)}", "--config bad.yaml", {"bad.yaml": BAD_YAML}),
]
# a user at the form: from a link's state, fields typed / chosen in order; the URL hash must follow the form
TYPED = {
    "start": "model=1.5B",
    "fill": [
        ["advice", "0"],
        ["method", "lora"],
        ["gens", "16"],
        ["bs", "16"],
        ["vllm", "colocate"],
        ["vutil", "0.5"],
        ["gpu", "L4"],
    ],
}
TYPED_FLAGS = (
    f"--model 1.5B {LORA} --use-vllm --vllm-mode colocate --vllm-gpu-memory-utilization 0.5 "
    "--num-generations 16 --per-device-train-batch-size 16 --gpu L4"
)
TYPED_STATE = {
    "model": "1.5B",
    "method": "lora",
    "gens": "16",
    "bs": "16",
    "vllm": "colocate",
    "vutil": "0.5",
    "gpu": "L4",
    "advice": "0",
}
FIRST = ("", "", {})  # the page as first opened: every field empty, the CLI's defaults


def _skip_reason() -> str | None:
    if not (SITE / "index.html").is_file() or not (SITE / "estimator.zip").is_file():
        return f"{SITE.relative_to(REPO)}/ not built: run `make web`"
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set CHROMIUM=/path/to/chromium)"
    if shutil.which("node") is None:
        return "node not found (the browser driver runs on node)"
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    if int(node.lstrip("v").split(".")[0] or 0) < 20:
        return f"node {node}: the driver (playwright-core) needs node 20 or newer"
    if not (REPO / "web" / "node_modules" / "playwright-core").is_dir():
        return "web/node_modules/playwright-core missing: run `make web` (npm ci in web/)"
    return None


class _Quiet(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".mjs": "text/javascript",
        ".wasm": "application/wasm",
    }

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def driven(tmp_path_factory):
    """Serve build/web on 127.0.0.1 and drive every case through one page load; meanwhile run the CLI in-process
    on every case's command line (the browser and the CLI each take one core). The driver's JSON report, with
    `cli(argv, files)` -> (code, stdout, stderr) added."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(SITE)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    tmp = tmp_path_factory.mktemp("web")
    job = tmp / "job.json"
    job.write_text(
        json.dumps(
            {
                "url": base + "index.html",
                "first_hash": FIRST[0],
                "cases": [c[0] for c in CASES + FAILING] + [TYPED],
                "chromium": CHROMIUM,
                "timeout_ms": 60000,
            }
        )
    )
    cli = _InProcessCli(tmp)
    try:
        proc = subprocess.Popen(
            ["node", str(DRIVER), str(job)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        try:
            for _, flags, files in CASES:
                code, out, _ = cli([*flags.split(), "--advice", "--json"], files)
                cli([*flags.split(), "--json"], files)
                if code in (0, 1) and "target" in json.loads(out):
                    cli([*flags.split(), "--advice"], files)
                    cli(flags.split(), files)
            for _, flags, files in FAILING:
                cli([*flags.split(), "--advice", "--json"], files)
            cli(TYPED_FLAGS.split() + ["--json"], {})
            cli(TYPED_FLAGS.split(), {})
            cli(["--advice", "--json"], {})
            stdout, stderr = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        server.shutdown()
    assert proc.returncode == 0, stderr[-3000:]
    report = json.loads(stdout)
    assert "error" not in report, report["error"]
    assert "bootError" not in report["first"], report["first"]["bootError"]
    report["base"] = base
    report["cli"] = cli
    return report


class _InProcessCli:
    """The CLI in-process as the page runs it: in a fresh folder holding the case's files, with no upstream
    package installed (package metadata hidden); answers are kept, so each command line runs once."""

    def __init__(self, tmp: Path):
        self.tmp, self.done = tmp, {}

    def __call__(self, argv: list[str], files: dict) -> tuple[int, str, str]:
        key = (tuple(argv), tuple(sorted(files.items())))
        if key not in self.done:
            folder = self.tmp / f"run{len(self.done)}"
            folder.mkdir()
            for name, text in files.items():
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_text(text)
            out, err = io.StringIO(), io.StringIO()
            with (
                pytest.MonkeyPatch.context() as m,
                contextlib.redirect_stdout(out),
                contextlib.redirect_stderr(err),
            ):
                m.chdir(folder)
                m.setattr(importlib.metadata, "version", _no_upstream_installed)
                m.setenv("HF_HUB_OFFLINE", "1")
                code = cli_json.cli.main(argv)
            self.done[key] = (code, out.getvalue(), err.getvalue())
        return self.done[key]


def _no_upstream_installed(name):
    raise importlib.metadata.PackageNotFoundError(name)


def gib2(n: int) -> str:
    return f"{n / GIB:.2f}"


def check_answer(page, cli, flags, files, advice):
    """The page's answer against the CLI's, run in-process on `flags` (+ --advice when the page's box is on)."""
    advice = ["--advice"] if advice else []
    code, out, err = cli([*flags, *advice, "--json"], files)
    assert code in (0, 1), err
    want = json.loads(out)
    assert page["code"] == code, page["stderr"]
    assert page["data"] == want  # the JSON the page computed: the CLI's, exactly
    assert json.loads(page["dom"]["json"]) == want  # and the JSON it displays
    assert page["stderr"] == err  # the notes
    # the fits table: the CLI's bytes in GiB, as the CLI prints them
    rows = {r[0]: r for r in page["dom"]["fits"]}
    assert set(rows) == {f["gpu"] for f in want["fits"]}
    for f in want["fits"]:
        shown = rows[f["gpu"]]
        free = f["free_bytes"]
        amount = f"+{gib2(free)} GiB free" if free >= 0 else f"-{gib2(-free)} GiB missing"
        assert shown[1] == f"{gib2(f['usable_bytes'])} GiB" and shown[2] == amount
        assert shown[3].startswith("✓" if f["fits"] else "✗")
    # the verdict line first: the CLI's own first line (its text answer wraps it at 80 columns)
    tcode, text, _ = cli([*flags, *advice], files)
    assert tcode == code
    assert page["dom"]["verdict"] == want["verdict"]
    assert " ".join(text.split()).startswith(" ".join(want["verdict"].split()))
    if "advice" in want:
        a = want["advice"]
        assert len(page["shown"]["advice"]["items"]) == len(a["singles"])
        # where vLLM fails at start-up, each change says whether vLLM then starts, and a plan is shown
        if a.get("baseline_starts") is False:
            for item, o in zip(page["shown"]["advice"]["items"], a["singles"], strict=True):
                assert ("(vLLM starts)" in item) == o["starts"], item
            assert page["shown"]["advice"]["plan"].startswith("smallest set that fits: ")
    else:
        assert page["shown"]["advice"] is None


@pytest.mark.parametrize("i", range(len(CASES)), ids=[c[0][:60] for c in CASES])
def test_page_answers_with_the_cli_numbers(driven, i):
    hash_, flags, files = CASES[i]
    check_answer(driven["cases"][i], driven["cli"], flags.split(), files, "advice=0" not in hash_)


def test_form_typed_answers_and_goes_into_the_link(driven):
    page = driven["cases"][len(CASES) + len(FAILING)]
    state = {k: v[0] for k, v in urllib.parse.parse_qs(page["hash"].lstrip("#")).items()}
    assert state == TYPED_STATE
    check_answer(page, driven["cli"], TYPED_FLAGS.split(), {}, False)


@pytest.mark.parametrize("i", range(len(FAILING)), ids=[c[0][:40] for c in FAILING])
def test_refused_input_shows_the_cli_error_line(driven, i):
    _, flags, files = FAILING[i]
    flags = flags.split()
    page = driven["cases"][len(CASES) + i]
    code, out, err = driven["cli"]([*flags, "--advice", "--json"], files)
    assert code == 2 and out == ""
    line = [ln for ln in err.splitlines() if ln.startswith("vram-estimate: error: ")]
    assert len(line) == 1, err
    assert page["code"] == 2
    assert page["dom"]["error"] == line[0]
    assert page["dom"]["verdict"] is None


def test_first_answer_is_the_cli_default(driven):
    code, out, err = driven["cli"](["--advice", "--json"], {})
    first = driven["first"]
    assert first["data"] == json.loads(out)
    t = first["timing"]
    TIMING_OUT.write_text(json.dumps({k: round(v) for k, v in t.items()} | {"browser": "headless Chromium"}))
    print(
        f"\nweb page, measured here: Python ready {t['pyodide_ms'] / 1000:.2f} s, first answer "
        f"{t['first_answer_ms'] / 1000:.2f} s after navigation; later answers "
        + ", ".join(f"{c['ms']:.0f}" for c in driven["cases"] if "ms" in c)
        + " ms"
    )
    assert t["first_answer_ms"] < 60000


def test_no_request_leaves_localhost(driven):
    assert driven["left"] == []
    assert driven["requests"], "the driver saw no request at all"
    assert all(u.startswith(driven["base"]) or u.startswith(("data:", "blob:")) for u in driven["requests"])
    assert not [c for c in driven["console"] if c.startswith("pageerror")], driven["console"]
