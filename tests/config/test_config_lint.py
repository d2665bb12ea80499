"""Lint rules, one by one: a config that triggers each rule and one that does not.

The base config is the paper's 32B preset, which lints clean; each case changes only
what the rule is about, and checks the rule's own function (``RULES[id]``) so another
rule firing on the same change cannot make the test pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dapo_cli.config import apply_techniques, load_config
from dapo_cli.config.load import build_config
from dapo_cli.hardware import CpuBf16, parse_cpu_bf16
from dapo_cli.config.lint import (
    ERROR,
    RULES,
    WARN,
    Finding,
    exit_code,
    findings_json,
    is_tiny_model,
    lint,
    summary,
)

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "experiments" / "dapo-qwen2.5-32b.yaml"
PRESETS = ["dapo-qwen2.5-32b.yaml", "dapo-qwen2.5-7b.yaml", "dapo-qwen2.5-1.5b.yaml"]


def paper(*overrides: str):
    # an inverted clip and autocast with DeepSpeed (the paper config's engine) are rejected by
    # validation (so `dapo lint` exits 2 on them); the rules are still checked on a config built
    # without validation
    invalid = any(o.startswith("algorithm.clip_ratio_high=0.1") for o in overrides) or (
        "engine.autocast=bfloat16" in overrides and not any(o.startswith("engine.name=") for o in overrides)
    )
    return (build_config if invalid else load_config)(PAPER, overrides)


def tiny(*overrides: str):
    return load_config(REPO / "experiments" / "tiny.yaml", overrides)


EMULATED_BF16 = parse_cpu_bf16("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
NATIVE_BF16 = parse_cpu_bf16("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 amx_bf16\n")
"""Fake machines for the rule that reads one (``bf16-emulated-cpu``): an AVX2-only CPU and one with bf16."""


def run(rule_id: str, cfg, cpu: CpuBf16 = EMULATED_BF16) -> list[Finding]:
    found = RULES[rule_id](cfg, cpu=cpu)
    assert all(f.id == rule_id for f in found)
    return found


AUTOCAST = ["engine.name=torch", "model.dtype=float32", "engine.autocast=bfloat16"]
"""The torch engine's bf16 mixed precision over float32 parameters."""
ONE_STEP = ["data.gen_batch_size=0", "trainer.ppo_mini_batch_size=512"]
"""One optimizer step per batch (one mini-batch of every trained group): old log-probs from the update's own forward."""

