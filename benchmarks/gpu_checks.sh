#!/usr/bin/env bash
# The GPU checks of one short device lease, in order of what they decide, each under its own time limit,
# so a lease that ends early still returns what ran. Run from the repository root on a machine with one
# GPU, torch+CUDA, transformers and pyarrow; every other package as wheels in .whl/ (hydra-core, omegaconf,
# antlr4-python3-runtime 4.9.3, math-verify, latex2sympy2_extended, and for TRL: trl, datasets, dill,
# multiprocess). Ray is not needed: everything runs on the local backend.
#
#   OUT=/some/dir ONLY="tests decode profile" bash benchmarks/gpu_checks.sh   # ~4-5 minutes
#   OUT=/some/dir ONLY=bf16 bash benchmarks/gpu_checks.sh                     # ~4 minutes
#   OUT=/some/dir ONLY=fp32 bash benchmarks/gpu_checks.sh                     # ~6 minutes
#   OUT=/some/dir ONLY=bf16mb bash benchmarks/gpu_checks.sh                   # ~4 minutes
#
# All of it takes ~18 minutes on an H200 (the per-part figures are estimates from the 2026-11-26 lease),
# more than one 10-minute device call and more than a 15-minute lease: pick parts with ONLY. bf16mb is
# the next question for the bf16 bar: the update ran at 4-10% of the card's bf16 rate in passes of 32
# samples, host-bound, and passes of 128 cut the host work per sample by four (TRL's too).
#
# Parts: tests (every gpu-marked test), decode (decode_bandwidth.py eager vs graphs), profile
# (profile_step.py at 1b, graphs, shared and padded prompts), bf16 and fp32 (grpo_vs_trl.py against TRL),
# bf16mb (bf16 against TRL with both frameworks in passes of 128 samples).
# Results land in $OUT: the tables, the profiles, and logs.tgz with every run's log.
set -u
OUT=$(mkdir -p "${OUT:-runs/gpu_checks}" && cd "${OUT:-runs/gpu_checks}" && pwd)
ONLY=${ONLY:-"tests decode profile bf16 fp32"}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
start=$(date +%s)
say() { echo "=== [$(( $(date +%s) - start ))s] $*"; }
wants() { [[ " $ONLY " == *" $1 "* ]]; }

if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"

if wants tests; then
    say "gpu-marked tests"
    # the modules holding gpu-marked tests, named one by one: others beside them import Ray, which the device lacks
    # -o addopts= : the project's options name pytest-xdist, which the device need not have
    timeout 240 python3 -m pytest -o addopts= -m gpu -q -p no:cacheprovider -rs $(grep -rl "mark.gpu" tests) 2>&1 \
        | tail -25
fi
if wants decode; then
    say "decoding: eager vs CUDA graphs"
    timeout 150 python3 benchmarks/decode_bandwidth.py --device cuda --sizes 10m,1b --runs 2 \
        --out "$OUT/decode_bandwidth_cuda.md" 2>&1 | grep -v Warning | tail -8
fi
if wants profile; then
    for variant in "" --padded; do
        say "profile 1b bf16 $variant"
        timeout 150 python3 benchmarks/profile_step.py --device cuda --size 1b --steps 3 --rows 30 $variant \
            --workdir /tmp/gpu_checks --out "$OUT/profile_1b${variant:+_padded}.md" 2>&1 | grep -E "^(Stage|Host|The same)"
    done
fi
if wants bf16; then
    say "GRPO vs TRL, bf16, 1b and 400m"
    (cd benchmarks && timeout 300 python3 grpo_vs_trl.py --device cuda --sizes 1b,400m --dtypes bfloat16 \
        --workdir /tmp/gpu_checks --out "$OUT/grpo_vs_trl_gpu_bf16" 2>&1 | grep -E "s/step|speedup|Error|Traceback")
fi
if wants bf16mb; then
    say "GRPO vs TRL, bf16, 1b and 400m, passes of 128 samples"
    (cd benchmarks && timeout 300 python3 grpo_vs_trl.py --device cuda --sizes 1b,400m --dtypes bfloat16 \
        --micro-batch 128 --workdir /tmp/gpu_checks --out "$OUT/grpo_vs_trl_gpu_bf16_mb128" 2>&1 \
        | grep -E "s/step|speedup|Error|Traceback")
fi
if wants fp32; then
    say "GRPO vs TRL, fp32, 10m 50m 400m 1b"
    (cd benchmarks && timeout 420 python3 grpo_vs_trl.py --device cuda --sizes 10m,50m,400m,1b --dtypes float32 \
        --workdir /tmp/gpu_checks --out "$OUT/grpo_vs_trl_gpu_fp32" 2>&1 | grep -E "s/step|speedup|Error|Traceback")
fi
pkill -f grpo_vs_trl.py
say done
tar czf "$OUT/logs.tgz" -C /tmp/gpu_checks logs 2>/dev/null
exit 0
