"""Result rows: stable keys, atomic appends that survive a killed writer, tolerant loading."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sweeps import records

REPO = Path(__file__).resolve().parents[2]


def test_make_key_is_sha256_of_canonical_json():
    config = {"model": "tiny-2M", "beta": 0.0, "lora_target_modules": None}
    variant = {"steps": 2}
    text = '{"config":{"beta":0.0,"lora_target_modules":null,"model":"tiny-2M"},"variant":{"steps":2}}'
    assert records.make_key(config, variant) == hashlib.sha256(text.encode()).hexdigest()[:16]


def test_make_key_ignores_order_but_not_values():
    a = records.make_key({"x": 1, "y": [1, 2]}, {"s": 2, "p": "gsm8k"})
    b = records.make_key({"y": [1, 2], "x": 1}, {"p": "gsm8k", "s": 2})
    assert a == b
    assert a != records.make_key({"x": 2, "y": [1, 2]}, {"s": 2, "p": "gsm8k"})
    assert a != records.make_key({"x": 1, "y": [1, 2]}, {"s": 3, "p": "gsm8k"})


def test_load_rows_skips_partial_trailing_line_and_append_repairs_it(tmp_path):
    path = tmp_path / "r.jsonl"
    records.append_row(path, {"schema": 1, "key": "a", "n": 1})
    with open(path, "a") as f:
        f.write('{"schema": 1, "key": "b", "n"')  # a writer died mid-line (not ours: ours rewrite atomically)
    assert [r["key"] for r in records.load_rows(path)] == ["a"]
    records.append_row(path, {"schema": 1, "key": "c", "n": 3})
    lines = path.read_text().splitlines()
    assert [json.loads(line)["key"] for line in lines] == ["a", "c"]


def test_load_rows_reads_directories_and_missing_paths(tmp_path):
    records.append_row(tmp_path / "b.jsonl", {"schema": 1, "key": "2"})
    records.append_row(tmp_path / "a.jsonl", {"schema": 1, "key": "1"})
    assert [r["key"] for r in records.load_rows(tmp_path)] == ["1", "2"]
    assert records.load_rows(tmp_path / "nope.jsonl") == []


def test_versions_match_compares_the_key_versions_only():
    v1 = {k: "1" for k in records.KEY_VERSIONS}
    assert records.versions_match({**v1, "python": "3.12"}, {**v1, "python": "3.11"})  # not a key version
    assert not records.versions_match({**v1, "trl": "2"}, v1)
    assert not records.versions_match(None, v1)  # a row without versions is not done under pinned versions
    assert records.versions_match(None, None)  # None accepts any row


def test_finished_keys_respect_versions_and_status(tmp_path):
    path = tmp_path / "r.jsonl"
    v1 = {k: "1" for k in records.KEY_VERSIONS}
    v2 = {**v1, "trl": "2"}
    records.append_row(path, {"schema": 1, "key": "old", "status": "ok", "versions": v1})
    records.append_row(path, {"schema": 1, "key": "new", "status": "ok", "versions": v2})
    records.append_row(path, {"schema": 1, "key": "oom", "status": "oom", "versions": v2})
    records.append_row(path, {"schema": 1, "key": "skip", "status": "skipped", "versions": v2})
    records.append_row(path, {"schema": 1, "key": "err", "status": "error", "versions": v2})
    rows = records.load_rows(path)
    assert records.finished_keys(rows, v2) == {"new", "oom", "skip"}  # an error is retried
    assert records.finished_keys(rows, None) == {"old", "new", "oom", "skip"}


WRITER = """
import sys
from sweeps import records
path = sys.argv[1]
i = 0
while True:
    records.append_row(path, {"schema": 1, "key": str(i), "pad": "x" * 200_000})
    i += 1
"""


def test_killed_writer_leaves_only_whole_rows(tmp_path):
    path = tmp_path / "r.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], env=env)
    deadline = time.time() + 20
    while time.time() < deadline and len(records.load_rows(path)) < 5:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    text = path.read_text()
    assert text.endswith("\n")
    keys = [json.loads(line)["key"] for line in text.splitlines()]  # every line parses
    assert len(keys) >= 5
    assert keys == [str(i) for i in range(len(keys))]  # no loss, no duplicates


def test_environment_info_cpu():
    env = records.environment_info("cpu")
    assert env["device"]["type"] == "cpu"
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():  # Linux: the kernel's own MemTotal, read independently of the code under test
        kib = next(
            int(line.split()[1]) for line in meminfo.read_text().splitlines() if line.startswith("MemTotal:")
        )
        assert env["device"]["total_bytes"] == kib * 1024
    from importlib.metadata import version

    assert env["versions"]["trl"] == version("trl") and env["versions"]["torch"] == version("torch")
    assert env["versions"]["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    if shutil.which("nvidia-smi") is None:
        assert env["versions"]["driver"] is None  # no NVIDIA driver, no driver version
    assert set(env["versions"]) >= {"peft", "accelerate", "bitsandbytes", "transformers", "cuda"}
    assert env["versions"]["trl"].startswith("1.16")


def test_commit_of_a_tree_without_git_comes_from_the_environment(tmp_path, monkeypatch):
    """A lent GPU machine gets a copy of the tree without .git: the commit the lease call names is recorded."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git must not find an enclosing repo
    monkeypatch.delenv(records.COMMIT_ENV, raising=False)
    assert records.git_commit(tmp_path) is None
    monkeypatch.setenv(records.COMMIT_ENV, "0123abcd")
    assert records.git_commit(tmp_path) == "0123abcd"


def test_the_commit_a_lease_names_wins_over_the_git_the_copied_tree_sits_in(monkeypatch):
    """On a lent machine the tree was copied into a checkout of another commit: its git says the wrong one."""
    monkeypatch.setenv(records.COMMIT_ENV, "0123abcd")
    assert records.git_commit(records.REPO) == "0123abcd"  # this repo has a git HEAD; the named commit wins
    monkeypatch.delenv(records.COMMIT_ENV)
    assert records.git_commit(records.REPO) != "0123abcd"