# (rule id, overrides that trigger it, expected (severity, key) of each finding)
TRIGGERS = [
    ("kl-on", ["algorithm.use_kl_loss=true"], [(ERROR, "algorithm.use_kl_loss")]),
    ("filter-on-shaped-reward", ["algorithm.filter_groups.metric=score"], [(ERROR, "algorithm.filter_groups.metric")]),
    ("clip-inverted", ["algorithm.clip_ratio_high=0.1"], [(ERROR, "algorithm.clip_ratio_high")]),
    ("loss-norm-micro-batch", ["algorithm.loss_norm=micro_batch"], [(ERROR, "algorithm.loss_norm")]),
    ("technique-off", ["algorithm.clip_ratio_high=0.2"], [(WARN, "algorithm.clip_ratio_high")]),
    ("technique-off", ["algorithm.filter_groups.enable=false"], [(WARN, "algorithm.filter_groups.enable")]),
    ("technique-off", ["algorithm.loss_agg_mode=seq-mean-token-sum"], [(WARN, "algorithm.loss_agg_mode")]),
    ("technique-off", ["algorithm.overlong_buffer.enable=false"], [(WARN, "algorithm.overlong_buffer.enable")]),
    ("overlong-filter-with-shaping", ["algorithm.overlong_filter=true"], [(WARN, "algorithm.overlong_filter")]),
    ("rollout-truncated-sampling", ["rollout.top_p=0.9"], [(WARN, "rollout.top_p")]),
    ("rollout-truncated-sampling", ["rollout.top_k=20"], [(WARN, "rollout.top_k")]),
    ("rollout-truncated-sampling", ["rollout.top_p=0.95", "rollout.top_k=50"], [(WARN, "rollout.top_p"), (WARN, "rollout.top_k")]),
    ("eval-tied-to-rollout", ["validation.top_p=1.0"], [(WARN, "validation.top_p")]),
    ("eval-tied-to-rollout", ["eval.top_p=1.0"], [(WARN, "eval.top_p")]),
    (
        "eval-tied-to-rollout",
        ["rollout.temperature=0.8", "validation.temperature=0.8", "validation.top_p=1", "eval.temperature=0.8", "eval.top_p=1"],
        [(WARN, "validation.top_p"), (WARN, "eval.top_p")],
    ),
    ("dynamic-sampling-exhausts", ["data.gen_batch_size=0", "algorithm.filter_groups.max_num_gen_batches=2"],
     [(WARN, "algorithm.filter_groups.max_num_gen_batches")]),
    ("dynamic-sampling-exhausts", ["data.gen_batch_size=1024", "algorithm.filter_groups.max_num_gen_batches=1"],
     [(WARN, "algorithm.filter_groups.max_num_gen_batches")]),
    ("one-update-per-rollout", ["trainer.ppo_mini_batch_size=512"], [(WARN, "trainer.ppo_mini_batch_size")]),
    ("bf16-pure-adamw", ["engine.name=torch"], [(ERROR, "model.dtype")]),
    ("bf16-pure-adamw", ["engine.name=torch", "model.dtype=float16"], [(ERROR, "model.dtype")]),
    ("bf16-pure-adamw", ["engine.name=torch", "trainer.lr=1e-4"], [(WARN, "model.dtype")]),
    ("autocast-needs-float32", ["engine.autocast=bfloat16"], [(ERROR, "engine.autocast")]),
    ("autocast-needs-float32", ["engine.name=torch", "engine.autocast=bfloat16"], [(WARN, "engine.autocast")]),
    ("vllm-sleep-on-cpu", ["rollout.engine=vllm", "engine.device=cpu"], [(WARN, "rollout.sleep_level")]),
    ("logits-unchunked", ["engine.logprob_chunk=0", "engine.name=torch"], [(WARN, "engine.logprob_chunk")]),
    ("logits-unchunked", ["engine.logprob_chunk=0", "engine.name=deepspeed"], [(WARN, "engine.logprob_chunk")]),  # it chunks too
    # the truncated-IS / decoupled weights against the float32 sampler, with one optimizer step per batch
    ("autocast-ratio", [*AUTOCAST, *ONE_STEP, "algorithm.rollout_is.enable=true"], [(WARN, "engine.autocast")]),
    ("autocast-ratio", [*AUTOCAST, *ONE_STEP, "rollout.engine=fast", "rollout.max_staleness=1"], [(WARN, "engine.autocast")]),
    # a separate old-log-prob pass grouping several prompts per forward: the PPO ratio at theta_old
    ("autocast-ratio", [*AUTOCAST, "trainer.ppo_micro_batch_size=32"], [(WARN, "engine.autocast")]),
    ("autocast-ratio", [*AUTOCAST, "trainer.ppo_micro_batch_size=24", *ONE_STEP, "algorithm.use_kl_loss=true"], [(WARN, "engine.autocast")]),
    ("autocast-ratio", [*AUTOCAST, "trainer.ppo_micro_batch_size=32", "algorithm.rollout_is.enable=true"],
     [(WARN, "engine.autocast"), (WARN, "engine.autocast")]),
    ("bf16-emulated-cpu", [*AUTOCAST, "engine.device=cpu"], [(WARN, "engine.autocast")]),
    ("bf16-emulated-cpu", ["engine.name=torch", "engine.device=cpu"], [(WARN, "model.dtype")]),  # the preset's bf16 policy
    ("lr-range", ["trainer.lr=1e-4"], [(WARN, "trainer.lr")]),
    ("lr-range", ["trainer.lr=5e-8"], [(WARN, "trainer.lr")]),
    # a setting the chosen loss or correction does not read
    ("setting-ignored", ["algorithm.policy_loss=gspo", "algorithm.clip_ratio_c=3.0"], [(WARN, "algorithm.clip_ratio_c")]),
    ("setting-ignored", ["algorithm.gspo.clip_ratio_low=0.001"], [(WARN, "algorithm.gspo.clip_ratio_low")]),
    ("setting-ignored", ["algorithm.policy_loss=gspo", "algorithm.cispo.clip_ratio_high=1.0"], [(WARN, "algorithm.cispo.clip_ratio_high")]),
    ("setting-ignored", ["algorithm.gmpo.log_clip_high=0.2"], [(WARN, "algorithm.gmpo.log_clip_high")]),
    ("setting-ignored", ["algorithm.rollout_is.enable=true", "algorithm.rollout_is.mode=geo_mask", "algorithm.rollout_is.cap=3"],
     [(WARN, "algorithm.rollout_is.cap")]),
    ("setting-ignored", ["algorithm.rollout_is.enable=true", "algorithm.rollout_is.opsm_delta=0.01"], [(WARN, "algorithm.rollout_is.opsm_delta")]),
    ("setting-ignored", ["algorithm.rollout_is.mode=opsm", "algorithm.rollout_is.opsm_delta=0.01"],
     [(WARN, "algorithm.rollout_is.mode"), (WARN, "algorithm.rollout_is.opsm_delta")]),  # no correction runs
    ("sequence-loss-aggregation", ["algorithm.policy_loss=gspo"], [(WARN, "algorithm.loss_agg_mode")]),
    # 8 steps validated every 4: steps 0, 4, 8, three points (the real-model ladder as run)
    ("curve-fit-points", ["ablate.seeds=3", "trainer.total_steps=8", "trainer.test_freq=4"], [(WARN, "trainer.test_freq")]),
    ("curve-fit-points", ["ablate.seeds=2", "trainer.total_steps=8", "trainer.test_freq=0"], [(WARN, "trainer.test_freq")]),
    ("sequence-loss-aggregation", ["algorithm.policy_loss=gmpo", "algorithm.loss_agg_mode=seq-mean-token-sum-norm"],
     [(WARN, "algorithm.loss_agg_mode")]),
]

