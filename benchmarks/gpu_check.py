"""The GPU check (``make gpu-check``): one GPU, nothing downloaded, every check a gate.

    make gpu-check                                  # .venv-gpu with .[vllm,deepspeed], then this script
    python benchmarks/gpu_check.py [--only NAME ...] [--work DIR]

It builds two random-init bfloat16 Qwen2-shaped policies on the machine (GQA 8/2 heads, head_dim 128,
8 layers; one with tied embeddings, one untied; the project's character tokenizer) and runs each check in
a process of its own (vLLM allows one CuMem sleep-mode user per process):

1. ``environment`` (untied): versions; the model runner and attention backend vLLM chose; sleep mode;
   then bf16 parity: 64 prompts x 8 samples, vLLM's log-probs against the trainer's, mean |delta| gated.
2. ``optimizer``: the optimizer DeepSpeed builds here (ZeRO-3, bf16, one process), reported; building it is the gate.
3. ``sleep`` (tied): levels 1 then 2 on one engine: memory freed by sleep, greedy output unchanged after a
   wake with no update, the probe gap back to its baseline after an update and sync, the peak extra memory
   across the sync (gated against half the policy's bytes: a sync that held the whole model would exceed it).
4. ``deepspeed``: ``dapo train``'s loop with DeepSpeed ZeRO-3, bf16, vLLM at sleep level 2, 3 steps, step 2
   forced to have no informative group; then ``dapo train --resume`` in a fresh process for one more step.
5. ``lora``: LoRA on the torch engine, 3 bf16 steps on vLLM: vLLM's log-probs change after the first sync,
   and the sync check's gap stays under its bound.

The policies are random-init, so no sample is right: training steps get their rewards forced
(:func:`forced_texts`: half of each group answers right, or none in a forced no-update step). The check
is of the machinery (sync, sleep, DeepSpeed beside vLLM), not of learning.

Prints one line per gate and a JSON report (also ``$OUT/gpu_check.json`` when ``OUT`` is set); exits 1 when a
gate fails, 2 at once on a machine with no CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CHECKS = ("environment", "optimizer", "sleep", "deepspeed", "lora")
CHILD_TIMEOUT_S = 300
PARITY_MEAN_BOUND = 0.05
"""Largest mean |log pi_vLLM - log pi_trainer| per token, both bfloat16 (different kernels: ~0.01 expected)."""
BASELINE_SLACK = 0.02
"""After an update and sync, the probe gap may exceed its baseline by at most this (nats a token)."""
SHAPE = {"hidden_size": 1024, "num_layers": 8, "num_heads": 8, "num_kv_heads": 2, "head_dim": 128, "intermediate_size": 2816}
NEEDS_CUDA = "gpu-check needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)"


# ---------------------------------------------------------------- gates (no GPU needed)


@dataclass
class Gate:
    check: str
    name: str
    ok: bool
    value: Any = None
    bound: Any = None

    def line(self) -> str:
        shown = "" if self.value is None else f": {self.value}" + ("" if self.bound is None else f" (bound {self.bound})")
        return f"{'PASS' if self.ok else 'FAIL'} {self.check}: {self.name}{shown}"


def at_most(check: str, name: str, value: float, bound: float) -> Gate:
    """Passes when ``value <= bound``; a value that is not a number fails."""
    return Gate(check, name, bool(math.isfinite(value) and value <= bound), round(value, 6), bound)


def at_least(check: str, name: str, value: float, bound: float) -> Gate:
    return Gate(check, name, bool(math.isfinite(value) and value >= bound), round(value, 6), bound)


def holds(check: str, name: str, ok: bool, value: Any = None) -> Gate:
    return Gate(check, name, bool(ok), value)


def exit_code(gates: list[Gate]) -> int:
    """0 when every gate passed (and there is at least one), else 1."""
    return 0 if gates and all(g.ok for g in gates) else 1


def forced_texts(texts: list[str], truths: list[str], n: int, *, barren: bool) -> list[str]:
    """Responses whose rewards a step needs from a random-init policy: in each group of ``n`` the first half
    answer ``Answer: <truth>`` and the rest a wrong number; ``barren``: every one wrong (no informative group)."""
    out = []
    for i, (text, truth) in enumerate(zip(texts, truths, strict=True)):
        right = not barren and i % n < n // 2
        out.append(f"Answer: {truth}" if right else f"Answer: {truth}1")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="One-GPU smoke check of dapo's GPU path (see the module docstring).")
    parser.add_argument("--only", nargs="+", choices=CHECKS, default=list(CHECKS), help="run these checks only")
    parser.add_argument("--work", type=Path, default=None, help="folder for the models and runs (default: a temporary one)")
    parser.add_argument("--check", choices=CHECKS, default=None, help=argparse.SUPPRESS)  # a child process
    parser.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        print(f"error: {NEEDS_CUDA}", file=sys.stderr)
        sys.exit(2)


# ---------------------------------------------------------------- the policies


def build_policy(out: Path, *, tied: bool, seed: int = 0, **shape: int) -> Path:
    """A random-init bfloat16 ``Qwen2ForCausalLM`` (q/k/v bias, GQA) with the character tokenizer at ``out``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dapo_cli.models import build_char_tokenizer, save_policy

    s = {**SHAPE, **shape}
    tokenizer = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=s["hidden_size"], intermediate_size=s["intermediate_size"],
        num_hidden_layers=s["num_layers"], num_attention_heads=s["num_heads"], num_key_value_heads=s["num_kv_heads"],
        head_dim=s["head_dim"], max_position_embeddings=512, tie_word_embeddings=tied, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id, torch_dtype="bfloat16",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    save_policy(model, tokenizer, out)
    return out


