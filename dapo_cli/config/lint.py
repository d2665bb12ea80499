"""``dapo lint``: a resolved config compared with the DAPO paper and with known pitfalls.

Validation (:mod:`dapo_cli.config.validate`) rejects configs that cannot run; lint reads a
*valid* config and reports what is legal but not DAPO, or legal but likely a mistake.
Every rule is a small pure function ``(cfg) -> list[Finding]`` registered in :data:`RULES`
under a stable id (the id is stamped on its findings, so scripts can filter on it). One rule also
reads the machine ``dapo lint`` runs on (``reads_machine``: whether its CPU has native bf16
matmuls, :mod:`dapo_cli.hardware`); its check takes ``cpu=`` so tests give it a machine.

Severities:

* ``error``: the config breaks the paper's method (KL term on, a group filter that lets
  uniform-accuracy groups through, an inverted clip, a token mean that is not global, AdamW
  updates that round away). ``dapo lint`` exits 1.
* ``warn``: questionable or not the paper's choice (a technique off, an evaluation that is
  not the paper's protocol, a learning rate outside what the paper and the tiny-model
  measurements support). ``dapo lint`` exits 0 unless ``--strict``.

Sources: "paper" is Yu et al. 2025 (arXiv 2503.14476); "verl" is volcengine/verl's
``recipe/dapo`` (its README and ``run_dapo_qwen2.5_32b.sh``); "measured" values come from
the project's runs of the ~1 M-parameter ``builtin:tiny`` policy on 2 CPU cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dapo_cli.algo.importance import SAMPLER_LOGPROB_TOL
from dapo_cli.config.lint_base import ERROR, RULES, WARN, Finding, Rule, rule  # noqa: F401 (re-exported)
from dapo_cli.config.objectives import SEQUENCE_MEAN_LOSSES
from dapo_cli.config.schema import Config, behaviour_correction, old_log_probs_from_update
from dapo_cli.config.techniques import CLI_ORDER, PAPER_CLIP_RATIO_HIGH, PAPER_CLIP_RATIO_LOW, TECHNIQUE_BY_NAME, technique_state
from dapo_cli.hardware import CpuBf16, cpu_bf16

PAPER_EVAL_TOP_P = 0.7
"""Nucleus sampling of the paper's AIME evaluation (§4.1); training rollouts use 1.0."""

PAPER_UPDATES_PER_ROLLOUT = 16
"""Paper §4.1: 512 prompts per step, mini-batches of 32 prompts: 16 optimizer steps per rollout step."""


def lint(cfg: Config, *, cpu: CpuBf16 | None = None) -> list[Finding]:
    """All findings of every rule: errors first, then warnings, each in rule order.

    The rules compare a config with the decoupled-clip DAPO paper; with ``algo: direct-advantage``
    (the other DAPO, which has its own section and none of these techniques) there is nothing to compare.
    ``cpu``: the machine the rules that read one judge (None: this one, :func:`dapo_cli.hardware.cpu_bf16`).
    """
    if cfg.algo != "dapo":
        return []
    found = [f for check in RULES.values() for f in check(cfg, cpu=cpu)]
    return sorted(found, key=lambda f: f.severity != ERROR)


def summary(findings: list[Finding]) -> str:
    """``no findings`` or ``3 findings (1 error, 2 warnings)``."""
    if not findings:
        return "no findings"
    errors = sum(f.severity == ERROR for f in findings)
    warnings = len(findings) - errors
    return f"{_count(len(findings), 'finding')} ({_count(errors, 'error')}, {_count(warnings, 'warning')})"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def exit_code(findings: list[Finding], *, strict: bool = False) -> int:
    """1 when there is an error-level finding (or, with ``strict``, any finding), else 0."""
    if strict:
        return 1 if findings else 0
    return 1 if any(f.severity == ERROR for f in findings) else 0


def _g(value: float) -> str:
    return f"{value:g}"


