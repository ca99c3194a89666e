"""How many of verl's example launch scripts pass hybridrl's dry run, and what blocks the others.

    python benchmarks/verl_launch_scripts.py --verl /path/to/verl/checkout [--kind fsdp] [--out FILE]
    python benchmarks/verl_launch_scripts.py --verl /path/to/verl/checkout --kind sft   # or generation

Every `examples/**/*.sh` that starts `verl.trainer.main_ppo`, and every script of verl's one-step-off and
fully_async recipes (`verl/experimental/{one_step_off_policy,fully_async_policy}/shell/*.sh`, which start their own
entry points: the same keys, with the rollout on a pool of its own), runs under bash with `python`, `python3` and
the cluster tools (ray, hf, srun, ...) replaced by stand-ins on PATH, so each script builds its command
line with its shell variables at their defaults and nothing else runs. The captured arguments, with the
data, model and output paths pointed at a tiny local model and the built-in task's parquet files, then go
to `python -m hybridrl.trainer.main_ppo ... trainer.dry_run=true` from the checkout's root (so the
scripts' relative config folders resolve), with async_training.mode=one_step_off or streaming for a recipe's
script. Scripts are sorted into megatron, npu, vlm, one_step_off and fully_async (the recipes' FSDP scripts) and
fsdp (the rest) by their paths, names and arguments.

verl's SFT scripts (`torchrun ... -m verl.trainer.fsdp_sft_trainer`, under examples/ and verl's e2e test
scripts, E2E_SHELLS) and generation scripts (`verl.trainer.main_generation`, likewise) are captured the same way (torchrun is a stand-in too) and, having no dry run,
run for real on the tiny model on 2 Ray ranks on the CPU: SFT for one step of 8 rows (`--kind sft`), generation of
16 tokens (`--kind generation`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

STAND_INS = ("hf", "huggingface-cli", "pip", "pip3", "ray", "nvidia-smi", "npu-smi", "wandb", "git", "wget",
             "curl", "sleep", "conda", "srun", "sbatch", "scontrol", "module")
CAPTURE = """#!{python}
import json, os, sys
args = sys.argv[1:]
if any(a in {modules!r} or a.endswith("main_ppo.py") for a in args):
    with open(os.environ["CAPTURE"], "a") as f:
        f.write(json.dumps({{"cwd": os.getcwd(), "argv": args}}) + "\\n")