PROMPTS = [f"What is {a}+{b}?\n" for a, b in zip(range(11, 75), range(90, 26, -1))]  # 64 prompts


# ---------------------------------------------------------------- checks (each in its own process, on the GPU)


def used_gib() -> float:
    import torch

    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def trainer_on(path: Path, *, lr: float = 1e-3):
    import torch

    from dapo_cli.engine.torch import TorchEngine
    from dapo_cli.models import load_policy

    model, tokenizer = load_policy(path, device="cuda", dtype=torch.bfloat16)
    return TorchEngine(model, device="cuda", lr=lr, weight_decay=0.0, warmup_steps=0, grad_clip=1.0), tokenizer


def vllm_on(path: Path, tokenizer: Any, trainer: Any, *, sleep_level: int):
    from dapo_cli.rollout.vllm import VLLMRolloutEngine, platform_info, serving_dtype

    dtype = serving_dtype("auto", "bfloat16", platform_info()["device"])
    return VLLMRolloutEngine(path, tokenizer, gpu_memory_utilization=0.3, sleep_level=sleep_level, max_model_len=256,
                             dtype=dtype, weights=trainer)


def engine_facts(llm: Any) -> dict[str, Any]:
    """The model runner class and attention backends vLLM's worker uses (in-process executors only)."""

    def read(worker: Any) -> dict[str, Any]:
        runner = worker.model_runner
        backends = sorted({m.attn_backend.get_name() for m in runner.get_model().modules() if hasattr(m, "attn_backend")})
        return {"model_runner": f"{type(runner).__module__}.{type(runner).__name__}", "attention_backends": backends}

    return llm.collective_rpc(read)[0]


def parity_gap(rollout: Any, trainer: Any, pad_id: int) -> tuple[float, float]:
    """(mean, max) |log pi_vLLM - log pi_trainer| per token over 64 prompts x 8 samples of 64 tokens."""
    import torch

    from dapo_cli.batch import RolloutBatch
    from dapo_cli.rollout.base import SamplingParams

    out = rollout.generate(PROMPTS, 8, SamplingParams(temperature=1.0, max_tokens=64, seed=0, logprobs=True))
    n = len(out.texts)
    batch = RolloutBatch.from_rollouts(out, group_ids=out.prompt_index, ground_truths=[""] * n, prompts=[""] * n, pad_id=pad_id)
    with torch.no_grad():
        mine, _ = trainer.log_probs(batch, temperature=1.0, with_entropy=False)
    diff = (mine.float().cpu() - out.logprobs).abs()[out.response_mask]
    return float(diff.mean()), float(diff.max())