# ---------------------------------------------------------------- the paper's objective


@rule("kl-on")
def kl_on(cfg: Config) -> list[Finding]:
    """``algorithm.use_kl_loss`` true: DAPO removes the KL penalty (paper §2.3), because a
    long-CoT policy must move far from its initial model. Error."""
    algo = cfg.algorithm
    if not algo.use_kl_loss:
        return []
    return [Finding(
        ERROR, "algorithm.use_kl_loss",
        f"the KL penalty to the initial policy is on (kl_loss_coef={_g(algo.kl_loss_coef)}); DAPO removes it (paper §2.3)",
        "set algorithm.use_kl_loss=false",
    )]


@rule("filter-on-shaped-reward")
def filter_on_shaped_reward(cfg: Config) -> list[Finding]:
    """Dynamic sampling on ``filter_groups.metric: score`` while the soft overlong
    punishment is on. The shaped reward is the ±1 score plus a length penalty, so it varies
    inside an all-correct or all-wrong group whenever lengths differ in the buffer: such
    groups pass the filter although DAPO keeps only 0 < #correct < G (paper §3.2). Error.
    (Without the punishment the shaped reward is the ±1 score and ``score`` filters exactly
    like ``acc``: no finding.)"""
    fg = cfg.algorithm.filter_groups
    if not (fg.enable and fg.metric == "score" and cfg.algorithm.overlong_buffer.enable):
        return []
    return [Finding(
        ERROR, "algorithm.filter_groups.metric",
        "dynamic sampling filters on the shaped reward, which the length penalty varies inside all-correct and "
        "all-wrong groups, so they are kept; DAPO keeps only groups with 0 < #correct < G",
        "set algorithm.filter_groups.metric=acc",
    )]


@rule("clip-inverted")
def clip_inverted(cfg: Config) -> list[Finding]:
    """ε_high < ε_low: the upper clip is tighter than the lower, the opposite of Clip-Higher
    (paper §3.1). Error. ε_high = ε_low is clip-higher *off* (how ``--no-clip-higher`` writes
    it, :mod:`dapo_cli.config.techniques`) and is reported by ``technique-off``. Validation
    rejects an inverted clip too, so ``dapo lint`` exits 2 on it before the rules run; the rule
    still guards configs built in code without validation."""
    algo = cfg.algorithm
    if not algo.clip_inverted:
        return []
    return [Finding(
        ERROR, "algorithm.clip_ratio_high",
        f"epsilon_high={algo.clip_ratio_high} < epsilon_low={algo.clip_ratio_low}: the upper clip is tighter "
        "than the lower one, the opposite of Clip-Higher",
        f"set algorithm.clip_ratio_high >= clip_ratio_low (paper: {PAPER_CLIP_RATIO_HIGH} vs {PAPER_CLIP_RATIO_LOW})",
    )]


@rule("loss-norm-micro-batch")
def loss_norm_micro_batch(cfg: Config) -> list[Finding]:
    """``loss_agg_mode: token-mean`` with ``loss_norm: micro_batch``: each micro-batch is
    averaged over its own tokens, so the loss is not one token mean over the mini-batch
    (paper §3.3): tokens of micro-batches with few tokens weigh more, and the gradient
    depends on ``ppo_micro_batch_size`` and the world size. Error."""
    algo = cfg.algorithm
    if not (algo.loss_agg_mode == "token-mean" and algo.loss_norm == "micro_batch"):
        return []
    return [Finding(
        ERROR, "algorithm.loss_norm",
        "token-mean normalised per micro-batch is not a token mean over the mini-batch: tokens of short "
        "micro-batches weigh more and the gradient depends on ppo_micro_batch_size and the world size",
        "set algorithm.loss_norm=mini_batch",
    )]


