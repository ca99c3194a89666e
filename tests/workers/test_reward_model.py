"""The reward model worker: sequence scores against a plain unsharded forward, their placement,
re-tokenisation into the reward model's own chat template, and the hand-off to the reward managers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from batches import rollout_batch
from spmd import run_on_ranks

from hybridrl.controller import ClassWithInitArgs, LocalWorkerGroup
from hybridrl.models.loading import load_tokenizer, load_value_model
from hybridrl.models.tiny import build_tiny_model
from hybridrl.protocol import DataProto
from hybridrl.trainer.dataflow import load_reward_manager
from hybridrl.utils.typed_config import to_dataclass
from hybridrl.workers.reward_model import (
    RewardModelConfig,
    RewardModelWorker,
    check_reward_model,
    conversations,
    last_valid_index,
    place_on_last_response_token,
    retokenize_for_reward_model,
    same_tokenization,
    score_batching,
    sequence_scores,
)

# The reward model's own template, unlike the actor's ChatML: "### role: content" lines, no BOS.
RM_TEMPLATE = "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
CHATS = [("What is 37 + 48?", "#### 85"), ("What is 2 + 3?", "#### 4"), ("Add 9 and 9.", "18")]


def _save_reward_model(body_dir: Path, out: Path, seed: int, chat_template: str | None = None) -> Path:
    """A token-classification checkpoint with a `score` head of trained scale (std 0.3, not HF's 0.02)."""
    model = load_value_model(body_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.score.weight.copy_(torch.randn(model.score.weight.shape, generator=generator) * 0.3)
    model.save_pretrained(out)
    tokenizer = load_tokenizer(body_dir)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def rm_dir(tiny_llama_dir, tmp_path_factory) -> Path:
    """Same tokenizer as the actor (the tiny Qwen2 and Llama tokenizers are identical)."""
    return _save_reward_model(tiny_llama_dir, tmp_path_factory.mktemp("rm"), seed=1)


@pytest.fixture(scope="module")
def other_rm_dir(tmp_path_factory) -> Path:
    """A reward model with its own vocabulary (a smaller BPE) and its own chat template."""
    body = build_tiny_model(tmp_path_factory.mktemp("rm_body"), arch="llama", vocab_size=384, seed=2)
    return _save_reward_model(body, tmp_path_factory.mktemp("rm_other"), seed=3, chat_template=RM_TEMPLATE)


def text_batch(tokenizer, chats=CHATS, prompt_len: int = 24, response_len: int = 8,
               raw_prompt: bool = True) -> DataProto:
    """A rollout batch of real text: ChatML prompts left-padded, responses + EOS right-padded."""
    rows = len(chats)
    prompts = torch.full((rows, prompt_len), tokenizer.pad_token_id)
    responses = torch.full((rows, response_len), tokenizer.pad_token_id)
    prompt_mask, response_mask = torch.zeros(rows, prompt_len, dtype=torch.long), torch.zeros(rows, response_len,
                                                                                                   dtype=torch.long)
    for i, (question, answer) in enumerate(chats):
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
        p = tokenizer(text, add_special_tokens=False)["input_ids"]
        r = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        prompts[i, prompt_len - len(p):], prompt_mask[i, prompt_len - len(p):] = torch.tensor(p), 1
        responses[i, :len(r)], response_mask[i, :len(r)] = torch.tensor(r), 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    non_tensors = {"data_source": ["openai/gsm8k"] * rows,
                   "reward_model": [{"style": "rule", "ground_truth": "85"}] * rows}
    if raw_prompt:
        non_tensors["raw_prompt"] = [[{"role": "user", "content": q}] for q, _ in chats]
    return DataProto.from_dict(
        {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
         "attention_mask": attention_mask, "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
         "response_mask": response_mask},
        non_tensors,
    )


def reference_scores(model_dir, input_ids, attention_mask, position_ids=None) -> torch.Tensor:
    """The definition: one unsharded forward over the full padded rows, head read at the last real token."""
    model = load_value_model(model_dir).eval()
    if position_ids is None:
        position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[..., 0]
    last = [max(j for j in range(attention_mask.shape[1]) if attention_mask[i, j]) for i in range(len(input_ids))]
    return torch.stack([logits[i, j] for i, j in enumerate(last)])


def expected_rm_scores(scores: torch.Tensor, data: DataProto) -> torch.Tensor:
    """Each score on column (valid response tokens - 1), by a plain loop."""
    response_mask = data.batch["attention_mask"][:, -data.batch["responses"].shape[1]:]
    out = torch.zeros(response_mask.shape)
    for i in range(len(scores)):
        n = int(response_mask[i].sum())
        if n:
            out[i, n - 1] = scores[i]
    return out


def rm_config(model_dir, **overrides) -> dict:
    model = {"path": str(model_dir), **overrides.pop("model", {})}
    return {"model": model, **overrides}


def _score_jobs(rank: int, world_size: int, jobs: dict) -> dict:
    """Each job (config, batch) through a fresh worker; one rank goes through a LocalWorkerGroup."""
    out = {}
    for name, (config, data) in jobs.items():
        if world_size == 1:
            group = LocalWorkerGroup(ClassWithInitArgs(RewardModelWorker, config))
            group.call("init_model")
            out[name] = group.call("compute_rm_score", data).batch["rm_scores"]
        else:  # the DP_COMPUTE_PROTO split by hand: this rank scores its chunk
            worker = RewardModelWorker(config)
            worker.init_model()
            out[name] = worker.compute_rm_score(data.chunk(world_size)[rank]).batch["rm_scores"]
    return out


def score(jobs: dict, world_size: int) -> dict:
    per_rank = run_on_ranks(_score_jobs, world_size, jobs)
    return {name: torch.cat([r[name] for r in per_rank]) for name in jobs}


@pytest.fixture(scope="module")
def ids_batch() -> DataProto:
    return rollout_batch(rows=8, prompt_len=10, response_len=12, seed=5, vocab=300)


@pytest.fixture(scope="module")
def ids_reference(rm_dir, ids_batch) -> torch.Tensor:
    b = ids_batch.batch
    return expected_rm_scores(reference_scores(rm_dir, b["input_ids"], b["attention_mask"], b["position_ids"]),
                              ids_batch)


BATCHINGS = {
    "one_pass": {},
    "fixed_3_rows": {"micro_batch_size_per_gpu": 3},
    # On 2 ranks this budget cuts 2 micro-batches on rank 0 and 3 on rank 1, so they must agree on 3.
    "dynamic_40_tokens": {"use_dynamic_bsz": True, "forward_max_token_len_per_gpu": 40},
}


@pytest.mark.parametrize("world_size", [1, 2])
def test_scores_equal_a_plain_forward_at_the_last_valid_token(world_size, rm_dir, tiny_model_dir, ids_batch,
                                                              ids_reference):
    jobs = {name: (rm_config(rm_dir, **extra), ids_batch) for name, extra in BATCHINGS.items()}
    if world_size == 1:  # (2 ranks run only the micro-batched cases: each worker start costs seconds)
        # The actor's tokenizer equals the reward model's, so its ids are scored as they are.
        jobs["same_input_tokenizer"] = (rm_config(rm_dir, model={"input_tokenizer": str(tiny_model_dir)}),
                                        ids_batch)
    else:
        del jobs["one_pass"]
    got = score(jobs, world_size)
    assert ids_reference.abs().sum() > 0.1  # the head gives non-trivial scores
    for name, rm_scores in got.items():
        torch.testing.assert_close(rm_scores, ids_reference, rtol=0, atol=1e-5, msg=name)


def test_a_micro_batch_without_tokens_scores_zero_and_the_others_as_before(rm_dir, ids_batch):
    module = load_value_model(rm_dir)
    emptied = DataProto.from_dict({k: v.clone() for k, v in ids_batch.batch.items()})
    emptied.batch["attention_mask"][:2] = 0  # the first micro-batch of 2 rows has no token at all
    whole = sequence_scores(module, ids_batch, micro_batch_rows=2, max_token_len=None)
    got = sequence_scores(module, emptied, micro_batch_rows=2, max_token_len=None)
    assert got[:2].tolist() == [0.0, 0.0]
    torch.testing.assert_close(got[2:], whole[2:], rtol=0, atol=1e-5)


def test_placement_on_the_last_valid_response_token():
    # Prompt width 2, responses of 3, 1 and 0 valid tokens in width 4 -> columns 2, 0 and none.
    mask = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]])
    got = place_on_last_response_token(torch.tensor([0.5, -2.0, 7.0]), mask, response_length=4)
    assert got.tolist() == [[0, 0, 0.5, 0], [-2.0, 0, 0, 0], [0, 0, 0, 0]]
    # Last real column of a left-padded, a right-padded and a both-sides-padded row.
    assert last_valid_index(torch.tensor([[0, 0, 1, 1], [1, 1, 0, 0], [0, 1, 1, 0]])).tolist() == [3, 1, 2]
    # made on the inputs' device: under torch.device("meta") a tensor made without naming one lands on meta
    with torch.device("meta"):
        placed = place_on_last_response_token(torch.tensor([0.5, -2.0, 7.0], device="cpu"), mask, 4)
    assert placed.device.type == "cpu" and placed.tolist() == got.tolist()


