"""GRPO on two hosts (network namespaces, each a Ray node): one rank per host trains as two ranks on one host do,
ranks that cannot reach each other fail naming both addresses, a host lost during generation or during the update
stops the run at once naming it, and a restarted cluster resumes to the uninterrupted run's results; a host cut off
from the network stops the run once Ray declares it dead; the pools of a split run work from two hosts.

Every run is `python -m hybridrl.trainer.main_ppo` in the head host's namespace with RAY_ADDRESS, as a user's driver
on the head node runs it (docs/multinode.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from two_host_cluster import RAY_HEAD, RAY_PORT, RAY_WORKER, UNROUTED_INTERFACE, TwoHostCluster

pytestmark = [pytest.mark.slow, pytest.mark.multinode]

HERE = Path(__file__).resolve().parent
STEPS = 4
# Metrics that depend only on the seeds and the arithmetic (not on time or memory).
DETERMINISTIC = ["critic/score/mean", "critic/advantages/max", "actor/pg_loss", "actor/entropy", "actor/grad_norm",
                 "actor/pg_clipfrac", "response_length/mean"]
TWO_HOSTS = ["trainer.nnodes=2", "trainer.n_gpus_per_node=1"]
ONE_HOST = ["trainer.nnodes=1", "trainer.n_gpus_per_node=2"]


def run_overrides(data: Path, model: Path, run_dir: Path) -> list[str]:
    """A few-second GRPO step; generation long enough (48 tokens) and the update slow enough (4 epochs) that a host
    lost after a step's checkpoint or after its scores lands in them. The loss takes the rollout's log-probs (bypass
    mode) and has no KL term, so the update is the step's first call after scoring."""
    return [
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model}", "algorithm.adv_estimator=grpo", "data.train_batch_size=4",
        "data.max_response_length=48", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.ppo_epochs=4",
        "actor_rollout_ref.rollout.calculate_log_probs=true", "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        f"custom_reward_function.path={HERE / 'marking_reward.py'}", f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[console,file]", "trainer.test_freq=-1", "trainer.val_before_train=false",
        "trainer.device=cpu", "trainer.backend=ray", "trainer.save_freq=1", f"trainer.total_training_steps={STEPS}",
    ]