# (rule id, overrides close to a trigger that must not trigger it)
NON_TRIGGERS = [
    ("kl-on", ["algorithm.kl_loss_coef=0.5"]),
    ("filter-on-shaped-reward", ["algorithm.filter_groups.metric=score", "algorithm.overlong_buffer.enable=false"]),
    ("filter-on-shaped-reward", ["algorithm.filter_groups.metric=score", "algorithm.filter_groups.enable=false"]),
    ("clip-inverted", ["algorithm.clip_ratio_high=0.2"]),
    ("clip-inverted", ["algorithm.clip_ratio_low=0.1", "algorithm.clip_ratio_high=0.15"]),
    ("loss-norm-micro-batch", ["algorithm.loss_norm=micro_batch", "algorithm.loss_agg_mode=seq-mean-token-mean"]),
    ("technique-off", ["algorithm.overlong_filter=true"]),
    ("technique-off", ["algorithm.clip_ratio_high=0.3"]),
    ("overlong-filter-with-shaping", ["algorithm.overlong_filter=true", "algorithm.overlong_buffer.enable=false"]),
    ("rollout-truncated-sampling", ["validation.top_p=0.5", "eval.top_p=0.5"]),
    ("eval-tied-to-rollout", ["validation.top_p=1.0", "validation.temperature=0.6"]),
    ("eval-tied-to-rollout", ["rollout.top_p=0.7"]),
    ("eval-tied-to-rollout", ["eval.top_p=0.95", "validation.top_p=0.95"]),
    ("dynamic-sampling-exhausts", ["data.gen_batch_size=0", "algorithm.filter_groups.max_num_gen_batches=3"]),
    ("dynamic-sampling-exhausts", ["data.gen_batch_size=0", "algorithm.filter_groups.max_num_gen_batches=0"]),
    ("dynamic-sampling-exhausts", ["data.gen_batch_size=0", "algorithm.filter_groups.max_num_gen_batches=1", "algorithm.filter_groups.enable=false"]),
    ("one-update-per-rollout", ["trainer.ppo_mini_batch_size=512", "trainer.ppo_epochs=2"]),
    ("one-update-per-rollout", ["trainer.ppo_mini_batch_size=256"]),
    ("bf16-pure-adamw", ["engine.name=torch", "model.dtype=float32"]),
    ("bf16-pure-adamw", ["engine.name=deepspeed", "engine.zero_stage=0"]),
    ("autocast-needs-float32", ["engine.name=torch", "model.dtype=float32", "engine.autocast=bfloat16"]),
    ("vllm-sleep-on-cpu", ["rollout.engine=vllm", "engine.device=cpu", "rollout.sleep_level=0"]),
    ("vllm-sleep-on-cpu", ["rollout.engine=vllm", "engine.device=cuda"]),
    ("logits-unchunked", ["engine.logprob_chunk=1024", "engine.name=deepspeed"]),
    # the ratio unaffected: old log-probs from the update's own forward and no correction (ratio exactly 1) ...
    ("autocast-ratio", [*AUTOCAST, *ONE_STEP, "trainer.ppo_micro_batch_size=32"]),
    # ... a separate pass whose forwards each hold one prompt's rows (the paper's micro-batch of 1), or the plain forward
    ("autocast-ratio", AUTOCAST),
    ("autocast-ratio", [*AUTOCAST, "trainer.ppo_micro_batch_size=8"]),
    ("autocast-ratio", [*AUTOCAST, "trainer.ppo_micro_batch_size=32", "engine.shared_prompt_forward=false"]),
    # ... float32 forwards, whatever the ratio
    ("autocast-ratio", ["engine.name=torch", "model.dtype=float32", "trainer.ppo_micro_batch_size=32", "algorithm.rollout_is.enable=true"]),
    ("autocast-ratio", ["engine.name=torch", "model.dtype=float32", "rollout.engine=fast", "rollout.max_staleness=1"]),
    ("bf16-emulated-cpu", [*AUTOCAST, "engine.device=cuda"]),
    ("bf16-emulated-cpu", [*AUTOCAST, "engine.device=auto"]),  # lint does not probe for CUDA
    ("bf16-emulated-cpu", ["engine.name=torch", "model.dtype=float32", "engine.device=cpu"]),
    ("lr-range", ["trainer.lr=1e-5"]),
    ("lr-range", ["trainer.lr=1e-7"]),
    ("setting-ignored", ["algorithm.policy_loss=gspo", "algorithm.gspo.clip_ratio_low=0.001"]),
    ("setting-ignored", ["algorithm.policy_loss=cispo", "algorithm.cispo.clip_ratio_low=0.5"]),
    ("setting-ignored", ["algorithm.rollout_is.enable=true", "algorithm.rollout_is.mode=geo_mask", "algorithm.rollout_is.geo_bound=1.01"]),
    ("setting-ignored", ["rollout.engine=fast", "rollout.max_staleness=1", "algorithm.rollout_is.mode=opsm", "algorithm.rollout_is.opsm_delta=0.01"]),
    ("setting-ignored", ["algorithm.rollout_is.enable=true", "algorithm.rollout_is.mode=seq_tis", "algorithm.rollout_is.cap=5"]),
    ("sequence-loss-aggregation", ["algorithm.policy_loss=gspo", "algorithm.loss_agg_mode=seq-mean-token-mean"]),
    ("sequence-loss-aggregation", ["algorithm.loss_agg_mode=seq-mean-token-sum"]),
    ("sequence-loss-aggregation", ["algorithm.policy_loss=cispo"]),
    ("curve-fit-points", ["ablate.seeds=3", "trainer.total_steps=8", "trainer.test_freq=2"]),  # 0, 2, 4, 6, 8
    ("curve-fit-points", ["ablate.seeds=1", "trainer.total_steps=8", "trainer.test_freq=4"]),  # one seed: no ablation
    # DAPO's technique toggles are not judged where the loss does not read them (setting-ignored, sequence-loss-aggregation say it)
    ("technique-off", ["algorithm.policy_loss=cispo", "algorithm.clip_ratio_high=0.2"]),
    ("technique-off", ["algorithm.policy_loss=gspo", "algorithm.loss_agg_mode=seq-mean-token-mean"]),
    ("technique-off", ["algorithm.policy_loss=gmpo", "algorithm.loss_agg_mode=seq-mean-token-mean", "algorithm.clip_ratio_high=0.2"]),
]