def test_same_tokenization_needs_the_same_vocabulary_and_chat_template(tiny_model_dir, tiny_llama_dir,
                                                                      other_rm_dir):
    actor, llama = load_tokenizer(tiny_model_dir), load_tokenizer(tiny_llama_dir)
    assert same_tokenization(actor, llama)
    llama.chat_template = RM_TEMPLATE  # same ids, but the actor's prompts are not in the RM's format
    assert not same_tokenization(actor, llama)
    assert not same_tokenization(actor, load_tokenizer(other_rm_dir))  # another vocabulary


def test_retokenised_conversation_is_in_the_reward_models_template(tiny_tokenizer, other_rm_dir):
    rm_tok = load_tokenizer(other_rm_dir)
    data = text_batch(tiny_tokenizer)
    inputs = retokenize_for_reward_model(conversations(data, tiny_tokenizer), rm_tok, max_length=None)
    texts = [rm_tok.decode(ids[mask.bool()].tolist()) for ids, mask in
             zip(inputs.batch["input_ids"], inputs.batch["attention_mask"], strict=True)]
    # The EOS that ended each response is a special token of the actor's: it is not part of the text.
    assert texts == ["### user: What is 37 + 48?\n### assistant: #### 85\n",
                     "### user: What is 2 + 3?\n### assistant: #### 4\n",
                     "### user: Add 9 and 9.\n### assistant: 18\n"]
    # The vocabularies really differ: the same text has other ids under the actor's tokenizer.
    assert rm_tok(texts[0], add_special_tokens=False)["input_ids"] != \
        tiny_tokenizer(texts[0], add_special_tokens=False)["input_ids"]
    # A tokenizer without a pad token pads with its EOS: the padding is masked, the real tokens are the same.
    rm_tok.pad_token = None
    unpadded = retokenize_for_reward_model(conversations(data, tiny_tokenizer), rm_tok, max_length=None)
    assert torch.equal(unpadded.batch["attention_mask"], inputs.batch["attention_mask"])
    real = inputs.batch["attention_mask"].bool()
    assert torch.equal(unpadded.batch["input_ids"][real], inputs.batch["input_ids"][real])
    assert set(unpadded.batch["input_ids"][~real].tolist()) <= {rm_tok.eos_token_id}
    # Without raw_prompt the prompt is decoded from ids: the plain text of ChatML's markers stays.
    fallback = conversations(text_batch(tiny_tokenizer, raw_prompt=False), tiny_tokenizer)
    assert fallback[1] == [{"role": "user", "content": "user\nWhat is 2 + 3?\nassistant\n"},
                           {"role": "assistant", "content": "#### 4"}]