"""
# values some scripts read without a default (slurm and cluster variables)
SCRIPT_ENV = {"SLURM_JOB_NUM_NODES": "1", "HDFS_ROOT": "/tmp/hdfs", "DATA_ROOT": "/tmp/data"}
PATH_KEYS = {"data.train_files": "train", "data.val_files": "val", "trainer.default_local_dir": "out",
             "actor_rollout_ref.model.lora_adapter_path": "adapter", "data.path": "val",
             "data.output_path": "generated"}
MODEL_KEY = re.compile(r"(model\.path|model\.partial_pretrain|tokenizer_path|input_tokenizer|^data\.tokenizer)$")


MODULES = ("verl.trainer.main_ppo", "verl.experimental.one_step_off_policy.main_ppo",
           "verl.experimental.fully_async_policy.fully_async_main")
SFT, GENERATION = "verl.trainer.fsdp_sft_trainer", "verl.trainer.main_generation"
E2E_SHELLS = ("tests/special_e2e/sft", "tests/special_e2e/generation")
# the runs that stand in for a dry run, on 2 Ray ranks of this machine: (hybridrl's entry point, overrides)
REAL_RUNS = {
    "sft": ("hybridrl.trainer.main_sft", ["trainer.n_gpus_per_node=2", "trainer.nnodes=1", "trainer.device=cpu",
                                          "ray_init.num_cpus=2", "trainer.total_training_steps=1",
                                          "data.train_batch_size=8", "trainer.logger=[console]"]),
    "generation": ("hybridrl.trainer.main_generation", ["trainer.n_gpus_per_node=2", "trainer.nnodes=1",
                                                        "trainer.device=cpu", "ray_init.num_cpus=2",
                                                        "rollout.response_length=16"]),
}
RECIPE_SHELLS = ("verl/experimental/one_step_off_policy/shell", "verl/experimental/fully_async_policy/shell")
# verl chooses the mode by the recipe's entry point, hybridrl by a key
RECIPE_MODES = {MODULES[1]: "one_step_off", MODULES[2]: "streaming"}


def kind(name: str, argv: list[str]) -> str:
    line = " ".join(argv)
    if SFT in argv:
        return "sft"
    if GENERATION in argv:
        return "generation"
    if "megatron" in name or "strategy=megatron" in line or "ppo_megatron_trainer" in line:
        return "megatron"
    if "npu" in name or "device=npu" in line:
        return "npu"
    if re.search(r"(qwen2_5_vl|qwen3_vl|_vl-|_vl_|glm41v|minicpmo|geo3k)", name.lower()):
        return "vlm"
    if MODULES[1] in argv:
        return "one_step_off"
    if MODULES[2] in argv:
        return "fully_async"
    return "fsdp"


def launch_scripts(verl: Path) -> list[Path]:
    """verl's example scripts that start main_ppo, its SFT trainer or main_generation, then the one-step-off and
    fully_async recipes' scripts and verl's SFT and generation e2e scripts."""
    examples = [s for s in sorted((verl / "examples").rglob("*.sh"))
                if any(m in s.read_text(errors="replace") for m in (MODULES[0], SFT, GENERATION))]
    return examples + [s for shells in (*RECIPE_SHELLS, *E2E_SHELLS) for s in sorted((verl / shells).glob("*.sh"))]


def capture(verl: Path, work: Path) -> dict[str, dict]:
    """Each script's main_ppo arguments and working directory, by script path."""
    shims = work / "shims"
    shims.mkdir()
    for name in ("python", "python3", "torchrun"):
        (shims / name).write_text(CAPTURE.format(python=sys.executable, modules=(*MODULES, SFT, GENERATION)))
        (shims / name).chmod(0o755)
    for name in STAND_INS:
        (shims / name).write_text("#!/bin/sh\nexit 0\n")
        (shims / name).chmod(0o755)
    captured = {}
    for script in launch_scripts(verl):
        out = work / "captured.jsonl"
        out.unlink(missing_ok=True)
        env = {**SCRIPT_ENV, "PATH": f"{shims}:/usr/bin:/bin", "HOME": str(work / "home"), "CAPTURE": str(out)}
        # verl's SFT examples stop without their two arguments (processes per node, save path)
        for arguments in ([], ["2", str(work / "save")]):
            subprocess.run(["bash", str(script), *arguments], cwd=verl, env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=60, check=False)
            if out.exists():
                break
        if out.exists():
            captured[str(script.relative_to(verl))] = json.loads(out.read_text().splitlines()[-1])
    return captured


def pointed(argv: list[str], paths: dict[str, str]) -> list[str]:
    """The arguments after the module, with data, model and output paths replaced (and a recipe's mode)."""
    start = next(i for i, a in enumerate(argv) if a in (*MODULES, SFT, GENERATION) or a.endswith("main_ppo.py"))
    args = []
    for arg in argv[start + 1:]:
        key, sep, _ = arg.partition("=")
        bare = key.lstrip("+~")
        if sep and bare in PATH_KEYS:
            arg = f"{key}={paths[PATH_KEYS[bare]]}"
        elif sep and MODEL_KEY.search(bare):
            arg = f"{key}={paths['model']}"
        args.append(arg)
    if argv[start] in RECIPE_MODES:
        args.append(f"async_training.mode={RECIPE_MODES[argv[start]]}")
    return args


