"""A launch command pasted as a block is read as bash reads it: continued lines, `#` comments, quoted newlines,
and one command per line otherwise. The oracle is bash itself, running the block with the first word of each
command replaced by a function that prints the words it was given."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from estimator.interface.command import CommandError, _commands, _words

BASH = shutil.which("bash")

BLOCKS = (
    "trl grpo --model_name_or_path Q --dtype bfloat16 # --use_peft --lora_target_modules all-linear",
    "accelerate launch \\\n  --num_processes 2 \\\n  grpo.py --model_name_or_path Q",
    "accelerate launch \\\n  --num_processes 2 \\\n  # --use_peft \\\n  grpo.py --model_name_or_path Q",
    "python grpo.py --system_prompt 'a\nb # not a comment' --x 1",
    'python grpo.py --tag "v#2" --y a#b   # the comment',
    "# a heading\n\naccelerate launch grpo.py --model_name_or_path Q\n",
    "CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Q\naccelerate launch grpo.py --model_name_or_path Q",
    "python grpo.py --tag a\\ #b --x 1",  # an escaped space: the `#` is inside the word
    "python grpo.py --x \\\\\\\n  --y 1",  # three backslashes: the last continues the line
    'python grpo.py --system_prompt "abc\\\ndef" --y 2',  # a continuation inside double quotes
    "python grpo.py --x 1\\\n#y --z 2",  # joined lines: `1#y` is one word
)


def _bash_commands(block: str) -> list[list[str]]:
    """The words of every command bash runs for `block`: with no PATH, each command is not found, and bash's
    handler for that prints the words it was given."""
    shim = "command_not_found_handle() { printf '%s\\037' \"$@\"; printf '\\036'; }\n"
    out = subprocess.run(
        [BASH or "bash", "--norc", "--noprofile", "-c", shim + block],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/nonexistent"},
    ).stdout
    return [[w for w in cmd.split("\x1f") if w] for cmd in out.split("\x1e") if cmd]


@pytest.mark.skipif(BASH is None, reason="bash is the oracle")
@pytest.mark.parametrize("block", BLOCKS)
def test_commands_are_the_ones_bash_runs(block):
    bash = _bash_commands(block)
    ours = _commands(block)
    env_stripped = [[w for w in c if "=" not in w or w.startswith("-")] for c in bash]
    assert len(bash) >= 1
    assert [[w for w in shlex.split(c) if "=" not in w or w.startswith("-")] for c in ours] == env_stripped
    if len(bash) == 1:
        assert [w for w in _words(block) if "=" not in w or w.startswith("-")] == env_stripped[0]
    else:
        with pytest.raises(CommandError, match=f"{len(bash)} commands as bash reads them"):
            _words(block)