@rule("technique-off")
def technique_off(cfg: Config) -> list[Finding]:
    """One warning per DAPO technique that is off (Clip-Higher, dynamic sampling,
    token-level loss, soft overlong punishment), as :func:`technique_state` defines them:
    fine for an ablation rung, not DAPO. Overlong *filtering* is not among them: the paper's
    best run does without it (verl recipe/dapo README). An inverted clip is
    ``clip-inverted`` instead. Clip-higher is not judged when ``algorithm.policy_loss`` is not ``dapo`` (that loss
    does not read DAPO's clip: ``setting-ignored``), nor the token-level loss under ``gspo`` or ``gmpo``
    (``sequence-loss-aggregation``)."""
    state = technique_state(cfg)
    algo = cfg.algorithm
    out = []
    for t in (TECHNIQUE_BY_NAME[name] for name in CLI_ORDER):  # the order of the flags in --help
        technique, key, what, fix = t.name, t.lint_key, t.lint_off, f"set {t.lint_key}={t.lint_on} (--{t.flag})"
        if state[technique] or not key:
            continue
        if technique == "clip_higher" and (algo.clip_inverted or algo.policy_loss != "dapo"):
            continue  # inverted: clip-inverted; another loss does not read DAPO's clip: setting-ignored
        if technique == "token_level_loss" and algo.policy_loss in SEQUENCE_MEAN_LOSSES:
            continue  # their own objective is the sequence mean: sequence-loss-aggregation
        if technique == "token_level_loss":
            what = f"loss_agg_mode={algo.loss_agg_mode}: " + what
        out.append(Finding(WARN, key, what, fix))
    return out


@rule("overlong-filter-with-shaping")
def overlong_filter_with_shaping(cfg: Config) -> list[Finding]:
    """Overlong filtering and the soft overlong punishment both on. Filtering drops truncated
    responses from the loss, so the policy never learns from the responses the punishment
    is about; DAPO's ladder uses filtering as an intermediate rung (paper Table 1) and its
    best run uses the punishment alone (verl recipe/dapo README). Warning."""
    algo = cfg.algorithm
    if not (algo.overlong_filter and algo.overlong_buffer.enable):
        return []
    return [Finding(
        WARN, "algorithm.overlong_filter",
        "overlong filtering drops truncated responses from the loss while the soft overlong punishment is on, hiding "
        "the length signal it gives; the paper's best run uses the punishment alone",
        "set algorithm.overlong_filter=false (--no-overlong-filtering)",
    )]


# ---------------------------------------------------------------- sampling and evaluation


@rule("rollout-truncated-sampling")
def rollout_truncated_sampling(cfg: Config) -> list[Finding]:
    """``rollout.top_p < 1`` or ``rollout.top_k > 0`` in *training* rollouts. The trainer's
    log-probs (π_old, π_θ) are of the untruncated distribution, but the responses were drawn
    from the truncated one, so the importance ratio is off by the kept probability mass
    (huggingface/trl issue 6789); with ``algorithm.rollout_is`` on, the correction weight
    itself carries that factor. The paper samples training rollouts at top-p 1.0 (verl:
    top_p=1.0, top_k=-1). Warning, one per key."""
    r = cfg.rollout
    bias = ("the trainer's log-probs are of the untruncated distribution, so the importance ratio is off by the "
            "kept probability mass")
    if cfg.algorithm.rollout_is.enable:
        bias += ", and the algorithm.rollout_is weights carry that factor too"
    out = []
    if r.top_p < 1.0:
        out.append(Finding(WARN, "rollout.top_p", f"training rollouts sample with top_p={r.top_p}: {bias}",
                           "set rollout.top_p=1.0 (truncate only at evaluation)"))
    if r.top_k > 0:
        out.append(Finding(WARN, "rollout.top_k", f"training rollouts sample with top_k={r.top_k}: {bias}",
                           "set rollout.top_k=0 (truncate only at evaluation)"))
    return out


