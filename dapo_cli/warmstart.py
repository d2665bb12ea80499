"""Supervised warm-start of the tiny policy on a synthetic arithmetic task.

RL needs a policy that is right *sometimes*: groups of samples that are all
wrong (or all right) carry no DAPO advantage. ``warm_start`` therefore trains the
freshly built tiny model with plain next-token cross-entropy on the response
tokens only,

.. math:: \\mathcal{L}(\\theta) = -\\frac{1}{\\sum_i |y_i|} \\sum_i \\sum_{t=1}^{|y_i|}
          \\log \\pi_\\theta(y_{i,t} \\mid x_i, y_{i,<t}),

where ``x_i`` is the templated problem and ``y_i`` its solution plus ``<eos>``:
a worked one, or with probability ``sft_direct_frac`` just ``Answer: N``; with
``sft_loop_frac`` > 0 that share of the worked ones repeats a working line
(:func:`~dapo_cli.data.synthetic.looped_solution`), so the policy learns to loop
sometimes and long loops run into the RL response limit. The
mixture leaves the policy hesitating between the two styles, which RL then
resolves: measured with the defaults (add-3digit, 600 steps, half direct), about
half the T=1 samples answer directly and are almost always wrong (4-7%), the
worked ones are right 86-90% of the time, for a base accuracy of 44-51% at T=1
(seeds 0 and 1). A 500-step run reached only ~26% worked accuracy, a 600-step
one ~86%: the outcome is steep in the step count, so training stops after
``sft_steps`` steps -- never by wall time, which would make a busy machine build
a different model.

Afterwards the base accuracy on held-out ``val`` problems is measured at
temperature 1.0 and greedily, with the DAPO verifier when
``dapo_cli.rewards.math_dapo`` is importable and otherwise with
:func:`local_answer_check`, which implements the same rule for integers.

:func:`ensure_model` is what every command that loads a policy calls: the
``model.path`` resolved by :func:`dapo_cli.models.loading.resolve_model` (pure path
resolution), with ``builtin:tiny`` warm-started into its cache folder first when it is
missing. The module sits above ``models/``: it trains with a progress bar
(:mod:`dapo_cli.progress`) and samples through the rollout factory
(:func:`dapo_cli.components.build_policy_rollout`), neither of which ``models/`` may import.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dapo_cli.components import build_policy_rollout
from dapo_cli.config.tiny import TINY_FORMAT_VERSION, TinyModelConfig
from dapo_cli.data.synthetic import SyntheticExample, generate_examples, iter_examples, looped_solution
from dapo_cli.fileio import atomic_dir, write_json_atomic
from dapo_cli.models.loading import BUILTIN_MODELS, MODEL_CARD, resolve_model
from dapo_cli.models.tiny import build_tiny_model_for, count_parameters, save_policy
from dapo_cli.models.tokenizer import build_char_tokenizer, format_prompt
from dapo_cli.progress import CountProgress
from dapo_cli.rollout.base import RolloutEngine, SamplingParams

IGNORE_INDEX = -100
"""Label of tokens that do not enter the loss (prompt and padding)."""

_ANSWER_RE = re.compile(r"Answer\s*:\s*([^\n]+)", re.IGNORECASE)


def local_answer_check(response: str, answer: int) -> bool:
    """Fallback verifier: the last ``Answer:`` line in the final 300 characters equals ``answer``.

    The DAPO rule restricted to integer ground truths (whitespace ignored); used
    only while ``dapo_cli.rewards.math_dapo`` is unavailable.
    """
    matches = _ANSWER_RE.findall(response[-300:])
    return bool(matches) and "".join(matches[-1].split()) == str(answer)


def answer_checker() -> Callable[[str, int], bool]:
    """``check(response, answer) -> correct``: the DAPO verifier if present, else the local one."""
    try:
        from dapo_cli.rewards.math_dapo import compute_score
    except ImportError:
        return local_answer_check
    return lambda response, answer: bool(compute_score(response, str(answer))["acc"])


def sft_lr(step: int, cfg: TinyModelConfig) -> float:
    """Learning rate of 0-based ``step``: linear warm-up, then linear decay to 10%.

    .. math:: \\eta_s = \\eta \\cdot \\begin{cases} (s+1)/W & s < W \\\\
              1 - 0.9\\,(s-W)/\\max(1, S-W-1) & s \\ge W \\end{cases}

    with :math:`\\eta` = ``sft_lr``, ``W`` = ``sft_warmup_steps``, ``S`` = ``sft_steps``.
    """
    warm = cfg.sft_warmup_steps
    if step < warm:
        return cfg.sft_lr * (step + 1) / warm
    return cfg.sft_lr * (1.0 - 0.9 * (step - warm) / max(1, cfg.sft_steps - warm - 1))


def prompt_text(tokenizer: PreTrainedTokenizerBase, problem: str) -> str:
    """The templated prompt of a synthetic problem (a single user message)."""
    return format_prompt(tokenizer, [{"role": "user", "content": problem}])


def sft_batch(
    tokenizer: PreTrainedTokenizerBase, pairs: list[tuple[str, str]]
) -> dict[str, torch.Tensor]:
    """Right-padded training batch from ``(prompt, response)`` pairs; ``<eos>`` ends each response.

    Returns ``input_ids`` LongTensor [B, L], ``attention_mask`` LongTensor [B, L] and
    ``labels`` LongTensor [B, L] (= input ids on response tokens, :data:`IGNORE_INDEX`
    on prompt and padding; the model shifts them internally).
    """
    rows, labels = [], []
    for prompt, response in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        r = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + r)
        labels.append([IGNORE_INDEX] * len(p) + r)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id

    def padded(seqs: list[list[int]], value: int) -> torch.Tensor:
        return torch.tensor([s + [value] * (width - len(s)) for s in seqs], dtype=torch.long)

    return {
        "input_ids": padded(rows, pad),
        "attention_mask": padded([[1] * len(r) for r in rows], 0),
        "labels": padded(labels, IGNORE_INDEX),
    }


def sft_pairs(
    tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig
) -> Iterator[list[tuple[str, str]]]:
    """Endless deterministic stream of ``(prompt, response)`` batches of ``cfg.sft_batch_size``."""
    examples = iter_examples(cfg.task, cfg.seed, "train")
    style = random.Random(f"sft-direct/{cfg.seed}")
    while True:
        batch = []
        for _ in range(cfg.sft_batch_size):
            ex = next(examples)
            if style.random() < cfg.sft_direct_frac:
                response = ex.direct_solution
            elif cfg.sft_loop_frac > 0 and style.random() < cfg.sft_loop_frac:  # no draw when off: old builds unchanged
                response = looped_solution(ex.solution, style, cfg.sft_loop_continue, max_chars=cfg.sft_loop_max_chars)
            else:
                response = ex.solution
            batch.append((prompt_text(tokenizer, ex.problem), response))
        yield batch


def train_sft(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig, *, progress: bool
) -> float:
    """Run ``cfg.sft_steps`` AdamW steps (grad-norm clip 1.0); returns the last step's loss.

    ``progress``: steps done, the loss and an ETA on stderr (a bar on a terminal, else a line every 10%).
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
    batches = sft_pairs(tokenizer, cfg)
    model.train()
    loss_value = float("nan")
    with CountProgress("warm-start (SFT)", unit="steps", enabled=progress) as bar:
        bar.start(cfg.sft_steps)
        for step in range(cfg.sft_steps):
            for group in optimizer.param_groups:
                group["lr"] = sft_lr(step, cfg)
            loss = model(**sft_batch(tokenizer, next(batches))).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss_value = loss.item()
            bar.advance(1, info=f"loss {loss_value:.3f}")
    return loss_value