def check_environment(work: Path, report: dict) -> list[Gate]:
    import torch
    import transformers
    import vllm

    from dapo_cli.rollout.vllm import platform_info

    report["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda, "vllm": vllm.__version__,
                          "transformers": transformers.__version__, "device": torch.cuda.get_device_name(0)}
    info = platform_info()
    report["platform"] = info
    trainer, tokenizer = trainer_on(work / "untied")
    rollout = vllm_on(work / "untied", tokenizer, trainer, sleep_level=1)
    report.update(engine_facts(rollout.llm))
    report["served_dtype"] = str(rollout.serve_dtype)
    mean, biggest = parity_gap(rollout, trainer, tokenizer.pad_token_id)
    report["parity_untied"] = {"mean": mean, "max": biggest}
    rollout.close()
    return [holds("environment", "vLLM has sleep mode here", info["sleep_mode"], info["name"]),
            holds("environment", "vLLM serves bfloat16", report["served_dtype"] == "torch.bfloat16", report["served_dtype"]),
            at_most("environment", "bf16 parity, mean |delta log p| (untied)", mean, PARITY_MEAN_BOUND)]


def check_optimizer(work: Path, report: dict) -> list[Gate]:
    import torch

    from dapo_cli import components
    from dapo_cli.config.schema import EngineConfig
    from dapo_cli.models import load_policy

    model, _ = load_policy(work / "tied", dtype=torch.bfloat16)
    dist = components.build_collective(EngineConfig(name="deepspeed", device="cuda"))
    engine = components.build_training_engine(
        EngineConfig(name="deepspeed", zero_stage=3, device="cuda"), model, dist, lr=1e-5, weight_decay=0.0, warmup_steps=0,
        grad_clip=1.0, bf16=True, load_reference=None,
    )
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    report["deepspeed_optimizer"] = f"{type(inner).__module__}.{type(inner).__name__}"
    report["deepspeed_wrapper"] = type(engine.optimizer).__name__
    return [holds("optimizer", "DeepSpeed ZeRO-3 builds its optimizer", True, report["deepspeed_optimizer"])]


def check_sleep(work: Path, report: dict) -> list[Gate]:
    import torch

    from dapo_cli.batch import RolloutBatch
    from dapo_cli.engine.dist import SingleProcess
    from dapo_cli.rollout.base import SamplingParams
    from dapo_cli.train.sync_check import probe_gap

    before_engine = used_gib()
    trainer, tokenizer = trainer_on(work / "tied")
    rollout = vllm_on(work / "tied", tokenizer, trainer, sleep_level=1)
    model_bytes = sum(p.numel() * p.element_size() for p in trainer.module.parameters())
    greedy = SamplingParams(temperature=0.0, max_tokens=32, seed=0)

    def gap() -> float:
        return probe_gap(rollout, trainer, PROMPTS[:4], temperature=1.0, seed=1, pad_id=tokenizer.pad_token_id, dist=SingleProcess())

    peak: dict[str, int] = {}
    reload = rollout.llm.collective_rpc

    def measured(method: Any, *args: Any, **kwargs: Any) -> Any:
        """The reload alone (the weights already woken, the KV cache not yet): torch's peak above its start."""
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = reload(method, *args, **kwargs)
        torch.cuda.synchronize()
        peak["extra"] = torch.cuda.max_memory_allocated() - start
        return out

    rollout.llm.collective_rpc = measured
    gates = []
    mean, biggest = parity_gap(rollout, trainer, tokenizer.pad_token_id)
    report["parity_tied"] = {"mean": mean, "max": biggest}
    gates.append(at_most("sleep", "bf16 parity, mean |delta log p| (tied)", mean, PARITY_MEAN_BOUND))
    for level in (1, 2):
        rollout.sleep_level = level
        baseline_ids = rollout.generate(PROMPTS[:8], 1, greedy).response_ids
        baseline_gap = gap()
        awake = used_gib()
        rollout.sleep()
        asleep = used_gib()
        rollout.wake_up()  # a step with no update (level 2: synced again from the trainer)
        same = torch.equal(rollout.generate(PROMPTS[:8], 1, greedy).response_ids, baseline_ids)
        held = awake - before_engine
        gates += [at_least("sleep", f"level {level}: share of vLLM's memory freed by sleep", (awake - asleep) / max(held, 1e-9), 0.5),
                  holds("sleep", f"level {level}: greedy output unchanged after a wake with no update", same)]
        # an update, then the sync (vLLM asleep: weights woken, streamed, then the KV cache)
        out = rollout.generate(PROMPTS[:8], 4, SamplingParams(temperature=1.0, max_tokens=32, seed=level, logprobs=True))
        n = len(out.texts)
        batch = RolloutBatch.from_rollouts(out, group_ids=out.prompt_index, ground_truths=[""] * n, prompts=[""] * n,
                                           pad_id=tokenizer.pad_token_id)
        rollout.sleep()
        logp, _ = trainer.log_probs(batch, temperature=1.0, with_entropy=False)
        mask = batch.response_mask.to(logp.device).float()
        trainer.backward(-(logp * mask).sum() / mask.sum())
        trainer.step()
        t0 = time.perf_counter()
        rollout.sync_weights(trainer)
        extra = peak["extra"]
        report[f"level{level}"] = {"used_gib_awake": awake, "used_gib_asleep": asleep, "sync_s": time.perf_counter() - t0,
                                   "sync_peak_extra_mib": extra / 2**20, "policy_mib": model_bytes / 2**20,
                                   "baseline_gap": baseline_gap}
        after = gap()
        gates += [at_most("sleep", f"level {level}: probe gap after update + sync", after, baseline_gap + BASELINE_SLACK),
                  at_most("sleep", f"level {level}: peak extra MiB across the sync", extra / 2**20, model_bytes / 2 / 2**20)]
    rollout.close()
    return gates


