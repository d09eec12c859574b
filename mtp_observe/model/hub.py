"""A model argument: a checkpoint directory, or a Hugging Face hub id already in the local cache.

`resolve_model(value, option)`:
    1. an existing path is the checkpoint directory (a local directory named like an id wins);
    2. otherwise `ORG/NAME` or `ORG/NAME@REVISION` is looked up in the local Hugging Face cache
       (HF_HUB_CACHE, or HF_HOME/hub, default ~/.cache/huggingface/hub) with
       `huggingface_hub.snapshot_download(..., local_files_only=True)`: the snapshot directory of
       that revision (default "main", as `refs/main` names it) if the cache has it. Nothing is ever
       downloaded: with local_files_only huggingface_hub makes no request (huggingface_hub
       `_snapshot_download.py`: the repository listing is skipped, the commit is read from
       `refs/<revision>`, the folder is `snapshots/<commit>`, and one that a cached listing shows
       incomplete is refused);
    3. anything else is a user error naming the command's own option (`MODEL` for inspect and
       probe, `--model` for sessions, replay and generate) and how to get the model into the cache.

Files a partial download lacks (a shard never fetched) are found missing by checkpoint.read_checkpoint,
which names them.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import CheckpointError

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")


def hub_cache_dir() -> str:
    """Where huggingface_hub looks (its constants read HF_HUB_CACHE / HF_HOME when imported)."""
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:
        return "~/.cache/huggingface/hub"


def _usage(option: str) -> str:
    return "pass MODEL as a checkpoint directory" if option == "MODEL" else f"pass {option} DIR with a checkpoint directory"


def resolve_model(value, option: str = "--model") -> Path:
    """value (str or Path) -> the checkpoint directory; option: how the command names its model argument."""
    path = Path(value).expanduser()
    if path.exists():
        return path
    text = str(value)
    if not HUB_ID.fullmatch(text) or text.startswith((".", "/", "~")):
        raise CheckpointError(f"{option} {text}: model directory not found, and not a Hugging Face id (ORG/NAME); {_usage(option)}")
    repo, _, revision = text.partition("@")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # a dependency of transformers, so normally present
        raise CheckpointError(f"{option} {text}: model directory not found, and huggingface_hub (to read the Hugging Face cache) "
                              f"is not installed; {_usage(option)}") from None
    try:
        snapshot = snapshot_download(repo, revision=revision or None, local_files_only=True)
    except Exception as e:  # LocalEntryNotFoundError (not cached), an incomplete snapshot, a malformed entry
        why = "not in" if type(e).__name__ == "LocalEntryNotFoundError" else f"incomplete or unreadable in ({str(e).split('. ')[0][:120]})"
        raise CheckpointError(
            f"{option} {text}: model directory not found, and {why} the local Hugging Face cache ({hub_cache_dir()}); "
            f"mtp-observe never downloads: fetch it first (hf download {repo}{f' --revision {revision}' if revision else ''}) "
            f"or {_usage(option)}") from None
    return Path(snapshot)
