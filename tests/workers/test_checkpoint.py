"""Checkpoints on real gloo ranks: exact resume, crash safety, resharding, retention and the HF files.

Three spawned runs share the work (each start costs a few seconds):
- run A (2 ranks, uninterrupted): step 1, save + commit step 1, step 2, then a save of step 2 that raises
  midway; also a few small saves into separate roots for retention.
- run B (2 ranks, fresh process group): resume_mode=auto, load, step 2.
- run C (1 rank): load the 2-rank checkpoint (DCP reshards it).
"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from spmd import run_on_ranks
from transformers import AutoModelForCausalLM

from hybridrl.models.loading import load_causal_lm, load_tokenizer
from hybridrl.workers.checkpoint import (
    ROLE_MARKER,
    STEP_MARKER,
    TMP_TAG,
    TRACKER_FILE,
    CheckpointError,
    CheckpointManager,
    commit_checkpoint,
    resolve_contents,
)
from hybridrl.workers.checkpoint_resume import find_latest_ckpt_path, resolve_resume_path
from hybridrl.workers.config import FSDPConfig, OptimConfig
from hybridrl.workers.fsdp_engine import FSDPEngine

PEAK_LR = 1e-2
FIXED_INPUT = torch.arange(1, 17).view(2, 8)  # (batch, seq) for logits comparisons
ALL = ["model", "optimizer", "extra", "hf_model"]


def _engine(model_dir: str) -> FSDPEngine:
    # 4 warmup steps, so the learning rate changes every step and a lost scheduler state shows
    return FSDPEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=PEAK_LR, lr_warmup_steps=4))


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _train_step(engine: FSDPEngine) -> float:
    """One optimizer step on a batch drawn from the global torch RNG, so RNG restore matters too."""
    ids = torch.randint(0, 300, (2, 10))  # (batch, seq), this rank's data
    engine.module(input_ids=ids, labels=ids).loss.backward()
    engine.clip_and_step()
    return engine.lr_scheduler_step()


def _probe() -> tuple:
    return torch.rand(3), random.random(), float(np.random.rand())


def _full_state(engine: FSDPEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.full_model_state_dict().items()}


def _commit(root: Path, step: int) -> None:
    """What the driver does after every role saved (here rank 0 stands in for it)."""
    dist.barrier()
    if dist.get_rank() == 0:
        commit_checkpoint(root, step)
    dist.barrier()


def _raise_after_first_file(*_args, **_kwargs):
    raise OSError("disk full (injected after the RNG file was written)")


def _retention_saves(engine: FSDPEngine, root: Path, keep: int, steps: range, commit_last: bool) -> None:
    manager = CheckpointManager(engine, None, {"save_contents": ["model"]})
    for step in steps:
        manager.save_checkpoint(root / f"global_step_{step}" / "actor", step, max_ckpt_to_keep=keep)
        if step != steps[-1] or commit_last:
            _commit(root, step)


def _run_uninterrupted(rank, world_size, model_dir, root):
    root = Path(root)
    _seed_all(rank)
    engine = _engine(model_dir)
    manager = CheckpointManager(engine, load_tokenizer(model_dir), {"save_contents": ALL})
    _train_step(engine)
    manager.save_checkpoint(root / "global_step_1" / "actor", 1)
    _commit(root, 1)
    probe = _probe()
    logits_1 = engine.module(input_ids=FIXED_INPUT).logits.detach()
    state_1 = _full_state(engine)
    lr_2 = _train_step(engine)
    state_2 = _full_state(engine)

    engine.sharded_state = _raise_after_first_file  # the instance attribute shadows the method
    try:
        manager.save_checkpoint(root / "global_step_2" / "actor", 2)
        failed = None
    except OSError as err:
        failed = str(err)
    del engine.sharded_state

    _retention_saves(engine, root / "keep2", 2, range(1, 5), commit_last=False)
    _retention_saves(engine, root / "keep1", 1, range(1, 4), commit_last=True)
    return {"probe": probe, "logits_1": logits_1, "state_1": state_1, "state_2": state_2, "lr_2": lr_2,
            "failed": failed}


def _run_resumed(rank, world_size, model_dir, root):
    _seed_all(100 + rank)  # different RNG states, to be overwritten by the checkpoint's
    engine = _engine(model_dir)
    path = resolve_resume_path("auto", root)
    meta = CheckpointManager(engine, None, {"save_contents": ALL}).load_checkpoint(Path(path) / "actor")
    probe = _probe()
    lr_2 = _train_step(engine)
    return {"path": path, "meta": meta, "probe": probe, "state_2": _full_state(engine), "lr_2": lr_2}


def _run_resharded(rank, world_size, model_dir, root):
    engine = _engine(model_dir)
    manager = CheckpointManager(engine, None, {"save_contents": ALL})
    manager.load_checkpoint(Path(root) / "global_step_1" / "actor")
    lr = engine.optimizer.param_groups[0]["lr"]
    try:  # the retention checkpoints were saved with the model only
        manager.load_checkpoint(Path(root) / "keep2" / "global_step_3" / "actor")
        wrong_contents = None
    except CheckpointError as err:
        wrong_contents = str(err)
    return {"state_1": _full_state(engine), "lr": lr, "wrong_contents": wrong_contents}


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    a = run_on_ranks(_run_uninterrupted, 2, str(tiny_model_dir), str(root))
    listing_after_a = {p.name: sorted(c.name for c in p.iterdir()) for p in root.iterdir() if p.is_dir()}
    b = run_on_ranks(_run_resumed, 2, str(tiny_model_dir), str(root))
    c = run_on_ranks(_run_resharded, 1, str(tiny_model_dir), str(root))[0]
    return {"root": root, "a": a, "b": b, "c": c, "listing_after_a": listing_after_a}


@pytest.mark.slow
def test_resume_matches_the_uninterrupted_run_bit_for_bit(runs):
    a, b = runs["a"], runs["b"]
    assert b[0]["path"] == str(runs["root"] / "global_step_1")
    assert b[0]["meta"]["world_size"] == 2 and b[0]["meta"]["global_step"] == 1
    # warmup over 4 steps: after two scheduler steps the rate is 3/4 of the peak (it would be 2/4 had
    # the resumed run restarted its schedule)
    assert a[0]["lr_2"] == b[0]["lr_2"] == pytest.approx(0.75 * PEAK_LR)
    assert a[1]["state_2"] == {} and b[1]["state_2"] == {}  # full states are gathered on rank 0
    assert a[0]["state_2"].keys() == b[0]["state_2"].keys()
    for key, value in a[0]["state_2"].items():
        assert torch.equal(b[0]["state_2"][key], value), key
    # and step 2 really moved the parameters, so equality is not trivially the loaded state
    assert not torch.equal(a[0]["state_2"]["model.norm.weight"], a[0]["state_1"]["model.norm.weight"])


def test_rng_states_are_restored_per_rank(runs):
    for rank in (0, 1):
        ref, got = runs["a"][rank]["probe"], runs["b"][rank]["probe"]
        assert torch.equal(ref[0], got[0]) and ref[1:] == got[1:]
    # ranks were seeded differently, and each got its own state back
    assert not torch.equal(runs["a"][0]["probe"][0], runs["a"][1]["probe"][0])


def test_a_save_that_raises_midway_is_never_the_latest(runs):
    root, a = runs["root"], runs["a"]
    assert a[0]["failed"] and "disk full" in a[0]["failed"]
    step2 = runs["listing_after_a"]["global_step_2"]
    # only the temporary directory exists, and it holds the file written before the failure
    assert len(step2) == 1 and step2[0].startswith("actor" + TMP_TAG)
    assert sorted(p.name for p in (root / "global_step_2" / step2[0]).iterdir()) == \
        ["extra_state_world_size_2_rank_0.pt", "extra_state_world_size_2_rank_1.pt"]
    assert (root / TRACKER_FILE).read_text() == "1"
    assert find_latest_ckpt_path(root) == str(root / "global_step_1")
    with pytest.raises(CheckpointError, match="never committed.*newest complete checkpoint there is .*global_step_1"):
        resolve_resume_path("resume_path", root, root / "global_step_2")


def test_find_latest_falls_back_when_the_tracked_step_is_broken(runs, tmp_path):
    import shutil

    saved_uncommitted = shutil.copytree(runs["root"] / "keep2", tmp_path / "keep2")  # 3 committed, 4 not
    assert find_latest_ckpt_path(saved_uncommitted) == str(saved_uncommitted / "global_step_3")
    # a death between commit_checkpoint's two writes: the tracker names step 4, which has no step marker
    (saved_uncommitted / TRACKER_FILE).write_text("4")
    assert find_latest_ckpt_path(saved_uncommitted) == str(saved_uncommitted / "global_step_3")
    (saved_uncommitted / TRACKER_FILE).unlink()  # without a tracker, the step markers decide
    assert find_latest_ckpt_path(saved_uncommitted) == str(saved_uncommitted / "global_step_3")

    root = shutil.copytree(runs["root"] / "keep1", tmp_path / "keep1")  # steps 2 and 3, both committed
    (root / "global_step_3" / "actor" / ROLE_MARKER).unlink()  # e.g. a half-deleted directory
    assert find_latest_ckpt_path(root) == str(root / "global_step_2")
    with pytest.raises(CheckpointError, match=f"global_step_3/actor is incomplete: it has no {ROLE_MARKER}"):
        resolve_resume_path("resume_path", root, root / "global_step_3")
    assert find_latest_ckpt_path(tmp_path / "nothing-here") is None


def test_retention_keeps_the_newest_and_never_the_only_committed_one(runs):
    root = runs["root"]
    # keep=2 over steps 1..4 (step 4 not committed): saving step 3 deleted step 1, saving step 4 step 2
    assert sorted(p.name for p in (root / "keep2").iterdir()) == ["global_step_3", "global_step_4", TRACKER_FILE]
    # keep=1 over steps 1..3, all committed: saving step 3 deleted step 1 but had to keep step 2, the
    # committed one at that moment
    assert sorted(p.name for p in (root / "keep1").iterdir()) == ["global_step_2", "global_step_3", TRACKER_FILE]
    assert json.loads((root / "keep1" / "global_step_3" / STEP_MARKER).read_text())["roles"] == ["actor"]


def test_a_different_world_size_loads_resharded(runs):
    c, a = runs["c"], runs["a"][0]
    for key, value in a["state_1"].items():
        assert torch.equal(c["state_1"][key], value), key
    assert c["lr"] == pytest.approx(0.5 * PEAK_LR)  # one scheduler step into the 4-step warmup: 2/4
    assert "load_contents asks for ['optimizer', 'extra']" in c["wrong_contents"]


def test_hf_files_and_full_model_in_the_checkpoint(runs, tiny_model_dir):
    hf_dir = runs["root"] / "global_step_1" / "actor" / "huggingface"
    names = {p.name for p in hf_dir.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"} <= names
    assert json.loads((hf_dir / "generation_config.json").read_text()) == \
        json.loads((Path(tiny_model_dir) / "generation_config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True)
    with torch.no_grad():
        logits = model(input_ids=FIXED_INPUT).logits
    torch.testing.assert_close(logits, runs["a"][0]["logits_1"], rtol=0, atol=1e-6)


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match=r"checkpoint.save_contents has unknown entries \['weights'\]"):
        resolve_contents({"save_contents": ["model", "weights"]})
    with pytest.raises(ValueError, match=r"checkpoint.load_contents has unknown entries \['rng'\]"):
        resolve_contents({"save_contents": ["model"], "load_contents": ["rng"]})
    # verl's load_contents: ${.save_contents} -- an unset load list follows the save list
    assert resolve_contents({"save_contents": ["model"]}) == (["model"], ["model"])
    assert resolve_contents(None) == (["model", "optimizer", "extra"], ["model", "optimizer", "extra"])
    with pytest.raises(ValueError, match="trainer.resume_mode must be"):
        resolve_resume_path("latest", "/tmp")
    with pytest.raises(CheckpointError, match="global_step_N directory"):
        resolve_resume_path("resume_path", "/tmp", "/tmp/some_dir")
    assert resolve_resume_path("disable", "/tmp") is None


def _gloo_thread_count() -> int:
    """Threads of this process named after gloo's worker loop: the loops themselves, and any OpenMP
    worker one of them started (a new thread inherits its creator's name)."""
    names = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):  # the thread ended while we looked
            names.append((task / "comm").read_text().strip())
    return names.count("pt_gloo_runloop")


