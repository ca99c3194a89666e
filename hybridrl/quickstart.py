"""The main job, while the PPO trainer is being built: a smoke run of the single controller.

`python -m hybridrl.quickstart` starts a local Ray cluster, places a 2-rank worker group whose ranks
form a gloo process group, and drives it the way the trainer will: a data-parallel call on a DataProto
whose size does not divide by the world size, an all-reduce across ranks, and two colocated roles that
share processes. It prints what it checked and exits non-zero if anything disagrees.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist

from hybridrl.controller import Dispatch, Worker, create_colocated_worker_cls, register
from hybridrl.protocol import DataProto


class SquareWorker(Worker):
    """Squares its rows and reports which rank did the work."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def square(self, data: DataProto) -> DataProto:
        x = data.batch["x"]
        return DataProto.from_dict({"y": x * x, "rank": torch.full_like(x, self.rank)})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def global_sum(self, value: float) -> float:
        total = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(total)
        return total.item()


def run(world_size: int, rows: int) -> bool:
    from hybridrl.controller.ray import RayClassWithInitArgs, RayWorkerGroup
    from hybridrl.controller.ray_resources import RayResourcePool, init_ray

    start = time.perf_counter()
    init_ray(num_cpus=world_size)
    pool = RayResourcePool(process_on_nodes=[world_size])
    fused = create_colocated_worker_cls({"actor": RayClassWithInitArgs(SquareWorker),
                                         "ref": RayClassWithInitArgs(SquareWorker)})
    groups = RayWorkerGroup(pool, fused).spawn(prefix_set=["actor", "ref"])
    actor, ref = groups["actor"], groups["ref"]
    print(f"started {world_size} ranks in {time.perf_counter() - start:.1f}s")

    batch = DataProto.from_dict({"x": torch.arange(rows, dtype=torch.float32)},
                                {"uid": np.array([f"p{i}" for i in range(rows)], dtype=object)})
    out = actor.square(batch)
    checks = {
        f"DP_COMPUTE_PROTO on {rows} rows returns {rows} rows in order":
            out.batch["y"].tolist() == [float(i * i) for i in range(rows)],
        "every rank did part of the work": sorted(set(out.batch["rank"].tolist())) == list(range(world_size)),
        "gloo all-reduce agrees on every rank":
            actor.global_sum(1.0) == [float(sum(range(1, world_size + 1)))] * world_size,
        "colocated roles share processes":
            [i["pid"] for i in actor.process_info()] == [i["pid"] for i in ref.process_info()],
    }
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAILED'}] {name}")
    print(f"done in {time.perf_counter() - start:.1f}s")
    return all(checks.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--rows", type=int, default=7)
    args = parser.parse_args()
    if not run(args.world_size, args.rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
