"""A Ray GPU actor that sees every GPU of its node computes on the one Ray assigned it, not on its local rank.

Ray narrows each GPU actor's CUDA_VISIBLE_DEVICES to its own GPU, unless
RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES is set; then every actor sees all of them. Here Ray is told the
node has 2 GPUs (it schedules by declared resources; there is no GPU), and inside each actor torch is made
to report the 2 devices the actor would see.
"""

import pytest
import ray

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@ray.remote(num_gpus=1, num_cpus=0)
class GpuActor:
    def index_at_local_rank_zero(self) -> tuple[int, list]:
        import torch

        from hybridrl.utils.device import cuda_index

        torch.cuda.device_count = lambda: 2  # what torch reports where the actor sees both GPUs
        return cuda_index(0), [str(i) for i in ray.get_gpu_ids()]


def test_each_actor_computes_on_the_gpu_ray_assigned_it():
    ray.init(num_cpus=1, num_gpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}})
    try:
        actors = [GpuActor.remote() for _ in range(2)]
        answers = ray.get([a.index_at_local_rank_zero.remote() for a in actors])
    finally:
        ray.shutdown()
    assert sorted(index for index, _ in answers) == [0, 1]  # both at local rank 0, on different GPUs
    assert all([str(index)] == ids for index, ids in answers)