def measure_accuracy(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    examples: list[SyntheticExample],
    params: SamplingParams,
    check: Callable[[str, int], bool],
) -> float:
    """Share of ``examples`` whose single sampled response ``check`` accepts."""
    prompts = [prompt_text(tokenizer, ex.problem) for ex in examples]
    texts = engine.generate(prompts, 1, params).texts
    return sum(check(t, ex.answer) for t, ex in zip(texts, examples)) / max(1, len(examples))


def base_accuracy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig
) -> dict[str, float]:
    """Held-out accuracy at temperature 1.0 (seeded) and greedy on ``cfg.eval_problems`` val problems."""
    examples = generate_examples(cfg.task, cfg.eval_problems, cfg.seed, split="val")
    engine = build_policy_rollout("hf", model, tokenizer)  # transformers' generate, all prompts in one call
    check = answer_checker()
    t1 = SamplingParams(temperature=1.0, max_tokens=cfg.eval_max_tokens, seed=cfg.seed)
    greedy = SamplingParams(temperature=0.0, max_tokens=cfg.eval_max_tokens)
    return {
        "base_accuracy_t1": measure_accuracy(engine, tokenizer, examples, t1, check),
        "base_accuracy_greedy": measure_accuracy(engine, tokenizer, examples, greedy, check),
    }


