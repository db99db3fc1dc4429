#!/usr/bin/env python3
"""PyTorch DistributedDataParallel (gloo) baseline for the Fashion-MNIST MLP's throughput.

python3 perf/pytorch_ddp_mlp.py [--ranks 2] [--batch 64] [--steps 400]
Trains 784-256-128-10 (ReLU) with SGD (lr 0.05, momentum 0.9) on random inputs of the dataset's
shape, one thread per process, and prints images/s over all ranks (median of 3 timed windows after
warm-up). Needs Debian's python3-torch; kdist's tests never do.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, args, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29533"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(1 + rank)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(args.batch, 784)
    y = torch.randint(0, 10, (args.batch,))

    def steps(n):
        for _ in range(n):
            opt.zero_grad()
            loss_fn(ddp(x), y).backward()
            opt.step()

    steps(50)
    rates = []
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        steps(args.steps)
        dist.barrier()
        rates.append(args.ranks * args.batch * args.steps / (time.perf_counter() - t0))
    if rank == 0:
        out.put(statistics.median(rates))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=400)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.spawn(worker, args=(args, out), nprocs=args.ranks, join=True)
    print(f"pytorch {torch.__version__} DDP gloo, {args.ranks} ranks x batch {args.batch}: "
          f"{out.get():.0f} images/s")


if __name__ == "__main__":
    main()