def add_chats(data: Path) -> None:
    """Each row as a whole chat too (a `messages` column: the question, then the worked answer), for verl's
    multi-turn SFT scripts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for split in ("train", "test"):
        table = pq.read_table(data / f"{split}.parquet")
        chats = [[{"role": "user", "content": info["question"]}, {"role": "assistant", "content": info["answer"]}]
                 for info in table.column("extra_info").to_pylist()]
        pq.write_table(table.append_column("messages", pa.array(chats)), data / f"{split}.parquet")


def save_tiny_adapter(model_dir: Path, out: Path) -> None:
    """A PEFT adapter directory for the tiny model, for scripts that start from one (lora_adapter_path)."""
    from hybridrl.models.loading import load_causal_lm
    from hybridrl.models.lora import LoRASettings, adapter_tensors, add_lora, save_adapter

    model = add_lora(load_causal_lm(model_dir), LoRASettings(rank=8, alpha=16))
    save_adapter(out, adapter_tensors(model.state_dict().items()), model, str(model_dir))


def blocker(output: str) -> str:
    """The line of a failed dry run that says why."""
    lines = [line for line in output.splitlines() if line.strip()]
    for line in reversed(lines):  # the last "module.ExceptionClass: message" line of the traceback
        if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Value|Warning): ", line):
            return line.strip()[:300]
    return lines[-1][:300] if lines else "(no output)"


def run_script(argv: list[str], script_kind: str, paths: dict[str, str], cwd: str) -> str | None:
    """None when the script's command line runs with hybridrl (main_ppo's dry run; SFT and generation for real on
    the tiny model, REAL_RUNS' keys in place of the script's, writing under paths["out"]), else what stopped it."""
    args = pointed(argv, paths)
    module, overrides = REAL_RUNS.get(script_kind, ("hybridrl.trainer.main_ppo", ["trainer.dry_run=true"]))
    if script_kind == "sft":
        overrides = [*overrides, f"trainer.default_local_dir={paths['out']}"]
    elif script_kind == "generation":
        overrides = [*overrides, f"data.output_path={paths['generated']}"]
    forced = {override.split("=", 1)[0] for override in overrides}
    args = [arg for arg in args if arg.lstrip("+").split("=", 1)[0] not in forced] + overrides
    run = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    return None if run.returncode == 0 else blocker(run.stdout + run.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verl", type=Path, required=True, help="a verl checkout (its examples/ and config folders)")
    parser.add_argument("--kind", default="fsdp", choices=("fsdp", "one_step_off", "fully_async", "megatron", "npu",
                                                           "vlm", "sft", "generation", "all"))
    parser.add_argument("--out", type=Path, help="write the table here as well")
    args = parser.parse_args()
    from hybridrl.data.tasks.arithmetic import main as write_task
    from hybridrl.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_tiny_model(work / "model", arch="qwen2", size="1m", seed=0)
        save_tiny_adapter(work / "model", work / "adapter")
        write_task(["--out", str(work / "data"), "--train-size", "64", "--test-size", "8"])
        add_chats(work / "data")
        paths = {"model": str(work / "model"), "adapter": str(work / "adapter"),
                 "train": str(work / "data" / "train.parquet"),
                 "val": str(work / "data" / "test.parquet"), "out": str(work / "out"),
                 "generated": ""}
        scripts = capture(args.verl.resolve(), work)
        chosen = {name: rec for name, rec in scripts.items()
                  if args.kind == "all" or kind(Path(name).name, rec["argv"]) == args.kind}
        results = {}
        for number, (name, rec) in enumerate(chosen.items()):
            own = {**paths, "out": str(work / "out" / str(number)),
                   "generated": str(work / "generated" / f"{number}.parquet")}
            results[name] = run_script(rec["argv"], kind(Path(name).name, rec["argv"]), own, rec["cwd"])
    passed = sum(reason is None for reason in results.values())
    kinds = {name: kind(Path(name).name, scripts[name]["argv"]) for name in results}
    by_kind = ", ".join(f"{k} {sum(results[n] is None for n in results if kinds[n] == k)}/"
                        f"{sum(kinds[n] == k for n in results)}" for k in sorted(set(kinds.values())))
    lines = [f"{passed} of {len(results)} {args.kind} scripts pass the {'run' if args.kind in REAL_RUNS else 'dry run'} ({len(scripts)} captured; {by_kind})",
             "", "| script | kind | blocked by |", "| --- | --- | --- |"]
    # scripts named as under examples/, without .sh: verl's files, not this repository's
    lines += [f"| `{name.removeprefix('examples/').removesuffix('.sh')}` | {kinds[name]} | {reason.replace('|', '/')} |"
              for name, reason in sorted(results.items()) if reason]
    reasons = Counter(re.sub(r"=\S+", "=...", reason)[:120] for reason in results.values() if reason)
    lines += ["", "| blocked by | scripts |", "| --- | --- |"] + [f"| {r.replace('|', '/')} | {n} |"
                                                                  for r, n in reasons.most_common()]
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
