"""TRL's side of ``benchmarks/rl_step_vs_trl.py``: GRPOTrainer for a few steps, run by ``.venv-trl``'s python.

    .venv-trl/bin/python benchmarks/_trl_worker.py '{"model": DIR, "prompts": JSONL, "length": 16,
                                                    "steps": 20, "threads": 2, "seed": 0, "out": OUT.json}'

Settings match the dapo side: 8 prompts x 8 samples (``per_device_train_batch_size`` 64 completions,
``num_generations`` 8), one optimizer step per generation batch (``steps_per_generation`` 1,
``gradient_accumulation_steps`` 1, ``num_iterations`` 1), temperature 1.0 with no top-k/top-p,
no KL (``beta`` 0), clip 0.2 / 0.28, token-level loss over the batch (``loss_type`` dapo),
truncated completions masked, AdamW lr 1e-4 constant, no weight decay, gradient norm clipped at 1,
float32 without gradient checkpointing (TRL's defaults are bf16 autocast and checkpointing; dapo
trains in float32 without); ``"bf16": true`` in the spec turns TRL's bf16 autocast on (the
comparison with ``engine.autocast=bfloat16``). The reward parses ``Answer: N`` from the completion (+1 / -1).

Writes ``out``: the wall-clock time at the end of every optimizer step (a ``TrainerCallback``), the
vocabulary TRL sees (size and the ids of a probe string), and TRL's logged metrics per step.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time

PROBE = "What is 12 + 345?\n\nAnswer: 357"


def main() -> None:
    args = json.loads(sys.argv[1])
    import torch

    torch.set_num_threads(int(args["threads"]))
    from transformers import (
        AutoModelForCausalLM,
        PreTrainedTokenizerFast,
        TrainerCallback,
    )
    from trl import GRPOConfig, GRPOTrainer

    from datasets import Dataset

    tokenizer = PreTrainedTokenizerFast.from_pretrained(args["model"])  # the folder's tokenizer.json, as dapo loads it
    model = AutoModelForCausalLM.from_pretrained(args["model"], dtype=torch.float32)
    with open(args["prompts"], encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    answer_line = re.compile(r"Answer:\s*(-?\d+)")

    def reward(completions: list[str], answer: list[str], **_: object) -> list[float]:
        out = []
        for text, truth in zip(completions, answer):
            found = answer_line.findall(text)
            out.append(1.0 if found and found[-1] == truth else -1.0)
        return out

    class Stamps(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, _args, _state, _control, **_kw):
            self.ends.append(time.perf_counter())

    stamps = Stamps()
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as tmp:
        config = GRPOConfig(
            output_dir=tmp, report_to="none", save_strategy="no", logging_steps=1, max_steps=int(args["steps"]),
            use_cpu=True, bf16=bool(args.get("bf16", False)), fp16=False, gradient_checkpointing=False, seed=int(args["seed"]),
            per_device_train_batch_size=64, num_generations=8, gradient_accumulation_steps=1, steps_per_generation=1,
            num_iterations=1, max_completion_length=int(args["length"]), temperature=1.0, top_p=1.0, top_k=0,
            beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", mask_truncated_completions=True,
            learning_rate=1e-4, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
            dataloader_num_workers=0, log_completions=False, disable_dropout=True,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[stamps])
        trainer.train()
        history = [h for h in trainer.state.log_history if "step" in h]
    with open(args["out"], "w", encoding="utf-8") as f:
        json.dump({
            "step_ends": stamps.ends,
            "vocab_size": len(tokenizer),
            "probe_ids": tokenizer(PROBE, add_special_tokens=False)["input_ids"],
            "history": history,
        }, f)


if __name__ == "__main__":
    main()