@pytest.mark.parametrize(("rule_id", "overrides", "expected"), TRIGGERS)
def test_rule_triggers(rule_id: str, overrides: list[str], expected: list[tuple[str, str]]) -> None:
    found = run(rule_id, paper(*overrides))
    assert [(f.severity, f.key) for f in found] == expected
    for f in found:
        assert f.message and f.fix
        assert f.line().startswith(f"{f.severity.upper()} {f.key}: ")
        assert f.line().endswith(f" [{rule_id}]")
        assert " — " in f.line()


@pytest.mark.parametrize(("rule_id", "overrides"), NON_TRIGGERS)
def test_rule_does_not_trigger(rule_id: str, overrides: list[str]) -> None:
    assert run(rule_id, paper(*overrides)) == []


def test_every_rule_has_a_trigger_and_a_non_trigger_case() -> None:
    assert {r for r, *_ in TRIGGERS} == set(RULES)
    assert {r for r, _ in NON_TRIGGERS} == set(RULES)


@pytest.mark.parametrize("preset", PRESETS)
def test_paper_presets_lint_clean(preset: str) -> None:
    assert lint(load_config(REPO / "experiments" / preset)) == []


def test_tiny_experiments_have_only_the_expected_warnings() -> None:
    for name in ("tiny.yaml", "tiny-ladder.yaml"):
        found = lint(load_config(REPO / "experiments" / name))
        assert {(f.id, f.key) for f in found} == {
            ("overlong-filter-with-shaping", "algorithm.overlong_filter"),
            ("eval-tied-to-rollout", "validation.top_p"),
        }
        assert all(f.severity == WARN for f in found)


