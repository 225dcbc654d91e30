"""Chapter 7's harness: ZeRO-Infinity runs on real ranks, the swap file of the swapping exercise, and the tile
store of the tiling exercise."""
import os
import re
import weakref

import torch

from zero_ref import offload
from zero_ref.models import GPT, make_batch
from zero_ref.offload.nvme import SwapError
from zero_ref.optim import AdamConfig, adam_step_
from zero_ref.stages import ZeroStage3


def train(rank, world_size, root, runs, cfg, steps, micro):
    """Stage 3 in bf16 for each of ``runs`` (None: in memory; else NVMe settings): states, bytes and I/O logs."""
    out = {}
    for name, run in runs.items():
        torch.manual_seed(0)
        net = GPT(cfg)
        kw = {}
        if run:
            kw = dict(offload_optimizer={"device": "nvme", "nvme_path": root, "buffer_count": run["buffer_count"],
                                         "pipeline_read": run["pipeline"], "pipeline_write": run["pipeline"]},
                      offload_param={"device": "nvme", "nvme_path": root}, sub_group_size=run["sub_group_size"])
        opt = ZeroStage3(net, adam=AdamConfig(lr=1e-3), precision="bf16", param_persistence_threshold=0,
                         cpu_adam="torch", **kw)
        per_step, files = [], []
        for step in range(steps):
            if run:
                opt.offload.log.clear()
            idx, targets = make_batch(cfg, micro * world_size, seed=step)
            mine = slice(rank * micro, (rank + 1) * micro)
            _, loss = net(idx[mine], targets[mine])
            opt.backward(loss)
            opt.step()
            if run:
                log = opt.offload.log
                per_step.append({(kind, prefix): sum(e.nbytes for e in log.events
                                                     if e.kind == kind and e.key.startswith(prefix))
                                 for kind in ("read", "write") for prefix in ("optim", "param")})
                files.append(sorted(os.listdir(opt.offload.store.dir)))
        res = dict(state=opt.state_dict(), tiers=offload.tier_bytes(opt), per_step=per_step, files=files)
        if run:
            store = opt.offload.store
            res["events"] = [(e.kind, e.key, e.start, e.end, e.nbytes) for e in opt.offload.log.events]
            res["groups"] = [sum(b.layout.shard_numel for b in g) for g in opt.offload.sub_groups]
            res["units"] = {u.name: u.layout.shard_numel for u in opt.units}
            # A write that fails mid-step (injected: ENOSPC on the 3rd write of the version).
            before = store.load_manifest()
            store.fail_after = 2
            idx, targets = make_batch(cfg, micro * world_size, seed=steps)
            _, loss = net(idx[mine], targets[mine])
            opt.backward(loss)
            try:
                opt.step()
            except SwapError as e:
                res["failure"] = re.sub(r"'?/[^ ']+'?", "<swap dir>", str(e))  # (temporary paths vary)
            res["manifest unchanged"] = store.load_manifest() == before
            res["files after failure"] = sorted(os.listdir(store.dir)) == files[-1]
            res["steps"] = opt.adam_steps
            opt.offload.close()
        out[name] = res
    return out


class TileStore:
    """A Linear's weight off the device in tiles; counts the bytes of fetched tiles still referenced."""

    def __init__(self, linear, in_splits, out_splits):
        def bounds(n, k):                          # DeepSpeed's partition_uniform: the first n % k parts one larger
            q, r = divmod(n, k)
            edges = [p * q + min(p, r) for p in range(k + 1)]
            return [slice(a, b) for a, b in zip(edges, edges[1:])]

        self._weight = linear.weight.detach().clone()
        self.rows, self.cols = bounds(linear.out_features, out_splits), bounds(linear.in_features, in_splits)
        self.grad = torch.zeros_like(self._weight)
        self.bias = linear.bias.detach().clone().requires_grad_()
        self.alive = self.peak = self.fetched = 0

    def fetch(self, i, j):
        """Tile (i, j) of the weight, a fresh tensor, counted until its last reference is gone."""
        tile = self._weight[self.rows[i], self.cols[j]].clone()
        size = tile.numel() * tile.element_size()
        self.alive += size
        self.fetched += size
        self.peak = max(self.peak, self.alive)
        weakref.finalize(tile, self._release, size)   # runs when the last reference (autograd's too) is gone
        return tile

    def _release(self, size):
        self.alive -= size

    def add_grad(self, i, j, g):
        """Add ``g`` into the gradient of tile (i, j)."""
        self.grad[self.rows[i], self.cols[j]] += g


class SwapFile:
    """A rank's optimizer partition on "NVMe", in sub-groups of ``numels`` elements, three fp32 states each (master,
    exp_avg, exp_avg_sq). Logs every read, step and write in order with its bytes, and counts the host buffers
    (one state of one sub-group each) still referenced."""

    def __init__(self, numels, t=1, cfg=AdamConfig(weight_decay=0.1), seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.numels, self.t, self.cfg = list(numels), t, cfg
        self._file = [[torch.randn(n, generator=gen), torch.zeros(n), torch.zeros(n)] for n in self.numels]
        self.grads = [torch.randn(n, generator=gen) for n in self.numels]
        self.log, self.alive, self.peak = [], 0, 0

    def read(self, i):
        """Swap sub-group i in: its three states in fresh host buffers."""
        bufs = [s.clone() for s in self._file[i]]
        self.log.append(("read", i, sum(b.numel() * b.element_size() for b in bufs)))
        for b in bufs:
            self.alive += 1
            weakref.finalize(b, self._release)     # runs when the last reference to the buffer is gone
        self.peak = max(self.peak, self.alive)
        return bufs

    def _release(self):
        self.alive -= 1

    def write(self, i, bufs):
        """Swap sub-group i out: its three states, from host buffers, into the file."""
        if len(bufs) != 3 or [b.numel() for b in bufs] != [self.numels[i]] * 3:
            raise ValueError(f"write({i}, ...) takes sub-group {i}'s three states of {self.numels[i]} elements each")
        self._file[i] = [b.clone() for b in bufs]
        self.log.append(("write", i, sum(b.numel() * b.element_size() for b in bufs)))

    def adam(self, i, bufs):
        """Step sub-group i: Adam on its three states, in the host buffers, with its gradient."""
        if [b.numel() for b in bufs] != [self.numels[i]] * 3:
            raise ValueError(f"adam({i}, ...) takes sub-group {i}'s three states of {self.numels[i]} elements each")
        adam_step_(bufs[0], self.grads[i], bufs[1], bufs[2], self.t, self.cfg)
        self.log.append(("step", i, 0))

    def in_memory(self):
        """The states after the same Adam step with everything in memory (for the check)."""
        out = [[s.clone() for s in group] for group in self._file]
        for (p, m, v), g in zip(out, self.grads):
            adam_step_(p, g, m, v, self.t, self.cfg)
        return out

    def states(self):
        """Every state as the file holds it now, sub-group by sub-group (for the check)."""
        return [[s.clone() for s in group] for group in self._file]

