"""cifar10_deepspeed.py's shape on synthetic 8x8 images: argparse + ``deepspeed.add_config_arguments``,
``--deepspeed_config``, ``training_data`` handed to ``initialize`` (the engine's DistributedSampler loader),
``from deepspeed import comm as dist`` for a barrier and an all-reduced accuracy, a checkpoint with
``client_state`` after the first epoch, then loaded again and the second epoch replayed.

Rank 0 prints ``RESULT {"engine": ..., "losses": [...], "accuracy": [...], "resumed": [...], "client_state": {...}}``.
"""
import argparse
import json
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

import deepspeed
from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator


def add_argument():
    parser = argparse.ArgumentParser(description="CIFAR")
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    parser.add_argument("-e", "--epochs", default=2, type=int, help="number of total epochs")
    parser.add_argument("--samples", default=128, type=int, help="synthetic training images")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3)
        self.conv2 = nn.Conv2d(6, 8, 3)
        self.fc1 = nn.Linear(8, 24)
        self.fc2 = nn.Linear(24, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = torch.flatten(F.relu(self.conv2(x)), 1)
        return self.fc2(F.relu(self.fc1(x)))


def synthetic_cifar(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 8, 8, generator=g)
    labels = (images.mean((1, 2, 3)) * 40).long().clamp(-5, 4) + 5  # a label the pixels decide
    return torch.utils.data.TensorDataset(images, labels)


def main(args):
    deepspeed.init_distributed()
    if dist.get_rank() != 0:
        dist.barrier()  # rank 0 "downloads" first, as the example does
    trainset, testset = synthetic_cifar(args.samples, 0), synthetic_cifar(64, 1)
    if dist.get_rank() == 0:
        dist.barrier()

    torch.manual_seed(42)
    net = Net()
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    model_engine, optimizer, trainloader, _ = deepspeed.initialize(
        args=args, model=net, model_parameters=parameters, training_data=trainset)
    local_device = get_accelerator().device_name(model_engine.local_rank)
    criterion = nn.CrossEntropyLoss()

    def train_epoch():
        losses = []
        for data in trainloader:
            inputs, labels = data[0].to(local_device), data[1].to(local_device)
            loss = criterion(model_engine(inputs), labels)
            model_engine.backward(loss)
            model_engine.step()
            losses.append(loss.item())
        return losses

    def accuracy():  # each rank scores half the test set; the counts are summed over ranks
        half = len(testset) // dist.get_world_size()
        x, y = testset[dist.get_rank() * half:(dist.get_rank() + 1) * half]
        with torch.no_grad():
            correct = (model_engine(x.to(local_device)).argmax(1) == y.to(local_device)).sum().float()
        dist.all_reduce(correct, op=dist.ReduceOp.SUM)
        return correct.item() / (half * dist.get_world_size())

    ckpt = [tempfile.mkdtemp() if dist.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(ckpt, src=0)  # one directory for every rank
    losses, acc = [], []
    for epoch in range(args.epochs):
        losses += train_epoch()
        acc.append(accuracy())
        if epoch == 0:
            model_engine.save_checkpoint(ckpt[0], client_state={"epoch": epoch, "accuracy": acc[-1]})
    _, client_state = model_engine.load_checkpoint(ckpt[0])
    resumed = train_epoch()
    dist.barrier()
    if dist.get_rank() == 0:
        mine = {k: client_state[k] for k in ("epoch", "accuracy")}
        print("RESULT " + json.dumps({"engine": type(model_engine).__module__, "losses": losses, "accuracy": acc,
                                      "resumed": resumed, "client_state": mine}), flush=True)


if __name__ == "__main__":
    main(add_argument())
