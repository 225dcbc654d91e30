"""A GAN trained with two engines, in the shape of DeepSpeedExamples' training/gan/gan_deepspeed_train.py.

    torchrun --nproc_per_node=2 tests/clients/gan.py --deepspeed_config ds.json                 # DeepSpeed
    torchrun --nproc_per_node=2 -m zero_ref.ds.run tests/clients/gan.py --deepspeed_config ds.json  # zero_ref

As the example does: a client ``torch.optim.Adam`` for each net, one engine each, and the modules called
directly, not through their engines: ``netD(real)`` then ``engineD.backward(errD_real)``; the generator's
loss flows back through ``netD(fake)`` into the discriminator's parameters, outside engineD; each phase
begins with ``net.zero_grad()``. Synthetic data (a shifted Gaussian), different on every rank.
``train`` returns this rank's ``loss_d`` and ``loss_g`` of every step; rank 0 prints its own as ``RESULT {json}``.
"""
import argparse
import json

import torch
import torch.nn as nn

import deepspeed

NZ, DIM = 4, 6  # noise and sample sizes


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(NZ, 16), nn.ReLU(True), nn.Linear(16, DIM), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(DIM, 16), nn.LeakyReLU(0.2, inplace=True), nn.Linear(16, 1), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1)


def get_argument_parser():
    parser = argparse.ArgumentParser(description="GAN on synthetic data")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batchSize", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--beta1", type=float, default=0.5)
    parser.add_argument("--manualSeed", type=int, default=999)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--keep_grads", action="store_true",
                        help="no netD.zero_grad(): the generator's gradient in netD's parameters joins D's next step")
    parser.add_argument("--one_backward", action="store_true",
                        help="one engineD.backward(errD_real + errD_fake) instead of one per loss")
    return parser


def real_batch(step, rank, size):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return 0.5 + 0.3 * torch.randn(size, DIM, generator=g)


def noise_batch(step, rank, size):
    return torch.randn(size, NZ, generator=torch.Generator().manual_seed(7919 + 1000 * step + rank))


def train(args):
    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    torch.manual_seed(args.manualSeed)
    netG, netD = Generator(), Discriminator()
    criterion = nn.BCELoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=args.lr, betas=(args.beta1, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=args.lr, betas=(args.beta1, 0.999))
    model_engineD, optimizerD, _, _ = deepspeed.initialize(args=args, model=netD, model_parameters=netD.parameters(),
                                                           optimizer=optimizerD)
    model_engineG, optimizerG, _, _ = deepspeed.initialize(args=args, model=netG, model_parameters=netG.parameters(),
                                                           optimizer=optimizerG)
    losses_d, losses_g = [], []
    for i in range(args.steps):
        # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
        if not args.keep_grads:
            netD.zero_grad()
        real = real_batch(i, rank, args.batchSize)
        label = torch.full((args.batchSize,), 1.0)
        output = netD(real)
        errD_real = criterion(output, label)
        if not args.one_backward:
            model_engineD.backward(errD_real)
        fake = netG(noise_batch(i, rank, args.batchSize))
        label = torch.full((args.batchSize,), 0.0)  # (a new tensor: errD_real may still need the old one)
        output = netD(fake.detach())
        errD_fake = criterion(output, label)
        errD = errD_real + errD_fake
        model_engineD.backward(errD if args.one_backward else errD_fake)
        model_engineD.step()
        # (2) Update G: maximize log(D(G(z))); its loss reaches netD's parameters too
        netG.zero_grad()
        label = torch.full((args.batchSize,), 1.0)  # fake labels are real for the generator cost
        output = netD(fake)
        errG = criterion(output, label)
        model_engineG.backward(errG)
        model_engineG.step()
        losses_d.append(errD.item())
        losses_g.append(errG.item())
        if rank == 0:
            print(f"[{i}/{args.steps}] Loss_D: {errD.item():.4f} Loss_G: {errG.item():.4f}")
    return {"loss_d": losses_d, "loss_g": losses_g}


def main():
    parser = get_argument_parser()
    parser = deepspeed.add_config_arguments(parser)
    result = train(parser.parse_args())
    if torch.distributed.get_rank() == 0:
        print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