@rule("eval-tied-to-rollout")
def eval_tied_to_rollout(cfg: Config) -> list[Finding]:
    """``validation`` or ``eval`` sampling *tied* to training: the same temperature and the
    same top-p as ``rollout``, with the rollout at top-p 1.0. That is the state a config
    reaches by copying the training sampling into evaluation (one revision of verl's 32B
    script passed ``val_kwargs.top_p=${top_p}``), and it evaluates the untruncated distribution instead of the paper's
    protocol (temperature 1.0, top-p 0.7, §4.1), so avg@k is not comparable with the paper.
    A deliberately different protocol (another temperature, or any top-p < 1) is not
    flagged, nor is a truncated rollout (``rollout-truncated-sampling`` covers it). Warning,
    one per section."""
    r = cfg.rollout
    if r.top_p != 1.0:
        return []
    out = []
    for section in ("validation", "eval"):
        s = getattr(cfg, section)
        if s.temperature == r.temperature and s.top_p == r.top_p:
            out.append(Finding(
                WARN, f"{section}.top_p",
                f"{section} samples exactly like training (temperature {s.temperature}, top_p 1.0), not with the "
                f"paper's evaluation top-p {PAPER_EVAL_TOP_P}: its avg@k is not comparable with the paper's",
                f"set {section}.top_p={PAPER_EVAL_TOP_P} (paper §4.1)",
            ))
    return out


EXHAUSTION_CAPACITY = 3.0
"""Fewest train batches' worth of prompts dynamic sampling should be allowed to draw per step.

With capacity ``c`` (= ``max_num_gen_batches × per-round prompts / train_batch_size``) a
step fills only while at least ``1/c`` of the groups are informative. Measured on the tiny
ladder: 44-75% informative in the first steps, ~47% on average, and only 1-3 of 16 once
accuracy passes 90%; verl ships ``gen_batch_size = 3 × train_batch_size`` and
``max_num_gen_batches = 10`` (c = 30). ``c < 3`` (a step needs more than a third of its
groups informative) is flagged: conservative, it misses configs that exhaust only late."""


@rule("dynamic-sampling-exhausts")
def dynamic_sampling_exhausts(cfg: Config) -> list[Finding]:
    """Dynamic sampling on with a finite ``max_num_gen_batches`` whose capacity
    (rounds × ``gen_batch_size`` (or ``train_batch_size``) / ``train_batch_size``) is below
    :data:`EXHAUSTION_CAPACITY`, e.g. ``max_num_gen_batches <= 2`` with ``gen_batch_size`` =
    ``train_batch_size``. Steps then often run out of rounds: with ``on_exhausted: train``
    they train on a smaller, noisier batch; with ``error`` the run stops. Warning."""
    fg, data = cfg.algorithm.filter_groups, cfg.data
    if not fg.enable or fg.max_num_gen_batches <= 0:
        return []
    per_round = data.prompts_per_round
    capacity = fg.max_num_gen_batches * per_round / data.train_batch_size
    if capacity >= EXHAUSTION_CAPACITY:
        return []
    then = "the run stops with an error" if fg.on_exhausted == "error" else "the step trains on fewer groups"
    return [Finding(
        WARN, "algorithm.filter_groups.max_num_gen_batches",
        f"dynamic sampling may draw only {fg.max_num_gen_batches} rounds × {per_round} prompts = {capacity:.3g}× "
        f"train_batch_size per step, so a step fills only while >= {1 / capacity:.0%} of the groups are informative "
        f"(often fewer once accuracy is high); then {then}",
        "raise algorithm.filter_groups.max_num_gen_batches (verl: 10) or data.gen_batch_size (verl: 3× train_batch_size)",
    )]


# ---------------------------------------------------------------- optimisation


