"""main_generation end to end on the tiny model and an arithmetic parquet written by the task CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from hydra import compose, initialize_config_dir

import hybridrl.trainer.main_generation as main_generation
from hybridrl.models.loading import load_causal_lm, load_tokenizer
from hybridrl.trainer.command_line import verl_overrides, yaml_keys
from hybridrl.workers.config import RolloutConfig

CONFIG_DIR = str(Path(main_generation.__file__).parent / "config")


@pytest.fixture(scope="module")
def arithmetic_parquet(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("arith")
    subprocess.run([sys.executable, "-m", "hybridrl.data.tasks.arithmetic", "--out", str(out),
                    "--train-size", "6", "--test-size", "5"], check=True, capture_output=True)
    return out / "test.parquet"


def compose_generation(overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("generation", overrides=overrides)


def test_n_responses_per_row_are_added_as_a_column(arithmetic_parquet, tiny_model_dir, tmp_path):
    config = compose_generation([
        f"data.path={arithmetic_parquet}", f"model.path={tiny_model_dir}", "data.n_samples=3", "data.batch_size=2",
        f"data.output_path={tmp_path / 'gen' / 'out.parquet'}", "rollout.response_length=8",
        "rollout.prompt_length=128", "trainer.backend=local",
    ])
    output = main_generation.run_generation(config)
    source, result = pq.read_table(arithmetic_parquet), pq.read_table(output)
    assert result.column_names == source.column_names + ["responses"]
    assert result.drop_columns(["responses"]).equals(source)
    responses = result.column("responses").to_pylist()
    assert len(responses) == 5 and all(len(r) == 3 and all(isinstance(t, str) for t in r) for r in responses)


def greedy(arithmetic_parquet, tiny_model_dir, output: Path, *extra: str) -> list[str]:
    return [f"data.path={arithmetic_parquet}", f"model.path={tiny_model_dir}", "data.n_samples=1",
            f"data.output_path={output}", "rollout.do_sample=false", "rollout.response_length=12",
            "rollout.prompt_length=128", *extra]


@pytest.mark.slow
@pytest.mark.ray
def test_verls_command_line_on_two_ray_ranks_gives_the_one_rank_responses(ray_cluster, arithmetic_parquet,
                                                                           tiny_model_dir, tmp_path):
    # verl's generation scripts: `+model.trust_remote_code`, a rank count; 5 rows in batches of 2 over 2 ranks
    # leave a last batch of one prompt, padded to two. The command joins the test's Ray cluster.
    import ray

    two_ranks = tmp_path / "two.parquet"
    subprocess.run(
        [sys.executable, "-m", "hybridrl.trainer.main_generation",
         *greedy(arithmetic_parquet, tiny_model_dir, two_ranks, "trainer.nnodes=1", "trainer.n_gpus_per_node=2",
                 "data.batch_size=2", "+model.trust_remote_code=False")],
        check=True, capture_output=True, text=True,
        env={**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address},
    )
    one_rank = main_generation.run_generation(compose_generation(
        greedy(arithmetic_parquet, tiny_model_dir, tmp_path / "one.parquet", "trainer.backend=local")))
    got = pq.read_table(two_ranks).column("responses").to_pylist()
    assert len(got) == 5 and got == pq.read_table(one_rank).column("responses").to_pylist()
    # and main_eval scores it: an untrained model writes no answer tag, so every score is 0
    printed = subprocess.run([sys.executable, "-m", "hybridrl.trainer.main_eval", f"data.path={two_ranks}"],
                             check=True, capture_output=True, text=True).stdout
    assert "arithmetic/mean@1: 0.0000" in printed and "arithmetic/pass@1: 0.0000" in printed


def test_verls_plus_form_sets_the_yaml_entry_points_own_keys_and_leaves_open_dicts_alone():
    kept = verl_overrides(["+model.trust_remote_code=True", "+rollout.temperature=0.5", "+rollout.trace.x=1",
                           "+model.unknown=1", "+rollout.checkpoint_engine.backend=x"],
                          yaml_keys("generation", rollout=RolloutConfig))
    assert kept == ["model.trust_remote_code=True", "rollout.temperature=0.5", "+rollout.trace.x=1",
                    "+model.unknown=1", "rollout.checkpoint_engine.backend=x"]
    assert verl_overrides(["+pass_threshold=0.5", "+data.response_key=r", "+data.prompt_key=p"],
                          yaml_keys("evaluation")) == ["pass_threshold=0.5", "data.response_key=r", "+data.prompt_key=p"]


def test_greedy_responses_equal_model_generate(arithmetic_parquet, tiny_model_dir, tmp_path):
    config = compose_generation(greedy(arithmetic_parquet, tiny_model_dir, tmp_path / "greedy.parquet",
                                       "trainer.backend=local"))
    output = main_generation.run_generation(config)
    got = pq.read_table(output).column("responses").to_pylist()
    # independent reference: the chat-templated first prompt through model.generate, greedy
    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir).eval()
    messages = pq.read_table(arithmetic_parquet).column("prompt").to_pylist()[0]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    input_ids = torch.tensor([ids["input_ids"]])
    with torch.no_grad():
        ref = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                             max_new_tokens=12, pad_token_id=0, eos_token_id=3)[0, input_ids.shape[1]:]
    assert got[0] == [tokenizer.decode(ref, skip_special_tokens=True)]


def test_config_errors_name_the_keys(arithmetic_parquet, tiny_model_dir, tmp_path):
    base = [f"data.path={arithmetic_parquet}", f"model.path={tiny_model_dir}", f"data.output_path={tmp_path}/o.parquet"]
    with pytest.raises(ValueError, match="trainer.backend=local needs .* = 2 to be 1 .*use trainer.backend=ray"):
        main_generation.check_config(compose_generation(base + ["trainer.n_gpus_per_node=2", "trainer.backend=local"]))
    with pytest.raises(ValueError, match="trainer.backend must be ray or local, got 'mpi'"):
        main_generation.check_config(compose_generation(base + ["trainer.backend=mpi"]))
    with pytest.raises(ValueError, match="rollout.do_sample"):
        main_generation.check_config(compose_generation(base + ["data.n_samples=4", "rollout.do_sample=false"]))
    config = main_generation.check_config(compose_generation(base + ["data.n_samples=4", "rollout.top_k=5"]))
    assert (config.n, config.top_k, config.response_length) == (4, 5, 256)


@pytest.mark.gpu
def test_greedy_generation_on_the_gpu_equals_model_generate_and_main_eval_scores_it(arithmetic_parquet,
                                                                                    tiny_model_dir, tmp_path):
    config = compose_generation([
        f"data.path={arithmetic_parquet}", f"model.path={tiny_model_dir}", "data.n_samples=1",
        f"data.output_path={tmp_path / 'greedy.parquet'}", "rollout.do_sample=false",
        "rollout.response_length=12", "rollout.prompt_length=128", "trainer.device=cuda", "trainer.backend=local",
        # fp32 as the reference below: an untrained model's near-tied logits would let bf16 rounding (which
        # differs between the graphed loop, the GPU default, and model.generate) pick another token
        "rollout.dtype=float32",
    ])
    output = main_generation.run_generation(config)
    got = pq.read_table(output).column("responses").to_pylist()
    # reference: model.generate on the same GPU, greedy, for the first prompt
    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir).eval().to("cuda")
    messages = pq.read_table(arithmetic_parquet).column("prompt").to_pylist()[0]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    input_ids = torch.tensor([ids["input_ids"]], device="cuda")
    with torch.no_grad():
        ref = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                             max_new_tokens=12, pad_token_id=0, eos_token_id=3)[0, input_ids.shape[1]:]
    assert got[0] == [tokenizer.decode(ref, skip_special_tokens=True)]
    # main_eval reads the file as it reads one written on the CPU: an untrained model writes no answer tag
    printed = subprocess.run([sys.executable, "-m", "hybridrl.trainer.main_eval", f"data.path={output}"],
                             check=True, capture_output=True, text=True).stdout
    assert "arithmetic/mean@1: 0.0000" in printed


def test_device_is_checked(arithmetic_parquet, tiny_model_dir, tmp_path, monkeypatch):
    base = [f"data.path={arithmetic_parquet}", f"model.path={tiny_model_dir}", f"data.output_path={tmp_path}/o.parquet"]
    with pytest.raises(ValueError, match="trainer.device must be 'cpu', 'cuda' or 'auto', got 'tpu'"):
        main_generation.check_config(compose_generation(base + ["trainer.device=tpu"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without a GPU
    with pytest.raises(ValueError, match="trainer.device=cuda but torch sees no GPU; set trainer.device=cpu"):
        main_generation.check_config(compose_generation(base + ["trainer.device=cuda"]))
    config = compose_generation(base + ["trainer.device=auto"])
    main_generation.check_config(config)
    assert config.trainer.device == "cpu"  # auto resolved where the run will use it


def test_a_bf16_rollout_on_a_cpu_that_emulates_bf16_is_warned_about(arithmetic_parquet, tiny_model_dir, tmp_path,
                                                                     monkeypatch, caplog):
    from hybridrl.utils.device import native_bf16

    base = [f"data.path={arithmetic_parquet}", f"model.path={tiny_model_dir}", f"data.output_path={tmp_path}/o.parquet"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for dtype, warns in (("bfloat16", not native_bf16("cpu")), ("auto", False), ("float32", False)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="hybridrl.trainer.main_generation"):
            main_generation.check_config(compose_generation(base + ["trainer.device=cpu", f"rollout.dtype={dtype}"]))
        warned = [r.getMessage() for r in caplog.records if "without native bf16" in r.getMessage()]
        assert len(warned) == int(warns) and all(w.startswith("rollout.dtype=bfloat16") for w in warned), warned


def test_vllm_settings_with_the_hf_engine_are_warned_about_by_generations_keys(arithmetic_parquet, tiny_model_dir,
                                                                               tmp_path, caplog):
    base = [f"data.path={arithmetic_parquet}", f"model.path={tiny_model_dir}", f"data.output_path={tmp_path}/o.parquet"]
    with caplog.at_level("WARNING", logger="hybridrl.trainer.main_generation"):
        main_generation.check_config(compose_generation(base + ["rollout.tensor_model_parallel_size=2"]))
    assert [r.getMessage() for r in caplog.records] == [
        "no effect in this run: rollout.tensor_model_parallel_size=2 (vLLM engine settings, and rollout.name is not "
        "vllm)"]
