"""`--model ORG/NAME[@REV]` that is neither in the catalog nor in the local HF cache: its config.json from the Hub.

Only config.json is fetched, with huggingface_hub's `hf_hub_download` (its cache, HF_TOKEN for gated models,
HF_ENDPOINT for mirrors). huggingface_hub is an optional dependency (`pip install 'grpo-vram[hub]'`), imported
only here and only when a fetch is needed, so the estimator stays importable (and its light install small)
without it. HF_HUB_OFFLINE=1 (or TRANSFORMERS_OFFLINE=1) never touches the network: the error then names the
one command that fetches the file. Every failure is a `HubError` whose text is one line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from estimator.text import UnreadableFile, printable, read_user_file

# Hub repo ids: `org/name`, each part letters, digits, '-', '_', '.', starting with a letter or digit, at most
# 96 characters, no '--' or '..' (huggingface_hub's validate_repo_id). A revision: a branch, tag or commit.
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
REPO_ID = re.compile(rf"{_PART}/{_PART}")
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
ETAG_TIMEOUT_S = 10.0  # per request; huggingface_hub's default


class HubError(ValueError):
    """A model id whose config.json could not be had from the Hub (one-line message)."""


def split_id(spec: str) -> tuple[str, str | None] | None:
    """(repo_id, revision or None) when `spec` reads as `org/name` or `org/name@rev`, else None."""
    repo, sep, rev = spec.strip().partition("@")
    if not REPO_ID.fullmatch(repo) or "--" in repo or ".." in repo or repo.endswith((".", ".json")):
        return None
    if sep and (not REVISION.fullmatch(rev) or ".." in rev or rev.endswith("/")):
        return None
    return repo, (rev if sep else None)


def offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE set to a true value (read now, not at import time)."""
    return any(
        os.environ.get(k, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def endpoint() -> str:
    """The Hub to ask: $HF_ENDPOINT (a mirror, or a test server) or huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _shown_endpoint() -> str:
    """`endpoint()` as an error line names it: control characters escaped, cut."""
    return printable(endpoint(), 120)


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads: $HF_HUB_CACHE, $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub, ~/.cache/..."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def fetch_command(repo_id: str, revision: str | None = None) -> str:
    """The one shell command that puts `repo_id`'s config.json into the local HF cache."""
    rev = f" --revision {revision}" if revision else ""
    return f"hf download {repo_id} config.json{rev}"


def cached_config(repo_id: str, revision: str | None, cache_dirs: list[Path]) -> Path | None:
    """config.json of `repo_id` at `revision` (a branch/tag via refs/, or a commit) in a local HF cache; no network.

    Without a revision: the snapshot refs/main points at, else the newest snapshot holding a config.json.
    """
    folder = "models--" + repo_id.replace("/", "--")
    for cache in cache_dirs:
        try:
            if not cache.is_dir():
                continue
            # The cache folder keeps the id's case; match it case-insensitively.
            for repo in sorted(d for d in cache.iterdir() if d.name.lower() == folder.lower()):
                found = _snapshot_config(repo, revision)
                if found is not None:
                    return found
        except OSError:
            continue
    return None


def _snapshot_config(repo: Path, revision: str | None) -> Path | None:
    snaps = repo / "snapshots"
    ref = repo / "refs" / (revision or "main")
    try:  # a ref holds one commit hash; read it bounded, like every file a user's cache may hold
        commit = read_user_file(ref, 4096, "a ref", "a commit hash").strip() if ref.is_file() else revision
    except UnreadableFile:
        commit = revision
    if commit and "/" not in commit and (snaps / commit / "config.json").is_file():
        return snaps / commit / "config.json"
    if revision is not None:
        return None
    found = list(snaps.glob("*/config.json"))
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


_fetched: dict[tuple, Path] = {}


def fetch_config(repo_id: str, revision: str | None = None) -> Path:
    """Local path of `repo_id`'s config.json (at `revision`), downloaded into the HF cache if need be.

    One download per (id, revision, endpoint, cache) in a process: the estimator resolves the same --model
    several times. Raises HubError (one line) when offline, when huggingface_hub is missing, or when the Hub
    refuses (gated, private, missing repo / revision / file) or cannot be reached.
    """
    where = f"--model {repo_id}" + (f"@{revision}" if revision else "")
    get = f"; fetch it with `{fetch_command(repo_id, revision)}` or pass a config.json path"
    if offline():
        raise HubError(f"{where}: not in the catalog or the local HF cache, and HF_HUB_OFFLINE is set{get}")
    key = (repo_id, revision, endpoint(), str(hub_cache_dir()))
    if key in _fetched and _fetched[key].is_file():
        return _fetched[key]
    try:
        from huggingface_hub import errors as hf_errors
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    except ImportError:
        raise HubError(
            f"{where}: not in the catalog or the local HF cache, and fetching its config.json needs "
            "huggingface_hub: pip install 'grpo-vram[hub]' (or pip install huggingface_hub), "
            "or download config.json and pass its path"
        ) from None
    try:
        # One HEAD first, without retries: an unreachable or refusing Hub answers in at most ETAG_TIMEOUT_S
        # (hf_hub_download alone retries a failed connection 5 times with backoff, ~25 s or more).
        url = hf_hub_url(repo_id, "config.json", revision=revision, endpoint=endpoint())
        try:
            get_hf_file_metadata(url, timeout=ETAG_TIMEOUT_S, endpoint=endpoint(), retry_on_errors=False)
        except TypeError:  # a huggingface_hub before retry_on_errors (it did not retry a HEAD then)
            get_hf_file_metadata(url, timeout=ETAG_TIMEOUT_S)
        path = hf_hub_download(
            repo_id,
            "config.json",
            revision=revision,
            endpoint=endpoint(),
            cache_dir=hub_cache_dir(),
            etag_timeout=ETAG_TIMEOUT_S,
        )
    except hf_errors.GatedRepoError:
        raise HubError(
            f"{where}: gated model on {_shown_endpoint()}; accept its terms on the model page, then set HF_TOKEN "
            "to a read token (or `hf auth login`), or pass a downloaded config.json's path"
        ) from None
    except hf_errors.RepositoryNotFoundError as e:
        status = _status(e)
        raise HubError(
            f"{where}: no such model on {_shown_endpoint()}{status} (if it is private or gated, set HF_TOKEN); "
            "give a size, a catalog name or a config.json path"
        ) from None
    except hf_errors.RevisionNotFoundError:
        raise HubError(f"{where}: no revision {revision!r} of {repo_id} on {_shown_endpoint()}") from None
    except hf_errors.LocalEntryNotFoundError as e:  # could not connect, and nothing cached
        raise HubError(f"{where}: could not reach {_shown_endpoint()} ({_short(e)}){get}") from None
    except hf_errors.EntryNotFoundError:
        raise HubError(f"{where}: the repo has no config.json (not a transformers model?)") from None
    except hf_errors.OfflineModeIsEnabled:
        raise HubError(f"{where}: huggingface_hub is in offline mode{get}") from None
    except hf_errors.HfHubHTTPError as e:
        raise HubError(f"{where}: {_shown_endpoint()} answered{_status(e)}{get}") from None
    except (OSError, ValueError, RuntimeError) as e:  # connection refused, DNS, timeouts, bad endpoint URL
        raise HubError(
            f"{where}: could not fetch config.json from {_shown_endpoint()} ({_short(e)}){get}"
        ) from None
    except Exception as e:  # httpx errors outside OSError; never a traceback for a model id
        raise HubError(
            f"{where}: could not fetch config.json from {_shown_endpoint()} ({_short(e)}){get}"
        ) from None
    _fetched[key] = Path(path)
    return Path(path)


def _status(e: Exception) -> str:
    response = getattr(e, "response", None)
    code = getattr(response, "status_code", None)
    return f" (HTTP {code})" if code else ""


def _short(e: Exception, n: int = 120) -> str:
    """An exception as one short line: its type and the first line of its text."""
    text = " ".join(str(e).split()) or type(e).__name__
    text = text if len(text) <= n else text[: n - 3] + "..."
    return f"{type(e).__name__}: {text}" if type(e).__name__ not in text else text