def warm_start(cfg: TinyModelConfig, out_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """Build, train and save the tiny policy into ``out_dir``; returns what ``dapo_model.json`` holds.

    Deterministic given ``cfg`` (weights, data stream and sampling are seeded by
    ``cfg.seed``) on a given machine and thread count. ``out_dir`` receives the
    ``save_pretrained`` model and tokenizer plus :data:`MODEL_CARD`.
    """
    start = time.perf_counter()
    tokenizer = build_char_tokenizer()
    model = build_tiny_model_for(cfg, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        final_loss = train_sft(model, tokenizer, cfg, progress=progress)
    accuracy = base_accuracy(model, tokenizer, cfg)
    card = {
        "spec": "builtin:tiny",
        "fingerprint": cfg.fingerprint(),
        "format_version": TINY_FORMAT_VERSION,
        "config": asdict(cfg),
        "num_parameters": count_parameters(model),
        "sft_steps": cfg.sft_steps,
        "sft_final_loss": final_loss,
        **accuracy,
        "eval_problems": cfg.eval_problems,
        "eval_max_tokens": cfg.eval_max_tokens,
        "wall_time_s": round(time.perf_counter() - start, 2),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    out = Path(out_dir)
    save_policy(model, tokenizer, out)
    write_json_atomic(out / MODEL_CARD, card)
    return card


SHIPPED_TINY = Path(__file__).resolve().parent / "models" / "shipped" / "tiny"
"""The ``builtin:tiny`` policy of the default ``model.tiny`` settings as the package ships it: what
:func:`warm_start` wrote (weights, tokenizer, :data:`~dapo_cli.models.loading.MODEL_CARD`) when it built
them with ``dapo init-model --force -o dapo_cli/models/shipped/tiny`` on a 2-core AVX2 EPYC. The 600-step
warm-start costs 7-12 minutes on 2 cores (7 min 12 s on a quiet fresh machine, issue 34; 12 min 14 s here
beside other jobs), most of ``make demo`` before; copying this folder costs milliseconds.
``benchmarks/tiny_rebuild.py`` (``make bench``) rebuilds it and compares the weights byte for byte."""

SHIPPED_FILES = (
    "model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "chat_template.jinja", MODEL_CARD,
)
"""What :data:`SHIPPED_TINY` holds (package data, ``pyproject.toml``)."""


def shipped_policy(tiny: TinyModelConfig) -> Path | None:
    """:data:`SHIPPED_TINY` if it was built with exactly ``tiny`` (its card's fingerprint), else None."""
    card = SHIPPED_TINY / MODEL_CARD
    if not card.is_file():
        return None
    try:
        fingerprint = json.loads(card.read_text(encoding="utf-8")).get("fingerprint")
    except ValueError:
        return None
    return SHIPPED_TINY if fingerprint == tiny.fingerprint() else None


def ensure_model(spec: str, tiny: TinyModelConfig, cache_dir: Path | None = None, *, use_shipped: bool = True) -> Path:
    """:func:`~dapo_cli.models.loading.resolve_model`'s path for ``spec``, its weights there.

    ``builtin:tiny`` whose cache folder (``<cache_dir>/tiny-<tiny.fingerprint()>``) holds no
    :data:`~dapo_cli.models.loading.MODEL_CARD` yet is filled in a temporary sibling and renamed into
    place (an interrupted build leaves nothing behind), with one line on stderr saying how: a copy of
    the shipped policy when it has these settings (:func:`shipped_policy`; not with ``use_shipped=False``,
    ``dapo init-model --force``), else a warm-start. Other specs resolve as in ``resolve_model``
    (``gguf:NAME`` imported there when missing).
    """
    path = resolve_model(spec, tiny, cache_dir)
    if spec in BUILTIN_MODELS and not (path / MODEL_CARD).is_file():
        shipped = shipped_policy(tiny) if use_shipped else None
        if shipped is not None:
            print(f"installing the shipped {spec} (task {tiny.task}, {tiny.sft_steps} SFT steps; `dapo init-model --force` "
                  f"rebuilds it) into {path}", file=sys.stderr, flush=True)
            with atomic_dir(path) as tmp:
                for name in SHIPPED_FILES:
                    shutil.copyfile(shipped / name, tmp / name)
        else:
            print(f"building {spec} (task {tiny.task}, {tiny.sft_steps} SFT steps) into {path}", file=sys.stderr, flush=True)
            with atomic_dir(path) as tmp:
                warm_start(tiny, tmp)
    return path
