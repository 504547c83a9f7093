"""Reading a user's file: a size-capped regular file of UTF-8 YAML or JSON holding a mapping, as one-line errors.

Shared by the TRL config reader (configfile.py), the accelerate / DeepSpeed reader (launchfile.py) and the
launch-command reader (command.py); the nearest-key suggestion for a typo lives here for the same reason.
"""

from __future__ import annotations

import json
from pathlib import Path

from estimator.text import UnreadableFile, read_user_file, shown

MAX_FILE_BYTES = 1 << 20  # a config file is a few KiB; a bigger one is not a config


class ConfigFileError(ValueError):
    """A --config file that cannot be read or holds a value of the wrong type."""


def clip(value, limit: int = 60) -> str:
    """A value as it goes into an error line: escaped and cut to `limit` characters, in bounded time."""
    return shown(value, limit)


def levenshtein(a: str, b: str, cap: int = 3) -> int:
    """Edit distance (insert, delete, substitute), stopping early past `cap`."""
    if abs(len(a) - len(b)) > cap:
        return cap + 1
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        if min(cur) > cap:
            return cap + 1
        prev = cur
    return prev[-1]


# A file's unknown keys are each checked for a near miss of a known key (a typo is an error) and listed in a note
# (`estimator.text.listed`). A real config has a handful; past MAX_TYPO_CHECKS the file is not a config of this
# tool, so only the first that many get the (quadratic) check.
MAX_TYPO_CHECKS = 200


def suggestion(key: str, known) -> str | None:
    """The known key `key` is most likely a typo of: edit distance <= 2 (<= 1 for keys under 6 characters)."""
    limit = 1 if len(key) < 6 else 2
    best = None
    for k in known:
        d = levenshtein(key.lower(), str(k).lower(), limit)
        if d <= limit and (best is None or d < best[0]):
            best = (d, str(k))
    return best[1] if best else None


def parse_text(text: str, suffix: str) -> object:
    """YAML (or JSON, a YAML subset) text -> what it holds (None for an empty YAML file)."""
    if suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    return data


def load_file(path: str, flag: str = "--config") -> dict:
    """A regular file of at most MAX_FILE_BYTES of UTF-8 YAML/JSON holding a mapping (read by
    estimator.text.read_user_file); else one ConfigFileError."""
    lead = f"{flag} {clip(str(path), 120)}".strip()
    p = Path(path)
    try:
        text = read_user_file(p, MAX_FILE_BYTES, "a config file", "a YAML or JSON file")
    except UnreadableFile as e:
        raise ConfigFileError(f"{lead}: {e}") from None
    try:
        data = parse_text(text, p.suffix.lower())
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError / RecursionError: keep the first line only
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigFileError(f"{lead}: not valid YAML/JSON ({clip(first, 100)})") from None
    if data is None:  # TRL's HfArgumentParser.parse_yaml_file fails on a file with no mapping
        raise ConfigFileError(f"{lead}: empty (no settings); give YAML or JSON settings")
    if not isinstance(data, dict):
        raise ConfigFileError(f"{lead}: expected a mapping of settings, got {type(data).__name__}")
    return data
