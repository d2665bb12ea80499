"""The GPU check (``make gpu-check``): vLLM against the HF engine, then 3 training steps on vLLM rollouts.

    make gpu-check          # makes .venv-gpu with .[vllm,deepspeed], then runs this script

Needs a CUDA GPU. Prints, and writes to ``$OUT/gpu_check.json`` when ``OUT`` is set:

1. greedy decoding of a random-init tiny Llama policy (hidden 128, 4 layers, the project's
   character tokenizer) by vLLM and by transformers' ``generate``, both float32, token for token;
   and the largest |log-prob difference| between vLLM's sampled-token log-probs and the trainer's
   teacher-forced ones (``policy_forward``);
2. GPU memory in use with the vLLM engine awake, asleep (level 1 and 2) and woken again;
3. ``dapo train`` for 3 steps with ``rollout.engine=vllm`` on that policy: generation tokens/s,
   weight-sync time per step and the logged train-inference mismatch, read back from MLflow.

Exits 1 when a check fails (tokens differ, mismatch above 1e-3, training failed).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch


def gib() -> float:
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def build_policy(out: Path) -> None:
    from dapo_cli.config.tiny import TinyModelConfig
    from dapo_cli.models import build_char_tokenizer, save_policy
    from dapo_cli.models.tiny import build_tiny_model_for

    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    save_policy(build_tiny_model_for(TinyModelConfig(), tokenizer), tokenizer, out)


def compare_greedy(model_dir: Path, report: dict) -> bool:
    from dapo_cli.batch import RolloutBatch
    from dapo_cli.engine.torch import policy_forward
    from dapo_cli.models import load_policy
    from dapo_cli.rollout.base import SamplingParams
    from dapo_cli.rollout.hf import HFRolloutEngine
    from dapo_cli.rollout.vllm import VLLMRolloutEngine

    model, tokenizer = load_policy(model_dir, device="cuda")
    prompts = [f"What is {a}+{b}?\n" for a, b in [(1, 2), (12, 30), (7, 99), (250, 13)]]
    greedy = SamplingParams(temperature=0.0, max_tokens=48, seed=0, logprobs=True)
    hf = HFRolloutEngine(model, tokenizer).generate(prompts, 1, greedy)
    before = gib()
    engine = VLLMRolloutEngine(model_dir, tokenizer, gpu_memory_utilization=0.3, sleep_level=1, dtype="float32")
    report["memory_gib"] = {"before_vllm": round(before, 2), "vllm_awake": round(gib(), 2)}
    t0 = time.perf_counter()
    sampled = engine.generate(prompts * 16, 4, SamplingParams(temperature=1.0, max_tokens=48, seed=0, logprobs=True))
    elapsed = time.perf_counter() - t0
    report["vllm_tokens_per_s"] = round(float(sampled.lengths.sum()) / elapsed, 1)
    vl = engine.generate(prompts, 1, greedy)
    same = [hf.response_ids[i, : hf.lengths[i]].tolist() == vl.response_ids[i, : vl.lengths[i]].tolist() for i in range(len(prompts))]
    report["greedy_rows_identical"] = f"{sum(same)}/{len(same)}"
    batch = RolloutBatch(
        prompt_ids=sampled.prompt_ids, prompt_mask=sampled.prompt_mask, response_ids=sampled.response_ids,
        response_mask=sampled.response_mask, lengths=sampled.lengths, truncated=sampled.truncated,
        group_ids=sampled.prompt_index, texts=sampled.texts, ground_truths=[""] * len(sampled.texts),
        prompts=[""] * len(sampled.texts), pad_id=tokenizer.pad_token_id,
    )
    with torch.no_grad():
        trainer, _ = policy_forward(model, batch, temperature=1.0, with_entropy=False, device=torch.device("cuda"))
    diff = float(((trainer.cpu() - sampled.logprobs).abs() * sampled.response_mask).max())
    report["max_logprob_diff_vs_trainer"] = diff
    engine.llm.sleep(level=1)
    report["memory_gib"]["asleep_level1"] = round(gib(), 2)
    engine.llm.wake_up()
    report["memory_gib"]["woken"] = round(gib(), 2)
    engine.llm.sleep(level=2)
    report["memory_gib"]["asleep_level2"] = round(gib(), 2)
    engine.llm.wake_up()
    t0 = time.perf_counter()

    class Source:
        def export_weights(self):
            yield from model.state_dict().items()

    engine.sync_weights(Source())
    report["sync_s_tiny"] = round(time.perf_counter() - t0, 4)
    again = engine.generate(prompts, 1, greedy)  # level 2 dropped the weights: the sync restored them
    report["greedy_after_level2_and_sync_identical"] = bool(torch.equal(again.response_ids, vl.response_ids))
    engine.close()  # its engine core goes before train_three_steps builds another
    return all(same) and diff < 1e-3 and report["greedy_after_level2_and_sync_identical"]


def train_three_steps(model_dir: Path, work: Path, report: dict) -> bool:
    from mlflow import MlflowClient

    from dapo_cli.config import apply_techniques, load_config
    from dapo_cli.train import run_train

    cfg = load_config(None, [
        f"model.path={model_dir}", "rollout.engine=vllm", "rollout.gpu_memory_utilization=0.3", "rollout.n=8",
        "rollout.max_response_length=48", "algorithm.overlong_buffer.len=16", "data.train_batch_size=16",
        "data.max_prompt_length=64", "data.synthetic_train_size=256", "data.synthetic_val_size=16",
        "trainer.total_steps=3", "trainer.ppo_mini_batch_size=8", "trainer.ppo_micro_batch_size=64", "trainer.lr=1e-4",
        "trainer.save_freq=0", "trainer.test_freq=0", f"trainer.output_dir={work / 'runs'}",
        f"tracking.tracking_uri=sqlite:///{work / 'mlflow.db'}", "tracking.experiment=gpu-check", "engine.device=cuda",
    ])
    cfg = apply_techniques(cfg, dynamic_sampling=False)
    summary = run_train(cfg, command="make gpu-check", quiet=True)
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    run_id = summary["mlflow_run_id"]
    for key in ("perf/gen_tokens_per_s", "timing/weight_sync", "timing/gen_and_score", "timing/step", "rollout/logprob_diff_mean",
                "rollout/logprob_diff_max"):
        report[f"train:{key}"] = [round(m.value, 5) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]
    return len(report["train:timing/step"]) == 3


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("gpu-check needs a CUDA GPU; none is visible")
    report: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    import transformers
    import vllm

    report.update(vllm=vllm.__version__, transformers=transformers.__version__)
    with tempfile.TemporaryDirectory(prefix="dapo-gpu-check-") as tmp:
        model_dir = Path(tmp) / "tiny"
        build_policy(model_dir)
        ok = compare_greedy(model_dir, report)
        try:
            ok = train_three_steps(model_dir, Path(tmp), report) and ok
        except Exception as exc:  # report what failed, then fail
            report["train_error"] = f"{type(exc).__name__}: {exc}"
            ok = False
    report["ok"] = ok
    text = json.dumps(report, indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(text + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
