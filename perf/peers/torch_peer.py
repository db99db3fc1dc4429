#!/usr/bin/env python3
"""The peers of examples/fashion_mnist: the same MLP and CNN trained with PyTorch DDP, and with
kfac-pytorch's KFACPreconditioner, on the real Fashion-MNIST data.

    python3 perf/peers/torch_peer.py --model mlp|cnn --optimizer sgd|kfac [--ranks 2] [--batch 64]
        [--limit-steps 300] [--kfac-pytorch DIR] [--device cpu|cuda] [--json FILE]

Each of --ranks processes (gloo, one thread each, the same as kdist's `mpiexec -n 2` with
OPENBLAS_NUM_THREADS=1) reads its own contiguous shard of every global batch of a seeded
permutation, normalised with the training set's mean and standard deviation, as kdist's
nn::ShardedBatches does. SGD: lr 0.05, momentum 0.9 (kdist's defaults); K-FAC: lr 0.1,
momentum 0, damping 0.3, KL clip 0.03, factors every step, inverses every 10 (kdist's
defaults), compute method `inverse` (kdist inverts; `--kfac-method eigen` is kfac-pytorch's
default). `--device cuda`: each rank on its own GPU (rank r on GPU r), NCCL instead of gloo, the
data set on the GPU. The first --warmup steps are not timed. Prints one line with images/s over all ranks;
--json FILE writes {"peer", "model", "optimizer", "images_per_second", ...}.
Exit status 3 when torch (or kfac-pytorch under DIR) cannot be imported: the driver skips the
row and says why.
"""
import argparse
import gzip
import json
import os
import socket
import sys
import time
from queue import Empty

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    import numpy as np
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_training_set(directory):
    import torch
    for suffix in (".gz", ""):
        images = os.path.join(directory, "train-images-idx3-ubyte" + suffix)
        labels = os.path.join(directory, "train-labels-idx1-ubyte" + suffix)
        if os.path.exists(images) and os.path.exists(labels):
            x = torch.from_numpy(read_idx(images).astype("float32") / 255.0)
            x = (x - MEAN) / STD
            y = torch.from_numpy(read_idx(labels).astype("int64"))
            return x.reshape(-1, 784), y
    raise SystemExit(f"torch_peer: no Fashion-MNIST training files in {directory} "
                     "(sudo apt-get install dataset-fashion-mnist)")


def build_model(kind):
    import torch.nn as nn
    if kind == "mlp":
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Unflatten(1, (1, 28, 28)),
                         nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def make_preconditioner(model, args):
    sys.path.insert(0, args.kfac_pytorch)
    import kfac  # noqa: E402 (from --kfac-pytorch DIR)
    return kfac.preconditioner.KFACPreconditioner(
        model, factor_update_steps=args.factor_every, inv_update_steps=args.inverse_every,
        damping=args.damping, kl_clip=args.kl_clip, lr=args.lr, factor_decay=args.factor_decay,
        compute_method=args.kfac_method)