def test_retokenised_scores_and_the_reward_manager(tiny_tokenizer, tiny_model_dir, other_rm_dir):
    rm_tok = load_tokenizer(other_rm_dir)
    data = text_batch(tiny_tokenizer)
    texts = [rm_tok.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                                        tokenize=False) for q, a in CHATS]
    full = [rm_tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    input_tokenizer = {"model": {"input_tokenizer": str(tiny_model_dir)}}
    got = score({"full": (rm_config(other_rm_dir, **input_tokenizer, micro_batch_size_per_gpu=2), data),
                 "cut_at_6": (rm_config(other_rm_dir, **input_tokenizer, max_length=6), data)}, world_size=1)
    for name, ids in [("full", full), ("cut_at_6", [row[:6] for row in full])]:
        # Each row alone (no padding at all), so the reference needs no masking logic of its own.
        scores = torch.cat([reference_scores(other_rm_dir, torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long))
                            for row in ids])
        torch.testing.assert_close(got[name], expected_rm_scores(scores, data), rtol=0, atol=1e-5, msg=name)
    assert min(len(row) for row in full) > 6  # so the cut really truncated every row

    # The managers take rm_scores as the reward, on the same token where they put a rule score.
    rm_scores = got["full"]
    manager = load_reward_manager({"reward_model": {"reward_manager": "naive"}}, tiny_tokenizer)
    rule = manager(data)  # gsm8k strict, ground truth 85: only row 0 ("#### 85") scores 1
    assert rule.sum(-1).tolist() == [1.0, 0.0, 0.0]
    assert (rule != 0).nonzero().tolist() == [[0, int(data.batch["response_mask"][0].sum()) - 1]]
    assert ((rm_scores != 0) | (rule != 0)).sum(-1).tolist() == [1, 1, 1]  # one scored token per row
    with_rm = data.union(DataProto.from_dict({"rm_scores": rm_scores}))
    out = manager(with_rm, return_dict=True)
    assert torch.equal(out["reward_tensor"], rm_scores) and out["reward_extra_info"] == {}


