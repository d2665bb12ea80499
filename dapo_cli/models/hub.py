"""Hub ids through the standard Hugging Face cache (``HF_HOME``, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``).

Models and registered datasets are looked up with huggingface_hub's own cache functions
(``snapshot_download`` / ``hf_hub_download`` with ``local_files_only``, ``try_to_load_from_cache``),
so a file that ``hf_hub_download`` put in the cache -- or that someone copied there in the
documented layout, ``<cache>/models--org--name/{refs/main, snapshots/<sha>/...}`` and
``datasets--org--name/...`` -- is found offline. Only when the cache lacks it, the machine is not
offline (``HF_HUB_OFFLINE``) and the hub answers, is anything downloaded (into that same cache).

The cache folder and the offline switch are read from the environment at each call
(huggingface_hub reads them once, at import), so a command, or a test, that sets them later is
honoured.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse

from dapo_cli.errors import UserError

MODEL_FILES = ("*.json", "*.safetensors", "*.jinja", "*.model", "*.tiktoken", "*.txt", "*.py")
"""What a model download fetches: config, weights, tokenizer and chat template (never ``*.bin``,
``*.pth`` or other formats a repo may carry beside the safetensors)."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def is_hub_id(spec: str) -> bool:
    """True for ``name`` or ``owner/name`` specs (letters, digits, ``_ . -``), not for paths like ``./x``."""
    return bool(_HUB_ID.match(spec))


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set to a true value (1/true/yes/on)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def hub_cache_dir() -> Path:
    """The hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether a TCP connection to the hub endpoint (``$HF_ENDPOINT``) opens within ``timeout_s``.

    Checked first so an offline machine fails in seconds instead of after the
    hub client's retries (~30 s).
    """
    url = urlparse(os.environ.get("HF_ENDPOINT", "") or "https://huggingface.co")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def why_not_online() -> str | None:
    """None when downloads may be tried; else why not ("HF_HUB_OFFLINE is set", "... cannot be reached")."""
    if hub_offline():
        return "HF_HUB_OFFLINE is set"
    if not hub_reachable():
        return "the Hugging Face hub cannot be reached"
    return None


def cached_file(repo_id: str, filename: str, repo_type: str = "model") -> Path | None:
    """``filename`` of ``repo_id`` at ``main`` in the hub cache, or None (no network, ever)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        found = try_to_load_from_cache(repo_id, filename, cache_dir=hub_cache_dir(), repo_type=repo_type)
    except (HFValidationError, OSError):  # an id the hub client rejects is simply not cached
        return None
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def cached_snapshot(spec: str) -> Path | None:
    """The cached snapshot folder of hub model ``spec`` at ``main`` holding a ``config.json``, or None."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        found = Path(snapshot_download(spec, local_files_only=True, cache_dir=hub_cache_dir()))
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        return None
    return found if (found / "config.json").is_file() else None


def model_snapshot(spec: str) -> Path:
    """The local snapshot folder of hub model ``spec``: from the cache, else downloaded into it.

    Raises :class:`UserError` when it is not cached and cannot be downloaded (offline, unreachable,
    unknown id), saying to give a local directory.
    """
    from huggingface_hub import snapshot_download

    cache = hub_cache_dir()
    found = cached_snapshot(spec)
    if found is not None:
        return found
    why = why_not_online()
    if why is None:
        try:
            return Path(snapshot_download(spec, allow_patterns=list(MODEL_FILES), cache_dir=cache))
        except Exception as exc:  # noqa: BLE001 -- any failure of the network call
            why = f"the download failed ({type(exc).__name__}: {first_line(exc)})"
    raise UserError(
        f"cannot load model '{spec}': {why} and it is not a local directory or in the Hugging Face cache "
        f"({cache}); give a local directory (a save_pretrained folder) or builtin:tiny"
    )


def first_line(exc: BaseException) -> str:
    """The first sentence of an exception's message's first line (its type name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0].split(". ")[0] if text else type(exc).__name__
