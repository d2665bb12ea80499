"""Warm-start pieces by hand (LR schedule, label masking, answer check), a 20-step build, the builtin:tiny
cache that ``ensure_model`` fills, and byte-identical builds in two processes."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fixtures.tiny import QUICK_TINY

import dapo_cli.warmstart as warmstart
from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.errors import UserError
from dapo_cli.models.loading import MODEL_CARD, resolve_model
from dapo_cli.models.tokenizer import build_char_tokenizer, char_vocab
from dapo_cli.warmstart import (
    IGNORE_INDEX,
    answer_checker,
    ensure_model,
    local_answer_check,
    sft_batch,
    sft_lr,
    sft_pairs,
    warm_start,
)

V = char_vocab()
QUICK = QUICK_TINY  # a build in about a second: for what ensure_model does around warm_start
SMALL = dataclasses.replace(QUICK, sft_steps=20, sft_batch_size=16, sft_warmup_steps=2, eval_problems=16, eval_max_tokens=40)


def test_sft_lr_warmup_then_linear_decay_to_ten_percent():
    cfg = TinyModelConfig(sft_lr=1e-3, sft_warmup_steps=4, sft_steps=14)
    # warm-up: (s+1)/4 * 1e-3 for s = 0..3
    assert [sft_lr(s, cfg) for s in range(4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3], abs=1e-12)
    # decay over s = 4..13: 1 - 0.9 (s-4)/9 -> 1.0 at s=4, 0.6 at s=8, 0.1 at the last step s=13
    assert sft_lr(4, cfg) == pytest.approx(1e-3, abs=1e-12)
    assert sft_lr(8, cfg) == pytest.approx(6e-4, abs=1e-12)
    assert sft_lr(13, cfg) == pytest.approx(1e-4, abs=1e-12)
    # no warm-up: the first step already uses the peak
    assert sft_lr(0, TinyModelConfig(sft_lr=2e-3, sft_warmup_steps=0, sft_steps=5)) == pytest.approx(2e-3)


def test_sft_batch_masks_prompt_and_padding():
    tok = build_char_tokenizer()
    batch = sft_batch(tok, [("1+1?\n", "2"), ("9?\n", "Answer: 9")])
    # row 0: prompt "1+1?\n" (5 tokens) + "2" + <eos> = 7 tokens, padded to row 1's 3 + 9 + 1 = 13
    row0 = [V[c] for c in "1+1?\n"] + [V["2"], 1]
    assert batch["input_ids"][0].tolist() == row0 + [0] * 6
    assert batch["attention_mask"][0].tolist() == [1] * 7 + [0] * 6
    assert batch["labels"][0].tolist() == [IGNORE_INDEX] * 5 + [V["2"], 1] + [IGNORE_INDEX] * 6
    assert batch["labels"][1].tolist() == [IGNORE_INDEX] * 3 + [V[c] for c in "Answer: 9"] + [1]
    assert batch["attention_mask"][1].tolist() == [1] * 13


def test_sft_pairs_mix_direct_and_worked_answers_deterministically():
    tok = build_char_tokenizer()
    cfg = TinyModelConfig(sft_batch_size=200, sft_direct_frac=0.25)
    batch = next(sft_pairs(tok, cfg))
    assert batch == next(sft_pairs(tok, cfg))
    direct = sum(response.startswith("Answer: ") for _, response in batch)
    # binomial(200, 0.25): mean 50, sd ~6.1
    assert 30 <= direct <= 70
    assert all(prompt.startswith("What is ") and prompt.endswith("?\n") for prompt, _ in batch)
    assert all(response.split("\n")[-1].startswith("Answer: ") for _, response in batch)
    assert sum(r.startswith("Answer: ") for _, r in next(sft_pairs(tok, TinyModelConfig(sft_direct_frac=0.0)))) == 0


def test_sft_pairs_loop_a_share_of_the_worked_answers_and_keep_old_builds_unchanged():
    from dapo_cli.diagnostics import collapse_repeated_lines

    tok = build_char_tokenizer()
    plain = TinyModelConfig(sft_batch_size=400, sft_direct_frac=0.25)
    assert next(sft_pairs(tok, plain)) == next(sft_pairs(tok, TinyModelConfig(sft_batch_size=400, sft_direct_frac=0.25, sft_loop_continue=0.5)))
    looped = next(sft_pairs(tok, TinyModelConfig(sft_batch_size=400, sft_direct_frac=0.25, sft_loop_frac=0.5, sft_loop_continue=0.8)))
    worked = [r for _, r in looped if not r.startswith("Answer: ")]
    repeats = [r for r in worked if collapse_repeated_lines(r) != r]
    # a worked answer loops with p 0.5 × P(R >= 1) = 0.5 × 0.8 = 0.4 of ~300: binomial sd ~8.5
    assert 0.3 * len(worked) <= len(repeats) <= 0.5 * len(worked)
    # a loop only repeats lines: collapsed, it is a plain worked solution ending in its answer
    assert all(collapse_repeated_lines(r).split("\n")[-1].startswith("Answer: ") for r in repeats)
    assert max(len(r) for r in repeats) > 64 >= max(len(collapse_repeated_lines(r)) for r in repeats)


@pytest.mark.parametrize(
    ("response", "correct"),
    [
        ("5+7+0=12\n8+4+1=13\n3+0+1=4\nAnswer: 432", True),
        ("Answer: 432", True),
        ("answer : 432", True),  # case-insensitive, spaces around the colon
        ("Answer: 4 32", True),  # spaces are dropped, as in the DAPO normalisation
        ("Answer: 432\nAnswer: 431", False),  # the last Answer: line counts
        ("Answer: 0432", False),
        ("432", False),  # no Answer: line
        ("Answer: 432\n" + "x" * 288, True),  # 12 + 288 = 300 chars: the whole line is inside the window
        ("Answer: 432\n" + "x" * 289, False),  # 301 chars: the window starts at "nswer:"
    ],
)
def test_local_answer_check(response, correct):
    assert local_answer_check(response, 432) is correct


def test_answer_checker_uses_the_dapo_verifier_or_falls_back(monkeypatch):
    monkeypatch.setitem(sys.modules, "dapo_cli.rewards.math_dapo", None)  # import raises ImportError
    assert answer_checker() is local_answer_check
    monkeypatch.undo()
    check = answer_checker()
    for response in ("Answer: 432", "x\nAnswer: 431", "Answer: 432\n" + "x" * 300):
        assert check(response, 432) is local_answer_check(response, 432)


@pytest.mark.slow
def test_warm_start_builds_saves_and_is_deterministic(tmp_path):
    card = warm_start(SMALL, tmp_path / "a", progress=False)
    assert json.loads((tmp_path / "a" / MODEL_CARD).read_text()) == card
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "a" / name).is_file(), name
    assert card["spec"] == "builtin:tiny" and card["fingerprint"] == SMALL.fingerprint()
    assert card["sft_steps"] == 20 and card["config"]["hidden_size"] == 32 and card["eval_problems"] == 16
    for key in ("base_accuracy_t1", "base_accuracy_greedy"):
        assert 0.0 <= card[key] <= 1.0 and (card[key] * 16).is_integer()  # a share of 16 problems
    assert card["sft_final_loss"] < 4.0  # learnt something: a random init scores about log(114) = 4.74
    assert card["wall_time_s"] > 0 and card["num_parameters"] > 0
    state = torch.get_rng_state()
    again = warm_start(SMALL, tmp_path / "b", progress=False)
    assert torch.equal(torch.get_rng_state(), state)
    assert again["sft_final_loss"] == card["sft_final_loss"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_ensure_model_builds_builtin_tiny_once_into_the_fingerprinted_cache(tmp_path, capsys, monkeypatch):
    path = ensure_model("builtin:tiny", QUICK, cache_dir=tmp_path)
    assert path == tmp_path / f"tiny-{QUICK.fingerprint()}" == resolve_model("builtin:tiny", QUICK, cache_dir=tmp_path)
    card = json.loads((path / MODEL_CARD).read_text())
    assert card["fingerprint"] == QUICK.fingerprint() and card["sft_steps"] == 3
    err = capsys.readouterr().err
    notice, *progress = err.splitlines()  # one notice, then (stderr is no terminal) plain progress lines
    assert "building builtin:tiny" in notice and str(path) in notice
    assert progress and all(line.startswith("warm-start (SFT): ") for line in progress)
    assert "100% (3/3 steps)" in progress[-1]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary sibling left behind

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cached model was rebuilt")

    monkeypatch.setattr(warmstart, "warm_start", no_rebuild)
    assert ensure_model("builtin:tiny", QUICK, cache_dir=tmp_path) == path
    assert capsys.readouterr().err == ""
    other = dataclasses.replace(QUICK, seed=1)
    with pytest.raises(AssertionError, match="rebuilt"):  # another config is another cache entry
        ensure_model("builtin:tiny", other, cache_dir=tmp_path)
    assert not (tmp_path / f"tiny-{other.fingerprint()}").exists()  # the failed build left nothing


def test_ensure_model_passes_other_specs_to_resolve_model(tmp_path, monkeypatch):
    monkeypatch.setattr(warmstart, "warm_start", lambda *a, **k: pytest.fail("only builtin:tiny is built"))
    assert ensure_model(str(tmp_path / "mine"), QUICK) == tmp_path / "mine"  # a path, as given: not created
    assert str(ensure_model("Qwen/Qwen2.5-0.5B", QUICK)) == "Qwen/Qwen2.5-0.5B"
    with pytest.raises(UserError, match=r"unknown built-in model 'builtin:huge' \(valid: builtin:tiny\)"):
        ensure_model("builtin:huge", QUICK, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


BUILD_IN_A_PROCESS = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from dapo_cli.config.tiny import TinyModelConfig
    from dapo_cli.warmstart import ensure_model
    print(ensure_model("builtin:tiny", TinyModelConfig(**json.loads(sys.argv[1])), Path(sys.argv[2])))
""")


