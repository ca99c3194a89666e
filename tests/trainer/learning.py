"""Held-out greedy accuracy measured outside the trainer: `model.generate` + the task's scorer."""

from __future__ import annotations

from pathlib import Path

import torch

from hybridrl.models.loading import load_causal_lm, load_tokenizer, padding_side
from hybridrl.rewards.scorers import default_compute_score, extract_answer
from hybridrl.utils.cpu_threads import fit_cpu_threads, restore_given_threads


def greedy_answers(model_dir: Path, rows: list[dict]) -> list[str]:
    """The greedy response text of each row's chat prompt (96 new tokens: answers are <= ~50)."""
    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir).eval()
    texts = []
    try:
        with torch.no_grad(), padding_side(tokenizer, "left"):
            for start in range(0, len(rows), 100):
                fit_cpu_threads()  # plain generate beside a busy neighbour would spin like any CPU work
                chunk = rows[start:start + 100]
                prompts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
                           for r in chunk]
                enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
                out = model.generate(**enc, max_new_tokens=96, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=tokenizer.eos_token_id)
                texts += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        restore_given_threads()  # the test process keeps its own count afterwards
    return texts


def accuracy(rows: list[dict], texts: list[str]) -> float:
    """Fraction of rows whose response text the task's scorer accepts."""
    scores = [default_compute_score(r["data_source"], text, r["reward_model"]["ground_truth"])
              for r, text in zip(rows, texts, strict=True)]
    return sum(scores) / len(scores)


def greedy_accuracy(model_dir: Path, rows: list[dict]) -> float:
    """Fraction of rows whose greedy answer the task's scorer accepts."""
    return accuracy(rows, greedy_answers(model_dir, rows))


def sign_slips(rows: list[dict], texts: list[str]) -> int:
    """Negative results answered right but for the minus sign (the quickstart's teacher drops it)."""
    truths = [r["reward_model"]["ground_truth"] for r in rows]
    return sum(int(truth) < 0 and extract_answer(text) == truth.lstrip("-") for truth, text in zip(truths, texts, strict=True))
