"""A damaged or hostile model folder given to ``dapo train`` and ``dapo eval``: exit 2, one ``error:`` line
naming the folder, file and fix, no traceback, nothing left behind (issue 54; dapo_cli/models/door.py and
chat_template.py). One case per class for each command: a config.json field, the shape of a JSON file,
a tokenizer file, non-finite weights, and each kind of chat template that cannot work."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from malformed_harness import Case, case, places_for, run_case

TEMPLATES = {
    "tpl-loop": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "tpl-huge": "{{ 'x' * 10**10 }}",
    "tpl-raise": "{{ raise_exception('x') }}",
    "tpl-syntax": "{% for m in messages %}{{ m.content }",
    "tpl-class": "{{ messages.__class__.__mro__ }}",
}


def _config(folder: Path, **fields: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


def _nan_weights(folder: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    save_file({k: torch.full_like(v, float("nan")) for k, v in tensors.items()}, folder / "model.safetensors", metadata={"format": "pt"})


DAMAGE = {
    "heads0": lambda f: _config(f, num_attention_heads=0),
    "ctxword": lambda f: _config(f, max_position_embeddings="lots"),
    "ctxneg": lambda f: _config(f, max_position_embeddings=-1),
    "cfgdeep": lambda f: (f / "config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    "cfglist": lambda f: (f / "config.json").write_text("[]"),
    "tokcfglist": lambda f: (f / "tokenizer_config.json").write_text("[1, 2]"),
    "tokbinary": lambda f: (f / "tokenizer.json").write_bytes(b"\x1f\x8b\x08\x00\xff\xfe\x00\x80" * 64),
    "nan": _nan_weights,
    **{name: (lambda source: lambda f: (f / "chat_template.jinja").write_text(source))(source) for name, source in TEMPLATES.items()},
}


@pytest.fixture(scope="module")
def bad_models(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny policy and one damaged copy of it per entry of :data:`DAMAGE` (outside every case's working directory)."""
    root = tmp_path_factory.mktemp("bad-models")
    out = {"model": tiny_model_dir}
    for name, damage in DAMAGE.items():
        out[name] = Path(shutil.copytree(tiny_model_dir, root / name))
        damage(out[name])
    return out


def train(name: str) -> tuple[str, ...]:
    return ("train", "--set", f"model.path={{{name}}}")


def evaluate(name: str) -> tuple[str, ...]:
    return ("eval", f"{{{name}}}", "--dataset", "{data}", "--avg", "1", "--max-tokens", "2", "--no-track")


FIX_TEMPLATE = "fix or remove the chat template (chat_template.jinja"

CASES = [
    # ------------------------------------------------------------ config.json: fields typed and ranged
    case("train-config-heads-zero", *train("heads0"),
         expect="model config {heads0}/config.json: num_attention_heads=0 must be a positive integer; fix the model's config.json"),
    case("eval-config-heads-zero", *evaluate("heads0"), expect="num_attention_heads=0 must be a positive integer"),
    case("train-config-context-word", *train("ctxword"), expect='max_position_embeddings="lots" must be a positive integer'),
    case("eval-config-context-negative", *evaluate("ctxneg"), expect="max_position_embeddings=-1 must be a positive integer"),
    # ------------------------------------------------------------ config.json: shape and bounds of the JSON
    case("train-config-nested-100000", *train("cfgdeep"), expect="model {cfgdeep}: config.json nests deeper than 64 levels; re-save it"),
    case("eval-config-nested-100000", *evaluate("cfgdeep"), expect="config.json nests deeper than 64 levels"),
    case("train-config-a-list", *train("cfglist"), expect="config.json is a JSON list, not an object"),
    case("eval-config-a-list", *evaluate("cfglist"), expect="config.json is a JSON list, not an object"),
    # ------------------------------------------------------------ tokenizer files
    case("train-tokenizer-config-a-list", *train("tokcfglist"),
         expect="model {tokcfglist}: tokenizer_config.json is a JSON list, not an object; fix or re-save the tokenizer files"),
    case("eval-tokenizer-config-a-list", *evaluate("tokcfglist"), expect="tokenizer_config.json is a JSON list, not an object"),
    case("train-tokenizer-json-binary", *train("tokbinary"), expect="tokenizer.json is not UTF-8 text"),
    case("eval-tokenizer-json-binary", *evaluate("tokbinary"), expect="tokenizer.json is not UTF-8 text"),
    # ------------------------------------------------------------ weights that are not finite (found while loading)
    case("train-nan-weights", *train("nan"), expect="cannot load model from {nan}: tensor 'model.", progress_first=True),
    case("eval-nan-weights", *evaluate("nan"), "--output", "out", expect="holds NaN/inf values; re-save it from a healthy checkpoint",
         progress_first=True),
    # ------------------------------------------------------------ chat templates (untrusted Jinja), rendered on a probe at the door
    case("train-template-loop", *train("tpl-loop"), expect="chat template of {tpl-loop}: it ran more than 250,000 loop steps"),
    case("eval-template-loop", *evaluate("tpl-loop"), expect="it ran more than 250,000 loop steps, calls and filters; " + FIX_TEMPLATE),
    case("train-template-huge-string", *train("tpl-huge"), expect="'*' would build a value of more than 1,000,000 characters"),
    case("eval-template-huge-string", *evaluate("tpl-huge"), expect="'*' would build a value of more than 1,000,000 characters"),
    case("train-template-raises", *train("tpl-raise"), expect="chat template of {tpl-raise}: it raised an error: x; " + FIX_TEMPLATE),
    case("eval-template-raises", *evaluate("tpl-raise"), expect="it raised an error: x"),
    case("train-template-syntax", *train("tpl-syntax"), expect="syntax error at line 1: unexpected '}}'"),
    case("eval-template-syntax", *evaluate("tpl-syntax"), expect="syntax error at line 1"),
    case("train-template-dunder", *train("tpl-class"), expect="the sandbox refused it (access to attribute '__class__'"),
    case("eval-template-dunder", *evaluate("tpl-class"), expect="the sandbox refused it"),
]


def test_every_class_has_a_train_and_an_eval_case() -> None:
    for needle in ("config-heads", "config-nested", "config-a-list", "tokenizer-config", "tokenizer-json", "nan", "template-loop",
                   "template-huge", "template-raises", "template-syntax", "template-dunder"):
        commands = {c.args[0] for c in CASES if needle in c.id}
        assert commands == {"train", "eval"}, needle
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
@pytest.mark.slow
def test_a_bad_model_folder_is_one_error_line_exit_2_and_leaves_nothing(
    c: Case, request: pytest.FixtureRequest, bad_models: dict[str, Path], dataset: Path, case_dir: Path,
) -> None:
    run_case(c, places_for(c, request, bad_models, dataset), case_dir)