@pytest.mark.slow
def test_two_processes_build_byte_identical_models(tmp_path):
    # the cache is keyed by the config alone, so a build must not depend on the process that ran it:
    # two fresh interpreters (different str-hash seeds), two fresh cache folders, the same bytes
    cfg = dataclasses.replace(SMALL, sft_loop_frac=0.25)  # every random draw of the stream in play
    root = str(Path(__file__).resolve().parents[1])
    built = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "OMP_NUM_THREADS": "1",  # one thread count: see warm_start
               "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        cache = tmp_path / f"cache-{hash_seed}"
        proc = subprocess.run([sys.executable, "-c", BUILD_IN_A_PROCESS, json.dumps(dataclasses.asdict(cfg)), str(cache)],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        path = Path(proc.stdout.strip())
        assert path == cache / f"tiny-{cfg.fingerprint()}"
        built.append(path)
    a, b = built
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    cards = [json.loads((p / MODEL_CARD).read_text()) for p in built]
    assert all(card.pop("wall_time_s") > 0 for card in cards)
    assert cards[0] == cards[1] and cards[0]["sft_steps"] == 20



# ---------------------------------------------------------------- the shipped default policy


def test_the_package_ships_the_default_policy_built_by_the_current_recipe():
    # fails when the warm-start recipe (any model.tiny default) or TINY_FORMAT_VERSION changes without a
    # fresh `dapo init-model --force -o dapo_cli/models/shipped/tiny`: the shipped policy would go unused
    from dapo_cli.config.tiny import TINY_FORMAT_VERSION

    card = json.loads((warmstart.SHIPPED_TINY / MODEL_CARD).read_text(encoding="utf-8"))
    assert card["fingerprint"] == TinyModelConfig().fingerprint()
    assert card["format_version"] == TINY_FORMAT_VERSION and card["config"] == dataclasses.asdict(TinyModelConfig())
    assert sorted(p.name for p in warmstart.SHIPPED_TINY.iterdir()) == sorted(warmstart.SHIPPED_FILES)
    assert warmstart.shipped_policy(TinyModelConfig()) == warmstart.SHIPPED_TINY
    assert warmstart.shipped_policy(dataclasses.replace(TinyModelConfig(), seed=1)) is None


def test_the_shipped_policy_loads_and_answers_as_its_card_says():
    from dapo_cli.components import build_policy_rollout
    from dapo_cli.data.synthetic import generate_examples
    from dapo_cli.models import load_policy
    from dapo_cli.rollout.base import SamplingParams

    card = json.loads((warmstart.SHIPPED_TINY / MODEL_CARD).read_text(encoding="utf-8"))
    model, tokenizer = load_policy(warmstart.SHIPPED_TINY)
    assert sum(p.numel() for p in model.parameters()) == card["num_parameters"] == 1_064_320
    # greedy on the card's first 40 held-out problems: a trained policy (the card says 44.5% on 200), not a
    # random one (0%); the band allows other CPUs' rounding and the smaller sample
    examples = generate_examples("add-3digit", 40, 0, split="val")
    engine = build_policy_rollout("hf", model, tokenizer)
    greedy = SamplingParams(temperature=0.0, max_tokens=card["eval_max_tokens"])
    accuracy = warmstart.measure_accuracy(engine, tokenizer, examples, greedy, warmstart.answer_checker())
    assert 0.2 <= accuracy <= 0.75, accuracy


def test_ensure_model_installs_the_shipped_policy_without_training(tmp_path, capsys, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("warm_start ran although the package ships this policy")

    monkeypatch.setattr(warmstart, "warm_start", no_training)
    path = warmstart.ensure_model("builtin:tiny", TinyModelConfig(), tmp_path)
    assert path == tmp_path / f"tiny-{TinyModelConfig().fingerprint()}"
    for name in warmstart.SHIPPED_FILES:
        assert (path / name).read_bytes() == (warmstart.SHIPPED_TINY / name).read_bytes(), name
    assert "installing the shipped builtin:tiny" in capsys.readouterr().err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing half-written beside it


def test_ensure_model_without_the_shipped_copy_trains(tmp_path, monkeypatch):
    built = []

    def fake_warm_start(cfg, out, **kwargs):
        built.append(cfg)
        (Path(out) / MODEL_CARD).write_text("{}")

    monkeypatch.setattr(warmstart, "warm_start", fake_warm_start)
    warmstart.ensure_model("builtin:tiny", TinyModelConfig(), tmp_path, use_shipped=False)
    assert built == [TinyModelConfig()]