def test_config_keys_and_errors():
    config = to_dataclass(RewardModelConfig, {
        "enable": True, "model": {"path": "/rm", "input_tokenizer": "/actor", "fsdp_config": {"param_offload": True}},
        "micro_batch_size": 8, "reward_manager": "dapo", "reward_kwargs": {"max_resp_len": 32},
        "overlong_buffer": {"enable": True, "len": 4, "penalty_factor": 1.0},
    })
    assert config.model.fsdp_config.param_offload and config.overlong_buffer.len == 4
    assert score_batching(config, world_size=2) == (4, None)  # 8 rows over 2 ranks
    assert config.micro_batch_size_per_gpu is None  # computed, not written back
    with pytest.raises(ValueError, match=r"reward_model.micro_batch_size \(8\).*divisible"):
        check_reward_model(config, world_size=3)
    for bad, key in [({"strategy": "megatron"}, "strategy"), ({"max_length": 0}, "max_length"),
                     ({"micro_batch_size_per_gpu": 0}, "micro_batch_size_per_gpu"),
                     ({"model": {"path": None}}, "model.path")]:
        with pytest.raises(ValueError, match=f"reward_model.{key}"):
            check_reward_model(to_dataclass(RewardModelConfig, {"model": {"path": "/rm"}, **bad}), world_size=1)
    with pytest.raises(Exception, match="sandbox_fusionn"):  # a key the schema lacks
        to_dataclass(RewardModelConfig, {"sandbox_fusionn": {"url": "http://x"}})