# ---------------------------------------------------------------- rule details


def test_technique_off_follows_the_toggles_and_skips_overlong_filtering() -> None:
    cfg = paper()
    for technique, key in [
        ("clip_higher", "algorithm.clip_ratio_high"),
        ("dynamic_sampling", "algorithm.filter_groups.enable"),
        ("token_level_loss", "algorithm.loss_agg_mode"),
        ("overlong_shaping", "algorithm.overlong_buffer.enable"),
    ]:
        assert [f.key for f in run("technique-off", apply_techniques(cfg, **{technique: False}))] == [key]
    assert run("technique-off", apply_techniques(cfg, overlong_filtering=True)) == []
    assert run("technique-off", apply_techniques(cfg, overlong_filtering=False)) == []


def test_an_inverted_clip_is_an_error_not_a_technique_off_warning() -> None:
    cfg = paper("algorithm.clip_ratio_high=0.1")
    assert run("technique-off", cfg) == []
    assert [f.id for f in lint(cfg)] == ["clip-inverted"]


def test_exhaustion_message_says_what_happens_when_rounds_run_out() -> None:
    base = ["data.gen_batch_size=0", "algorithm.filter_groups.max_num_gen_batches=2"]
    (train,) = run("dynamic-sampling-exhausts", paper(*base))
    assert "2 rounds × 512 prompts = 2× train_batch_size" in train.message
    assert ">= 50% of the groups" in train.message
    assert "trains on fewer groups" in train.message
    (stop,) = run("dynamic-sampling-exhausts", paper(*base, "algorithm.filter_groups.on_exhausted=error"))
    assert "stops with an error" in stop.message