def worker(rank, args, queue):
    import torch
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(args.seed)
    x_all, y_all = load_training_set(args.data)
    x_all, y_all = x_all.to(device), y_all.to(device)
    model = build_model(args.model).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    precond = make_preconditioner(model, args) if args.optimizer == "kfac" else None
    loss_fn = torch.nn.CrossEntropyLoss()
    order = torch.randperm(x_all.shape[0], generator=torch.Generator().manual_seed(args.seed)).to(device)
    global_batch = args.batch * args.ranks
    steps = min(args.limit_steps, x_all.shape[0] // global_batch)

    def step(k):
        first = k * global_batch + rank * args.batch
        idx = order[first:first + args.batch]
        x, y = x_all[idx], y_all[idx]
        opt.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        if precond is not None:
            precond.step()
        opt.step()
        return loss

    def settle():  # every rank here and, on a GPU, every kernel finished
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()

    for k in range(args.warmup):
        step(k)
    settle()
    t0 = time.perf_counter()
    for k in range(args.warmup, steps):
        loss = step(k)
    settle()
    seconds = time.perf_counter() - t0
    if rank == 0:
        queue.put({"images_per_second": global_batch * (steps - args.warmup) / seconds, "seconds": seconds,
                   "steps": steps - args.warmup, "last_loss": float(loss)})
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(ctx, args):
    """Starts the ranks and returns rank 0's result. A rank still in gloo's teardown 30 s after the
    result came is stopped (seen here: the last rank spinning at 100 % once rank 0, which holds the
    rendezvous store, had left); the result stands. A rank that fails ends the run."""
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(rank, args, queue)) for rank in range(args.ranks)]
    for p in procs:
        p.start()
    row = None
    while row is None:
        try:
            row = queue.get(timeout=1.0)
        except Empty:
            failed = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if not failed and all(p.exitcode == 0 for p in procs):
                try:  # every rank exited cleanly: the row may have landed since the get timed out
                    row = queue.get(timeout=1.0)
                    break
                except Empty:
                    pass
            if failed or all(p.exitcode == 0 for p in procs):
                for p in procs:
                    p.terminate()
                why = ", ".join(f"rank {r} exited with status {c}" for r, c in failed) or "no rank gave a result"
                raise RuntimeError(why)
    for p in procs:
        p.join(timeout=30)
    stuck = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in stuck:
        procs[r].terminate()
        procs[r].join()
    if stuck:
        print(f"torch_peer: rank(s) {stuck} still in gloo's teardown 30 s after the run; stopped (the result stands)",
              file=sys.stderr)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--optimizer", choices=["sgd", "kfac"], default="sgd")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--limit-steps", type=int, default=300, help="steps in all (warm-up included)")
    p.add_argument("--warmup", type=int, default=10, help="steps before the timer starts")
    p.add_argument("--lr", type=float, help="default 0.05 with sgd, 0.1 with kfac")
    p.add_argument("--momentum", type=float, help="default 0.9 with sgd, 0 with kfac")
    p.add_argument("--damping", type=float, default=0.3)
    p.add_argument("--kl-clip", type=float, default=0.03)
    p.add_argument("--factor-decay", type=float, default=0.95)
    p.add_argument("--factor-every", type=int, default=1)
    p.add_argument("--inverse-every", type=int, default=10)
    p.add_argument("--kfac-method", choices=["inverse", "eigen"], default="inverse")
    p.add_argument("--kfac-pytorch", metavar="DIR", help="a kfac-pytorch v0.4.2 source tree (its kfac/ package)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=0, help="gloo's rendezvous port (0: a free one)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    if args.lr is None:
        args.lr = 0.1 if args.optimizer == "kfac" else 0.05
    if args.momentum is None:
        args.momentum = 0.0 if args.optimizer == "kfac" else 0.9
    if args.warmup >= args.limit_steps:
        p.error(f"--warmup {args.warmup} must be below --limit-steps {args.limit_steps}")
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"torch_peer: PyTorch is not available ({e}); sudo apt-get install python3-torch", file=sys.stderr)
        return 3
    if args.device == "cuda" and torch.cuda.device_count() < args.ranks:
        print(f"torch_peer: --device cuda needs a GPU per rank ({args.ranks} ranks, "
              f"{torch.cuda.device_count()} GPUs)", file=sys.stderr)
        return 3
    peer = f"pytorch {torch.__version__} DDP" + (" on CUDA" if args.device == "cuda" else "")
    if args.optimizer == "kfac":
        if not args.kfac_pytorch:
            print("torch_peer: --optimizer kfac needs --kfac-pytorch DIR", file=sys.stderr)
            return 3
        try:
            sys.path.insert(0, args.kfac_pytorch)
            import kfac
        except Exception as e:  # a tree that does not import is a skipped row, not a crash
            print(f"torch_peer: kfac-pytorch does not import from {args.kfac_pytorch}: {e}", file=sys.stderr)
            return 3
        peer = f"kfac-pytorch {kfac.__version__} ({args.kfac_method}) on {peer}"
    if args.port == 0:
        args.port = free_port()
    try:
        row = run_ranks(mp.get_context("spawn"), args)
    except RuntimeError as e:
        print(f"torch_peer: {e}", file=sys.stderr)
        return 1
    row.update({"peer": peer, "model": args.model, "optimizer": args.optimizer, "ranks": args.ranks,
                "batch": args.batch, "device": args.device})
    print(f"{peer}, {args.model} {args.optimizer}, {args.ranks} ranks x batch {args.batch}: "
          f"{row['images_per_second']:.0f} images/s ({row['steps']} timed steps, loss {row['last_loss']:.4f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