@rule("one-update-per-rollout")
def one_update_per_rollout(cfg: Config) -> list[Finding]:
    """One optimizer step per rollout (``train_batch_size / ppo_mini_batch_size ×
    ppo_epochs == 1``): the update starts from the policy that sampled, so the importance
    ratio is exactly 1 and no clip, Clip-Higher included, ever acts (measured on the tiny
    model). The paper takes 16 updates per rollout step (§4.1). Warning."""
    t = cfg.trainer
    updates = cfg.data.train_batch_size // t.ppo_mini_batch_size * t.ppo_epochs
    if updates != 1:
        return []
    return [Finding(
        WARN, "trainer.ppo_mini_batch_size",
        f"one optimizer step per rollout (train_batch_size {cfg.data.train_batch_size} = ppo_mini_batch_size, "
        "ppo_epochs 1): the importance ratio stays exactly 1, so the clip and Clip-Higher never act",
        f"use several mini-batches, e.g. ppo_mini_batch_size = train_batch_size / {PAPER_UPDATES_PER_ROLLOUT} "
        f"(paper: {PAPER_UPDATES_PER_ROLLOUT} updates per step)",
    )]


HALF_DTYPE_LOSSLESS_LR = 1e-4
"""Below this lr, AdamW on bf16 weights loses most updates (measured: weights ~N(0, 0.02),
one AdamW step changes 15% of them at lr 1e-5 and 89% at 1e-4; 16 steps at 1e-6 change 2%)."""


@rule("bf16-pure-adamw")
def bf16_pure_adamw(cfg: Config) -> list[Finding]:
    """The torch engine with ``model.dtype`` bfloat16 or float16: it keeps no fp32 master
    copy, so AdamW updates the half-precision weights in place and steps of about ``lr``
    below the dtype's resolution (bf16: ~2^-8 of the weight) round away. Error when
    ``lr < 1e-4`` (:data:`HALF_DTYPE_LOSSLESS_LR`; the paper's 1e-6 changes almost nothing),
    warning above. DeepSpeed's bf16 mode keeps fp32 master weights: no finding."""
    dtype = cfg.model.dtype
    if cfg.engine.name != "torch" or dtype not in ("bfloat16", "float16"):
        return []
    lr = cfg.trainer.lr
    if lr < HALF_DTYPE_LOSSLESS_LR:
        severity, lost = ERROR, f"updates of about lr={_g(lr)} are below {dtype}'s resolution for most weights and round away"
    else:
        severity, lost = WARN, f"updates smaller than {dtype}'s resolution for a weight round away (at lr={_g(lr)}, some do)"
    return [Finding(
        severity, "model.dtype",
        f"the torch engine runs AdamW on the {dtype} weights themselves (no fp32 master copy): {lost}",
        "use model.dtype=float32 (with engine.autocast=bfloat16 for bf16 matmuls) or engine.name=deepspeed "
        "(keeps fp32 master weights)",
    )]


@rule("autocast-needs-float32")
def autocast_needs_float32(cfg: Config) -> list[Finding]:
    """``engine.autocast`` is the torch engine's mixed precision over float32 parameters. With
    DeepSpeed it is refused when the config loads (error here for configs built without validation);
    over bfloat16/float16 parameters it changes nothing:
    the matmuls already run in that dtype and there is still no fp32 master copy (warning)."""
    if cfg.engine.autocast == "none":
        return []
    if cfg.engine.name == "deepspeed":
        return [Finding(
            ERROR, "engine.autocast", "the DeepSpeed engine refuses engine.autocast (the torch engine's mixed precision)",
            "set model.dtype=bfloat16 (DeepSpeed's bf16 mode, fp32 master weights) and engine.autocast=none",
        )]
    if cfg.model.dtype != "float32":
        return [Finding(
            WARN, "engine.autocast", f"autocast changes nothing over {cfg.model.dtype} parameters: the matmuls already run "
            f"in {cfg.model.dtype} and AdamW still updates the {cfg.model.dtype} weights themselves",
            "use model.dtype=float32 with engine.autocast=bfloat16 (float32 weights and AdamW, bf16 matmuls)",
        )]
    return []