class Driver:
    """One run of an entry point (`main_ppo`, `main_sft`) in the head host's namespace, its output in `log`."""

    def __init__(self, cluster: TwoHostCluster, run_dir: Path, overrides: list[str], env: dict | None = None,
                 module: str = "hybridrl.trainer.main_ppo", cwd: Path | None = None) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = run_dir.parent / f"{run_dir.name}.log"
        self.log_file = self.log_path.open("a")
        self.process = subprocess.Popen(
            cluster.head.command(sys.executable, "-m", module, *overrides),
            stdout=self.log_file, stderr=subprocess.STDOUT, env={**cluster.driver_env(), **(env or {})}, cwd=cwd)

    def wait(self, timeout_s: float = 240) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        finally:
            self.log_file.close()

    @property
    def log(self) -> str:
        return self.log_path.read_text().replace("\r", "\n")

    def metrics(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def committed_step(self) -> int:
        tracker = self.run_dir / "latest_checkpointed_iteration.txt"
        return int(tracker.read_text()) if tracker.exists() else 0


def run(cluster: TwoHostCluster, run_dir: Path, overrides: list[str], env: dict | None = None) -> Driver:
    driver = Driver(cluster, run_dir, overrides, env)
    code = driver.wait()
    assert code == 0, driver.log[-4000:]
    return driver


def by_step(metrics: list[dict]) -> dict[int, dict]:
    return {m["step"]: m for m in metrics}


def assert_same_run(got: dict[int, dict], expected: dict[int, dict], steps: list[int]) -> None:
    for step in steps:
        for key in DETERMINISTIC:
            assert got[step][key] == pytest.approx(expected[step][key], abs=1e-6, rel=0), (step, key)


def placed_nodes(log: str, pool: str) -> list[str]:
    found = re.findall(rf"{pool}\s+placed on node\(s\) ([\d., ]+)", log)
    assert found, f"no placement line for {pool} in the driver's output"
    return found[-1].replace(" ", "").split(",")


@pytest.fixture(scope="module")
def uninterrupted(two_hosts, arithmetic_data, tiny_model_dir, tmp_path_factory) -> Driver:
    """The two-host run the other tests compare with: one rank on each host."""
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    return run(two_hosts, run_dir, [*run_overrides(arithmetic_data, tiny_model_dir, run_dir), *TWO_HOSTS])


def test_one_rank_per_host_trains_as_two_ranks_on_one_host(two_hosts, uninterrupted, arithmetic_data, tiny_model_dir,
                                                            tmp_path):
    assert placed_nodes(uninterrupted.log, "global_pool") == [two_hosts.head.ip, two_hosts.worker.ip]
    one_host = run(two_hosts, tmp_path / "one_host", [*run_overrides(arithmetic_data, tiny_model_dir,
                                                                     tmp_path / "one_host"), *ONE_HOST])
    assert len(set(placed_nodes(one_host.log, "global_pool"))) == 1
    two, one = by_step(uninterrupted.metrics()), by_step(one_host.metrics())
    assert sorted(two) == sorted(one) == list(range(1, STEPS + 1))
    assert_same_run(two, one, list(range(1, STEPS + 1)))
    # each step's checkpoint, written by ranks on both hosts to the storage both reach, is committed whole
    assert uninterrupted.committed_step() == STEPS
    actor = uninterrupted.run_dir / f"global_step_{STEPS}" / "actor"
    assert sorted(p.name for p in actor.glob("extra_state_*")) == [
        "extra_state_world_size_2_rank_0.pt", "extra_state_world_size_2_rank_1.pt"]


def test_sft_on_two_hosts_trains_as_on_one_host(two_hosts, arithmetic_data, tiny_model_dir, tmp_path):
    runs = {}
    for name, layout in (("two_hosts", TWO_HOSTS), ("one_host", ONE_HOST)):
        run_dir = tmp_path / name
        driver = Driver(two_hosts, run_dir, [
            f"data.train_files={arithmetic_data / 'train.parquet'}", f"data.val_files={arithmetic_data / 'test.parquet'}",
            f"model.partial_pretrain={tiny_model_dir}", f"trainer.default_local_dir={run_dir}",
            "data.train_batch_size=8", "data.micro_batch_size_per_gpu=2", "trainer.total_training_steps=3",
            "optim.lr_warmup_steps_ratio=0", "trainer.device=cpu", *layout], module="hybridrl.trainer.main_sft")
        assert driver.wait() == 0, driver.log[-3000:]
        runs[name] = by_step(driver.metrics())
    assert placed_nodes((tmp_path / "two_hosts.log").read_text(), "sft") == [two_hosts.head.ip, two_hosts.worker.ip]
    assert sorted(runs["two_hosts"]) == [1, 2, 3]
    for step in (1, 2, 3):
        for key in ("train/loss", "train/grad_norm"):
            assert runs["two_hosts"][step][key] == pytest.approx(runs["one_host"][step][key], abs=1e-6, rel=0)


def test_ranks_that_cannot_reach_each_other_fail_within_a_minute_naming_both(two_hosts, arithmetic_data,
                                                                             tiny_model_dir, tmp_path):
    # each host's unrouted interface holds an address the other host has no route to
    start = time.monotonic()
    driver = Driver(two_hosts, tmp_path / "run", [*run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run"),
                                                  *TWO_HOSTS], env={"GLOO_SOCKET_IFNAME": UNROUTED_INTERFACE})
    assert driver.wait() != 0
    assert time.monotonic() - start < 120  # the reach check's 60 s at most, plus the driver's start
    assert re.search(rf"at {re.escape(two_hosts.head.unrouted_ip)} cannot reach rank 1 at "
                     rf"{re.escape(two_hosts.worker.unrouted_ip)}", driver.log), driver.log[-3000:]
    assert "GLOO_SOCKET_IFNAME" in driver.log


def _lose_worker_host_when(cluster: TwoHostCluster, ready, record: dict) -> None:
    deadline = time.monotonic() + 180
    while not ready():
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    record["at"] = time.monotonic()
    cluster.lose_worker_host()


def _stopped_by_lost_host(cluster: TwoHostCluster, driver: Driver, ready, call: str) -> None:
    """Lose the worker host once `ready()`; the driver must stop within 60 s naming the node, a rank and the call."""
    record: dict = {}
    killer = threading.Thread(target=_lose_worker_host_when, args=(cluster, ready, record))
    killer.start()
    code = driver.wait()
    stopped = time.monotonic()
    killer.join()
    assert "at" in record and code != 0, driver.log[-3000:]
    assert stopped - record["at"] < 60
    died = re.search(rf"WorkerDiedError: the worker process of rank \d of pool 'global_pool' on node "
                     rf"{re.escape(cluster.worker.ip)} died during {call} ", driver.log)
    assert died, driver.log[-3000:]


def test_a_host_lost_in_generation_or_update_stops_the_run_and_a_restarted_cluster_resumes_it(
        two_hosts, uninterrupted, arithmetic_data, tiny_model_dir, tmp_path):
    run_dir, scored = tmp_path / "run", tmp_path / "scored.txt"
    overrides = [*run_overrides(arithmetic_data, tiny_model_dir, run_dir), *TWO_HOSTS]

    # lost while step 2 generates: step 1's checkpoint is committed, the rollout of step 2 is under way
    first = Driver(two_hosts, run_dir, overrides)
    _stopped_by_lost_host(two_hosts, first, lambda: first.committed_step() >= 1, "generate_sequences")
    committed = first.committed_step()
    assert committed >= 1
    two_hosts.restart_worker_host()

    # resumed, then lost after the next step's responses are scored: in that step's update
    second = Driver(two_hosts, run_dir, overrides, env={"HYBRIDRL_TEST_SCORED": str(scored)})
    _stopped_by_lost_host(two_hosts, second, lambda: scored.exists() and scored.stat().st_size > 0, "update_actor")
    assert second.committed_step() == committed  # the interrupted step committed nothing
    assert not (run_dir / f"global_step_{committed + 1}" / "checkpoint_complete.json").exists()
    two_hosts.restart_worker_host()

    # resumed again on the restarted cluster: it ends where the uninterrupted run ended
    third = run(two_hosts, run_dir, overrides)
    resumed = by_step(third.metrics())
    assert max(resumed) == STEPS and third.committed_step() == STEPS
    assert_same_run(resumed, by_step(uninterrupted.metrics()), list(range(committed + 1, STEPS + 1)))


def test_a_host_cut_off_from_the_network_stops_the_run_once_ray_declares_it_dead(two_hosts, arithmetic_data,
                                                                                  tiny_model_dir, tmp_path):
    # no process dies and no connection closes: the driver learns of it from Ray's health checks of the node
    run_dir = tmp_path / "run"
    driver = Driver(two_hosts, run_dir, [*run_overrides(arithmetic_data, tiny_model_dir, run_dir), *TWO_HOSTS,
                                         "trainer.total_training_steps=100"])
    deadline = time.monotonic() + 180
    while driver.committed_step() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    cut = time.monotonic()
    two_hosts.cut_worker_host_off()
    try:
        code = driver.wait()
        assert code != 0 and time.monotonic() - cut < 90, driver.log[-3000:]
        assert re.search(rf"rank 1 of pool 'global_pool' on node {re.escape(two_hosts.worker.ip)} died during \w+",
                         driver.log), driver.log[-3000:]
        # what was committed before stays whole; the interrupted step committed nothing
        committed = driver.committed_step()
        assert (run_dir / f"global_step_{committed}" / "checkpoint_complete.json").exists()
        assert not (run_dir / f"global_step_{committed + 1}" / "checkpoint_complete.json").exists()
    finally:
        two_hosts.reconnect_worker_host()


def test_rollout_pool_on_one_host_and_training_pool_on_the_other(two_hosts, arithmetic_data, tiny_model_dir, tmp_path):
    # each process reserves both CPUs of a host, so each pool takes a host of its own; the driver runs in another
    # working directory than the nodes, and names its checkpoint directory relatively, as verl's default does
    driver = Driver(two_hosts, tmp_path / "split", [
        *run_overrides(arithmetic_data, tiny_model_dir, Path("split")), "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1", "ray_init.cpus_per_worker=2",
        "algorithm.rollout_correction.bypass_mode=false", "trainer.total_training_steps=2"], cwd=tmp_path)
    assert driver.wait() == 0, driver.log[-4000:]
    assert driver.committed_step() == 2 and (tmp_path / "split" / "global_step_2" / "actor" / ".metadata").exists()
    training, rollout = placed_nodes(driver.log, "global_pool"), placed_nodes(driver.log, "rollout_pool")
    assert sorted(training + rollout) == sorted([two_hosts.head.ip, two_hosts.worker.ip])
    for metrics in driver.metrics():
        # the rollout sampled with the weights the update before sent over the veth (fp32: rounding only)
        assert metrics["rollout/log_prob_diff_max"] <= 1e-5
        assert metrics["perf/weight_sync_bytes"] > 4e6


def test_the_docs_give_the_commands_the_cluster_runs():
    page = (HERE.parents[1] / "docs" / "multinode.md").read_text()
    placeholders = {"head_ip": "<head-ip>", "host_ip": "<this-host-ip>", "port": RAY_PORT, "cpus": "<cpus>"}
    for template in (RAY_HEAD, RAY_WORKER):
        assert template.format(**placeholders) in page, template
    assert "RAY_ADDRESS=<head-ip>:6379 python -m hybridrl.trainer.main_ppo" in page
    assert " ".join(TWO_HOSTS) in page
