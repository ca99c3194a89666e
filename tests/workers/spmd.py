"""Run a function on N real gloo ranks (spawned processes) and collect each rank's return value.

For engine-level tests that need torch.distributed but not the Ray machinery around it. The ranks
compute on the CPU (gloo) whether or not the machine has a GPU: the helper pins the device as a worker
group's launcher would, so engines, meshes and workers built inside agree with the gloo group.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybridrl.utils.device import device_env


def _entry(rank: int, world_size: int, out_dir: str, fn: Callable, args: tuple) -> None:
    # workers built inside read these; they find the process group below already joined
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), **device_env("cpu"))
    torch.set_num_threads(1)
    # a file rendezvous: a port picked here and bound later could be taken in between by another test's gloo
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=world_size)
    try:
        result = ("ok", fn(rank, world_size, *args))
    except BaseException:  # report any failure to the parent instead of hanging it
        result = ("error", traceback.format_exc())
    done = Path(out_dir, f"{rank}.pkl")
    done.with_suffix(".tmp").write_bytes(pickle.dumps(result))
    done.with_suffix(".tmp").replace(done)  # whole or absent: the parent reads it only once it is complete
    dist.destroy_process_group()


# Ranks fork from one server process that has imported these once: a fresh interpreter per rank would
# spend seconds importing torch and transformers for every call.
_PRELOAD = ["torch", "torch.distributed.fsdp", "transformers", "hybridrl.workers.fsdp_workers"]


def run_on_ranks(fn: Callable, world_size: int, *args) -> list:
    """fn(rank, world_size, *args) on every rank; fn and args must be picklable (module-level)."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    with tempfile.TemporaryDirectory() as out_dir:
        try:
            mp.start_processes(_entry, args=(world_size, out_dir, fn, args), nprocs=world_size,
                               join=True, start_method="forkserver")
        except mp.ProcessExitedException as exit_error:
            # A rank that had already reported its result can still die while the process shuts down
            # (gloo's threads at exit: "terminate called without an active exception", SIGABRT, seen
            # twice in full suite runs, never alone). The work it reported is complete; anything less
            # is a failure.
            if not all(Path(out_dir, f"{r}.pkl").exists() for r in range(world_size)):
                raise
            warnings.warn(f"a rank exited abnormally after reporting its result: {exit_error}", stacklevel=2)
        results = [pickle.loads(Path(out_dir, f"{r}.pkl").read_bytes()) for r in range(world_size)]
    errors = [r[1] for r in results if r[0] == "error"]
    if errors:
        raise RuntimeError("a rank failed:\n" + errors[0])
    return [r[1] for r in results]