BF16_SAMPLER_GAP = ("measured on SmolLM2-135M: |w - 1| 2.7e-2 on average (float32: 1.6e-5), up to 0.21, beyond 1e-3 on 89% "
                    "of the tokens; docs/performance.md, bf16 autocast: log-prob gap")
"""|π_old / π_rollout − 1| with a bf16-autocast trainer and the float32 fast sampler, 4 x 4 responses of <= 32 tokens
(``benchmarks/bf16_logprob_gap.py --real``; on the ~1 M random model 1.2e-3 on average, up to 4e-3)."""

BF16_SPLIT_GAP = ("measured on SmolLM2-135M, the same rows in one forward or in two: |r - 1| 1.4e-2 on average, up to 0.36, "
                  "0.4% of the tokens beyond the clip; docs/performance.md, bf16 autocast: log-prob gap")
"""|π_θ / π_old − 1| at θ = θ_old with bf16 autocast and the shared-prompt forward when the old-log-prob pass and the
update group rows differently (``benchmarks/bf16_logprob_gap.py --real``; float32: exactly 0; the ~1 M random model: 0)."""


@rule("autocast-ratio")
def autocast_ratio(cfg: Config) -> list[Finding]:
    """``engine.autocast: bfloat16`` (torch engine, float32 parameters) where it moves an importance ratio beyond
    the 1e-5 the float32 sampler is tested to match the trainer within (:data:`~dapo_cli.algo.importance.SAMPLER_LOGPROB_TOL`).
    Warning, one per ratio:

    * the loss weights tokens by min(π_old / π_rollout, C) (``algorithm.rollout_is``, or the decoupled objective of
      ``rollout.max_staleness > 0``: ``schema.behaviour_correction``): π_old is the trainer's bf16 forward, π_rollout
      the sampler's float32 one, so the weights carry bf16 rounding (:data:`BF16_SAMPLER_GAP`);
    * the old log-probs come from a separate no-grad pass (``schema.old_log_probs_from_update`` false: several
      optimizer steps per batch, or the KL term) with the shared-prompt forward: under bf16 its log-probs depend on
      which prompts share a forward, and that pass groups rows unlike the update's micro-batches, so the PPO ratio
      π_θ / π_old is not 1 at θ = θ_old (:data:`BF16_SPLIT_GAP`). Not when ``ppo_micro_batch_size`` divides
      ``rollout.n`` (every forward of both passes holds one prompt's rows), nor with the plain forward (its bf16
      log-probs measured the same in any grouping).

    Not flagged: one optimizer step per batch without the correction (π_old is the update's own forward: the
    ratio is exactly 1; the sampler's log-probs only feed ``rollout/logprob_diff_*``, which then read the bf16 gap)."""
    e = cfg.engine
    if e.name != "torch" or e.autocast != "bfloat16" or cfg.model.dtype != "float32":
        return []
    out = []
    if behaviour_correction(cfg):
        if cfg.rollout.max_staleness > 0:
            what = (f"asynchronous rollouts (rollout.max_staleness={cfg.rollout.max_staleness}) weight each token by "
                    "min(pi_prox / pi_behav, C)")
            fix = "set engine.autocast=none (the weights then measure staleness alone)"
        else:
            what = "algorithm.rollout_is weights each token by min(pi_old / pi_rollout, C)"
            fix = ("set engine.autocast=none, or algorithm.rollout_is.enable=false (under autocast it corrects the trainer's "
                   "own rounding, not the sampler)")
        out.append(Finding(
            WARN, "engine.autocast",
            f"{what}, pi_old from the trainer's bf16 forward and pi_rollout from the {cfg.rollout.engine} sampler in "
            f"float32: the weights carry bf16 rounding, far beyond the {SAMPLER_LOGPROB_TOL:g} the float32 sampler is "
            f"tested to match the trainer within ({BF16_SAMPLER_GAP})", fix,
        ))
    one_prompt_per_forward = cfg.rollout.n % cfg.trainer.ppo_micro_batch_size == 0  # in both passes: same log-probs
    if e.shared_prompt_forward and not old_log_probs_from_update(cfg) and not one_prompt_per_forward:
        out.append(Finding(
            WARN, "engine.autocast",
            "the old log-probs come from a separate pass that groups rows into forwards unlike the update, and under bf16 "
            "the shared-prompt forward's log-probs depend on which prompts share a forward: the PPO ratio pi_theta / "
            f"pi_old is not 1 at theta = theta_old ({BF16_SPLIT_GAP})",
            "set engine.autocast=none, or engine.shared_prompt_forward=false (its bf16 log-probs did not depend on the grouping)",
        ))
    return out


