"""imagenet/main.py's shape on synthetic images: a client ``torch.optim.SGD`` with momentum and weight decay
(ZeRO-2 takes it behind ``"zero_allow_untested_optimizer": true``), a ``StepLR`` on that optimizer stepped once per
epoch (not handed to ``initialize``, as the example leaves it), a conv net with BatchNorm, ``model.backward`` /
``model.step`` over a DistributedSampler loader, and top-1 accuracy averaged with ``dist.all_reduce``.

Rank 0 prints ``RESULT {"engine": ..., "losses": [...], "lr": [...], "acc1": [...]}``.
"""
import argparse
import json

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import deepspeed

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("--epochs", default=3, type=int, metavar="N", help="number of total epochs to run")
parser.add_argument("-b", "--batch-size", default=16, type=int, help="mini-batch size over all ranks")
parser.add_argument("--lr", "--learning-rate", default=0.05, type=float, dest="lr")
parser.add_argument("--momentum", default=0.9, type=float, metavar="M")
parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
parser.add_argument("--local_rank", type=int, default=-1)
parser = deepspeed.add_config_arguments(parser)


def small_net(num_classes=4):
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, num_classes))


def fake_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 8, 8, generator=g)
    target = images[:, 0, :4].mean((1, 2)).gt(0).long() * 2 + images[:, 1, 4:].mean((1, 2)).gt(0).long()
    return TensorDataset(images, target)


class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n

    def all_reduce(self):
        total = torch.tensor([self.sum, self.count], dtype=torch.float32)
        dist.all_reduce(total, dist.ReduceOp.SUM, async_op=False)
        self.sum, self.count = total.tolist()
        return self.sum / self.count


def main():
    args = parser.parse_args()
    deepspeed.init_distributed()
    args.batch_size = int(args.batch_size / dist.get_world_size())
    torch.manual_seed(7)
    model = small_net()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, args=args, lr_scheduler=None,
                                                  dist_init_required=True)
    train_dataset, val_dataset = fake_data(96, 0), fake_data(32, 1)
    train_sampler = DistributedSampler(train_dataset)
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
    val_loader = DataLoader(val_dataset, batch_size=args.batch_size,
                            sampler=DistributedSampler(val_dataset, shuffle=False))
    losses, lrs, acc1 = [], [], []
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for images, target in train_loader:
            loss = criterion(model(images), target)
            model.backward(loss)
            model.step()
            losses.append(loss.item())
        lrs.append(optimizer.param_groups[0]["lr"])
        model.eval()
        top1 = AverageMeter()
        with torch.no_grad():
            for images, target in val_loader:
                top1.update((model(images).argmax(1) == target).float().mean().item() * 100, images.size(0))
        acc1.append(top1.all_reduce())
        scheduler.step()
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"engine": type(model).__module__, "losses": losses, "lr": lrs, "acc1": acc1}),
              flush=True)


if __name__ == "__main__":
    main()