def test_truncated_rollout_mentions_rollout_is_when_it_is_on() -> None:
    (plain,) = run("rollout-truncated-sampling", paper("rollout.top_p=0.9"))
    (with_is,) = run("rollout-truncated-sampling", paper("rollout.top_p=0.9", "algorithm.rollout_is.enable=true"))
    assert "rollout_is" not in plain.message
    assert "rollout_is" in with_is.message


def test_autocast_ratio_says_which_ratio_and_cites_the_measurement() -> None:
    (rollout_is,) = run("autocast-ratio", paper(*AUTOCAST, *ONE_STEP, "algorithm.rollout_is.enable=true"))
    assert "algorithm.rollout_is weights" in rollout_is.message and "vllm sampler in float32" in rollout_is.message
    assert "algorithm.rollout_is.enable=false" in rollout_is.fix
    (stale,) = run("autocast-ratio", paper(*AUTOCAST, *ONE_STEP, "rollout.engine=fast", "rollout.max_staleness=2"))
    assert "rollout.max_staleness=2" in stale.message and "fast sampler" in stale.message
    assert stale.fix == "set engine.autocast=none (the weights then measure staleness alone)"
    (split,) = run("autocast-ratio", paper(*AUTOCAST, "trainer.ppo_micro_batch_size=32"))
    assert "not 1 at theta = theta_old" in split.message and "engine.shared_prompt_forward=false" in split.fix
    for found in (rollout_is, stale, split):
        assert "1e-05" in found.message or "theta_old" in found.message
        assert "docs/performance.md" in found.message and "SmolLM2-135M" in found.message


def test_bf16_emulated_cpu_judges_the_machine_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = paper(*AUTOCAST, "engine.device=cpu")
    (found,) = run("bf16-emulated-cpu", cfg, cpu=EMULATED_BF16)
    assert found.message.startswith("this machine's CPU (the one running dapo lint: no avx512_bf16 or amx_bf16")
    assert found.fix.startswith("set engine.autocast=none")
    assert run("bf16-emulated-cpu", cfg, cpu=NATIVE_BF16) == []
    assert run("bf16-emulated-cpu", cfg, cpu=parse_cpu_bf16("")) == []  # unknown: nothing said
    # lint() hands its machine to the rule; without one the rule reads this machine (here a fake, patched in)
    assert "bf16-emulated-cpu" in [f.id for f in lint(cfg, cpu=EMULATED_BF16)]
    assert "bf16-emulated-cpu" not in [f.id for f in lint(cfg, cpu=NATIVE_BF16)]
    import dapo_cli.config.lint as lint_module

    monkeypatch.setattr(lint_module, "cpu_bf16", lambda: EMULATED_BF16)
    assert [f.id for f in RULES["bf16-emulated-cpu"](cfg)] == ["bf16-emulated-cpu"]
    monkeypatch.setattr(lint_module, "cpu_bf16", lambda: NATIVE_BF16)
    assert RULES["bf16-emulated-cpu"](cfg) == []