def run_forced_training(config: Path, *, barren_step: int, stop_after: int, probe: dict | None = None) -> dict[int, dict]:
    """``dapo train``'s loop on ``config`` with forced rewards (:func:`forced_texts`; ``barren_step`` has none right),
    interrupted after step ``stop_after`` (its checkpoint written); returns the metrics logged per step. ``probe``:
    filled with vLLM's log-probs of a fixed sample before step 1 and before step 2 (after the first sync)."""
    from dapo_cli.config import load_config
    from dapo_cli.rollout.base import SamplingParams
    from dapo_cli.train import loop
    from dapo_cli.train import rounds as rounds_mod

    cfg = load_config(config)
    logged: dict[int, dict] = {}
    real_next, real_record = rounds_mod.InlineRounds.next_round, loop.record_step

    def next_round(self: Any, step: int) -> Any:
        if step > stop_after:
            raise KeyboardInterrupt
        if probe is not None and step not in probe:
            out = self.rollout.generate(PROMPTS[:4], 1, SamplingParams(temperature=1.0, max_tokens=16, seed=0, logprobs=True))
            probe[step] = (out.response_ids, out.logprobs)
        rnd = real_next(self, step)
        rnd.rollouts.texts = forced_texts(rnd.rollouts.texts, [p.ground_truth for p in rnd.prompts for _ in range(cfg.rollout.n)],
                                          cfg.rollout.n, barren=step == barren_step)
        return rnd

    def record_step(s: Any, tracker: Any, step: int, *args: Any) -> dict:
        logged[step] = real_record(s, tracker, step, *args)
        return logged[step]

    rounds_mod.InlineRounds.next_round, loop.record_step = next_round, record_step
    try:
        loop.run_train(cfg, command="make gpu-check", quiet=True)
    except KeyboardInterrupt:
        pass
    return logged


def train_config(work: Path, name: str, sets: list[str]) -> Path:
    from dapo_cli.config import dump_saved, load_config

    cfg = load_config(None, [
        f"model.path={work / 'tied'}", "model.dtype=bfloat16", "rollout.engine=vllm", "rollout.gpu_memory_utilization=0.3",
        "rollout.n=8", "rollout.max_response_length=48", "algorithm.overlong_buffer.len=16", "data.train_batch_size=8",
        "data.max_prompt_length=64", "data.synthetic_train_size=256", "data.val_files=[]",
        "algorithm.filter_groups.max_num_gen_batches=1", "trainer.total_steps=4", "trainer.ppo_mini_batch_size=8",
        "trainer.ppo_micro_batch_size=64", "trainer.lr=1e-4", "trainer.lr_warmup_steps=0", "trainer.save_freq=1",
        "trainer.test_freq=0", "trainer.collapse_patience=0", f"trainer.output_dir={work / name / 'runs'}",
        f"trainer.run_name={name}", f"tracking.tracking_uri=sqlite:///{work / name / 'mlflow.db'}",
        "tracking.experiment=gpu-check", "engine.device=cuda", *sets,
    ])
    path = work / name / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_saved(cfg), encoding="utf-8")
    return path