def _save_and_load_on_one_rank(rank, world_size, model_dir, root):
    # as in a local-backend driver on 2 cores: every thread's parallel regions (gloo's too) take 2 threads
    torch.set_num_threads(2)
    engine = _engine(model_dir)
    _train_step(engine)
    before = _gloo_thread_count()
    manager = CheckpointManager(engine, None, {"save_contents": ALL})
    manager.save_checkpoint(Path(root) / "global_step_1" / "actor", global_step=1)
    manager.load_checkpoint(Path(root) / "global_step_1" / "actor")
    return {"before": before, "after": _gloo_thread_count(), "torch_threads": torch.get_num_threads()}


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through Linux's /proc")
def test_a_single_rank_checkpoint_leaves_no_openmp_team_on_gloo_threads(tiny_model_dir, tmp_path):
    # On one rank DCP runs without its planning collectives. With them, gloo's worker thread copied the
    # plan in an OpenMP parallel region and kept that team for as long as the group lived: more OpenMP
    # threads than cores, and every later multi-threaded op of the process ran ~3x slower (2 cores).
    result = run_on_ranks(_save_and_load_on_one_rank, 1, str(tiny_model_dir), str(tmp_path))[0]
    assert result["before"] > 0  # the rank's gloo group runs its loops
    assert result["after"] == result["before"], result