def test_lr_range_depends_on_the_model(tmp_path: Path) -> None:
    # builtin:tiny: the measured unstable rate and above
    assert [f.key for f in run("lr-range", tiny("trainer.lr=3e-4"))] == ["trainer.lr"]
    assert [f.key for f in run("lr-range", tiny("trainer.lr=1e-3"))] == ["trainer.lr"]
    assert run("lr-range", tiny("trainer.lr=1e-4")) == []
    assert run("lr-range", tiny("trainer.lr=1e-6")) == []  # slow, but nothing measured says it breaks
    # a directory holding the tiny model's card counts as tiny, directly or as a checkpoint's model/
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "dapo_model.json").write_text("{}", encoding="utf-8")
    for path in (tmp_path, tmp_path / "model"):
        assert is_tiny_model(str(path))
        assert run("lr-range", tiny(f"model.path={path}", "trainer.lr=1e-4")) == []
    # any other model is a real LLM: 1e-4 is far above the paper's 1e-6
    assert not is_tiny_model(str(tmp_path / "missing"))
    assert not is_tiny_model("Qwen/Qwen2.5-7B")
    (llm,) = run("lr-range", tiny("model.path=Qwen/Qwen2.5-7B", "trainer.lr=1e-4"))
    assert "above" in llm.message and "Qwen/Qwen2.5-7B" in llm.message


# ---------------------------------------------------------------- registry, summary, exit codes


def test_findings_carry_their_rule_id_and_errors_come_first() -> None:
    cfg = paper("algorithm.overlong_filter=true", "algorithm.use_kl_loss=true", "rollout.top_p=0.9")
    found = lint(cfg)
    assert [f.id for f in found] == ["kl-on", "overlong-filter-with-shaping", "rollout-truncated-sampling"]
    assert [f.severity for f in found] == [ERROR, WARN, WARN]


def test_summary_counts() -> None:
    e = Finding(ERROR, "k", "m", "f", "x")
    w = Finding(WARN, "k", "m", "f", "y")
    assert summary([]) == "no findings"
    assert summary([w]) == "1 finding (0 errors, 1 warning)"
    assert summary([e, w, w]) == "3 findings (1 error, 2 warnings)"
    assert summary([e, e]) == "2 findings (2 errors, 0 warnings)"


def test_exit_code_errors_by_default_any_finding_when_strict() -> None:
    e = Finding(ERROR, "k", "m", "f", "x")
    w = Finding(WARN, "k", "m", "f", "y")
    assert exit_code([]) == 0 and exit_code([], strict=True) == 0
    assert exit_code([w]) == 0 and exit_code([w], strict=True) == 1
    assert exit_code([e]) == 1 and exit_code([e, w], strict=True) == 1


def test_findings_json_is_serialisable() -> None:
    found = lint(paper("algorithm.use_kl_loss=true"))
    data = json.loads(json.dumps(findings_json(found)))
    assert data == [{"id": "kl-on", "severity": "error", "key": "algorithm.use_kl_loss",
                     "message": found[0].message, "fix": "set algorithm.use_kl_loss=false"}]


def test_registering_an_id_twice_fails() -> None:
    from dapo_cli.config.lint import rule

    with pytest.raises(ValueError, match="kl-on"):
        rule("kl-on")(lambda cfg: [])


def test_the_other_dapo_is_not_held_to_the_decoupled_clip_papers_rules():
    assert lint(load_config(REPO / "experiments" / "tiny-direct-advantage.yaml")) == []


def test_curve_fit_points_message_and_schedule() -> None:
    from dapo_cli.config.lint_ablation import validation_steps

    # step 0, every test_freq, and the last step (not a multiple of 3 here)
    assert validation_steps(8, 3) == [0, 3, 6, 8] and validation_steps(8, 0) == [0, 8] and validation_steps(8, 4) == [0, 4, 8]
    (found,) = run("curve-fit-points", paper("ablate.seeds=3", "trainer.total_steps=8", "trainer.test_freq=4"))
    assert "validates 3 times (steps 0, 4, 8): a curve fit needs 5" in found.message
    assert found.fix == "set trainer.test_freq=2 (validations at 0, 2, 4, 6, 8)"


@pytest.mark.parametrize("name", ["tiny-ladder.yaml", "smollm2-ladder.yaml"])
def test_the_ladders_validate_often_enough_for_a_curve_fit(name: str) -> None:
    assert run("curve-fit-points", load_config(REPO / "experiments" / name)) == []