BF16_EMULATED_SLOWDOWN = ("measured on an AVX2-only EPYC: the bf16-autocast forward 1.8x (SmolLM2-135M) and 4.2x (the 1 M "
                          "model) slower than float32, where a CPU with avx512_bf16 ran the bf16 update 1.5-1.7x faster; "
                          "docs/performance.md")
"""bf16 autocast on CPUs without and with native bf16 matmuls (``benchmarks/bf16_logprob_gap.py --real``,
``benchmarks/update_throughput.py``)."""


@rule("bf16-emulated-cpu", reads_machine=True)
def bf16_emulated_cpu(cfg: Config, cpu: CpuBf16 | None) -> list[Finding]:
    """The torch engine on ``engine.device: cpu`` with bf16 matmuls (``engine.autocast: bfloat16`` or a
    ``model.dtype: bfloat16`` policy) while *the machine running lint* has no native bf16 matmuls
    (no ``avx512_bf16`` / ``amx_bf16``, :mod:`dapo_cli.hardware`): torch emulates them there, several times slower
    than float32 (:data:`BF16_EMULATED_SLOWDOWN`). Not a property of the config: the same file lints clean on
    a CPU with them, and when the CPU cannot be read (another OS or architecture) nothing is said. ``device:
    auto`` is not judged (lint does not probe for CUDA). Warning."""
    e = cfg.engine
    if e.name != "torch" or e.device != "cpu" or "bfloat16" not in (e.autocast, cfg.model.dtype):
        return []
    cpu = cpu or cpu_bf16()
    if cpu.native is not False:
        return []
    key, what, fix = ("engine.autocast", "engine.autocast=bfloat16", "set engine.autocast=none") if e.autocast == "bfloat16" \
        else ("model.dtype", "model.dtype=bfloat16", "set model.dtype=float32")
    return [Finding(
        WARN, key,
        f"this machine's CPU (the one running dapo lint: {cpu.detail}) emulates bf16 matmuls, so {what} on "
        f"engine.device=cpu is slower than float32 here ({BF16_EMULATED_SLOWDOWN})",
        f"{fix} to train on this machine; keep bf16 for a CPU with avx512_bf16 or amx_bf16",
    )]


TINY_LR_UNSTABLE = 3e-4
"""``builtin:tiny`` lr at and above which training was measured unstable (3e-4 on one
warm-start; 1e-3 collapsed the policy to 0% accuracy within 3 steps). 1e-4 learned in
minutes in 9 of 9 runs; 5e-5 learned about half as fast."""

LLM_LR_RANGE = (1e-7, 1e-5)
"""lr band for a real LLM: one decade either side of the paper's 1e-6 for Qwen2.5-32B
(§4.1; verl's 7B and 32B DAPO scripts use 1e-6 too). The band is a judgment, not a
measurement: nothing supports RL fine-tuning of a pretrained LLM outside it."""