def check_deepspeed(work: Path, report: dict) -> list[Gate]:
    config = train_config(work, "deepspeed", ["engine.name=deepspeed", "engine.zero_stage=3", "rollout.sleep_level=2"])
    logged = run_forced_training(config, barren_step=2, stop_after=3)
    report["deepspeed_steps"] = {k: {m: v for m, v in d.items() if m.startswith(("rollout/", "timing/weight", "actor/pg"))}
                                 for k, d in logged.items()}
    gates = [holds("deepspeed", "3 steps ran", sorted(logged) == [1, 2, 3], sorted(logged)),
             holds("deepspeed", "steps 1 and 3 updated, step 2 (forced no-update) did not",
                   [("actor/pg_loss" in logged.get(k, {})) for k in (1, 2, 3)] == [True, False, True])]
    gaps = [logged[k].get("rollout/sync_probe_gap", math.nan) for k in sorted(logged)]
    gates.append(at_most("deepspeed", "largest sync probe gap", max(gaps) if gaps else math.nan, 0.5))
    resumed = subprocess.run([sys.executable, "-m", "dapo_cli", "train", str(config), "--resume"], capture_output=True,
                             text=True, timeout=CHILD_TIMEOUT_S)
    report["resume_tail"] = resumed.stderr[-2000:]
    step4 = list((work / "deepspeed" / "runs").glob("*/deepspeed/checkpoints/step_000004/model/config.json"))
    gates.append(holds("deepspeed", "dapo train --resume ran step 4 in a fresh process", resumed.returncode == 0 and bool(step4),
                       f"exit {resumed.returncode}"))
    return gates


def check_lora(work: Path, report: dict) -> list[Gate]:
    import torch

    config = train_config(work, "lora", ["engine.name=torch", "model.lora.rank=8", "rollout.sleep_level=1", "trainer.lr=1e-3"])
    probe: dict = {}
    logged = run_forced_training(config, barren_step=0, stop_after=3, probe=probe)
    gates = [holds("lora", "3 steps ran, each an update", [("actor/pg_loss" in logged.get(k, {})) for k in (1, 2, 3)] == [True] * 3)]
    if 1 in probe and 2 in probe:
        (ids1, lp1), (ids2, lp2) = probe[1], probe[2]
        changed = not torch.equal(ids1, ids2) or float((lp1 - lp2).abs().max()) > 1e-4
        gates.append(holds("lora", "vLLM's output changed after the first sync", changed))
    else:
        gates.append(holds("lora", "vLLM's output changed after the first sync", False, "no probe"))
    gaps = [logged[k].get("rollout/sync_probe_gap", math.nan) for k in sorted(logged)]
    gates.append(at_most("lora", "largest sync probe gap", max(gaps) if gaps else math.nan, 0.5))
    report["lora_gaps"] = gaps
    return gates


RUNNERS = {"environment": check_environment, "optimizer": check_optimizer, "sleep": check_sleep, "deepspeed": check_deepspeed,
           "lora": check_lora}


# ---------------------------------------------------------------- driver


def run_child(check: str, work: Path) -> tuple[list[Gate], dict]:
    """``check`` in a process of its own; a crash or timeout is a failed gate with the process's last words."""
    result = work / f"{check}.json"
    try:
        proc = subprocess.run([sys.executable, __file__, "--check", check, "--work", str(work), "--result", str(result)],
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [holds(check, f"finished within {CHILD_TIMEOUT_S} s", False)], {}
    if proc.returncode != 0 or not result.is_file():
        tail = (proc.stderr or proc.stdout)[-1500:]
        return [holds(check, "process exited cleanly", False, f"exit {proc.returncode}")], {"stderr_tail": tail}
    data = json.loads(result.read_text())
    return [Gate(**g) for g in data["gates"]], data["report"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    require_cuda()
    if args.check is not None:  # a child: one check, its gates and report to --result
        report: dict = {}
        gates = RUNNERS[args.check](args.work, report)
        args.result.write_text(json.dumps({"gates": [asdict(g) for g in gates], "report": report}, default=str))
        return 0
    with tempfile.TemporaryDirectory(prefix="dapo-gpu-check-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        build_policy(work / "tied", tied=True)
        build_policy(work / "untied", tied=False, seed=1)
        gates: list[Gate] = []
        reports: dict[str, Any] = {}
        for check in args.only:
            t0 = time.perf_counter()
            found, reports[check] = run_child(check, work)
            reports[check]["wall_s"] = round(time.perf_counter() - t0, 1)
            for gate in found:
                print(gate.line(), flush=True)
            if "stderr_tail" in reports[check]:
                print(reports[check]["stderr_tail"], flush=True)
            gates += found
    text = json.dumps({"gates": [asdict(g) for g in gates], "reports": reports, "ok": exit_code(gates) == 0}, indent=2, default=str)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(text + "\n")
    return exit_code(gates)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