@rule("vllm-sleep-on-cpu")
def vllm_sleep_on_cpu(cfg: Config) -> list[Finding]:
    """vLLM's CPU build has no sleep mode (``enable_sleep_mode`` raises there, ``sleep()`` does
    nothing): on ``engine.device=cpu`` a vLLM rollout engine stays awake through the update, holding
    its KV cache (``rollout.gpu_memory_utilization`` of the NUMA node's memory) beside the trainer.
    With ``engine.device=auto`` the run itself says so once, from vLLM's platform."""
    r = cfg.rollout
    if r.engine != "vllm" or r.sleep_level == 0 or cfg.engine.device != "cpu":
        return []
    return [Finding(
        WARN, "rollout.sleep_level", f"vLLM's CPU platform has no sleep mode: rollout.sleep_level={r.sleep_level} acts as 0 "
        f"and the engine keeps its KV cache ({_g(r.gpu_memory_utilization)} of the NUMA node's memory) through the update",
        "set rollout.sleep_level=0 to say so, and size rollout.gpu_memory_utilization so the trainer fits beside it",
    )]


@rule("logits-unchunked")
def logits_unchunked(cfg: Config) -> list[Finding]:
    """``engine.logprob_chunk: 0`` (torch or DeepSpeed engine) holds every micro-batch's [tokens, vocabulary] float32
    logits (~12 bytes a token per vocabulary entry with their copies) where chunks give the same log-probs
    (``dapo train --dry-run`` prints both sizes)."""
    t = cfg.trainer
    if cfg.engine.logprob_chunk > 0:
        return []
    tokens = t.ppo_micro_batch_size * (cfg.rollout.max_response_length + 1)
    return [Finding(
        WARN, "engine.logprob_chunk", f"engine.logprob_chunk=0 keeps the full logits of up to {tokens} tokens per "
        "micro-batch (tokens × vocabulary × ~12 bytes; --dry-run prints both sizes)",
        "remove the setting (chunks give the same log-probs to float32 rounding), or set engine.logprob_chunk=1024",
    )]


def is_tiny_model(path: str) -> bool:
    """``builtin:tiny``, or a directory holding the tiny model's ``dapo_model.json``
    (``dapo init-model`` output, a tiny run's checkpoint or its ``model/``).

    Reads the file system only to look for that file."""
    if path.startswith("builtin:"):
        return path == "builtin:tiny"
    p = Path(path).expanduser()
    return any((d / "dapo_model.json").is_file() for d in (p, p / "model"))


@rule("lr-range")
def lr_range(cfg: Config) -> list[Finding]:
    """``trainer.lr`` outside what supports it, by model size. ``builtin:tiny`` (or a
    directory of it): lr >= 3e-4 (:data:`TINY_LR_UNSTABLE`, measured). Any other model (a
    hub id or a save_pretrained directory, taken to be a real LLM): lr outside
    [1e-7, 1e-5] (:data:`LLM_LR_RANGE`, around the paper's 1e-6). Warning."""
    lr, path = cfg.trainer.lr, cfg.model.path
    if is_tiny_model(path):
        if lr < TINY_LR_UNSTABLE:
            return []
        return [Finding(
            WARN, "trainer.lr",
            f"lr={_g(lr)} for the tiny policy: measured, 3e-4 was unstable and 1e-3 collapsed it to 0% within 3 steps",
            "set trainer.lr=1e-4 (measured to learn within minutes)",
        )]
    low, high = LLM_LR_RANGE
    if low <= lr <= high:
        return []
    side = "above" if lr > high else "below"
    return [Finding(
        WARN, "trainer.lr",
        f"lr={_g(lr)} for {path} is {side} [{_g(low)}, {_g(high)}], a decade either side of the paper's 1e-6 for Qwen2.5-32B",
        "set trainer.lr=1e-6 (paper §4.1)",
    )]


def findings_json(findings: list[Finding]) -> list[dict[str, Any]]:
    """The findings as plain dicts (``dapo lint --json``)."""
    return [f.to_dict() for f in findings]


from dapo_cli.config import lint_objectives  # noqa: E402,F401  (registers its rules after this module's)
from dapo_cli.config import lint_ablation  # noqa: E402,F401  (registers its rules after lint_objectives')
