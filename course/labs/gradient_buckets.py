"""Chapter 4's exercises on ZeRO-2's bucketed gradient reduction: the rank functions Tasks 4.1 and 4.2's
checks run (the student's function comes in as an argument) and the rules they are checked against.

    got = zero_ref.launch(reducer_exercise, 2, make_reducer, numels, buckets, orders)
    launches_due(buckets, order)          # buckets complete, in bucket order, after each arrival
"""
import torch

from zero_ref import comm
from zero_ref.models import GPT, make_batch
from zero_ref.stages.base import make_buckets


def exercise_grads(numels, rank):
    """Rank ``rank``'s local gradients of the given sizes (the same on every call)."""
    g = torch.Generator().manual_seed(10 + rank)
    return [torch.randn(k, generator=g) for k in numels]


def launches_due(buckets, order):
    """After each gradient of ``order`` arrives: how many buckets may have been reduced, which is the
    length of the prefix of ``buckets`` whose members have all arrived (bucket b goes after 0 … b − 1)."""
    due, arrived = [], set()
    for i in order:
        arrived.add(i)
        done = 0
        while done < len(buckets) and set(buckets[done]) <= arrived:
            done += 1
        due.append(done)
    return due


def reducer_exercise(rank, world_size, make_reducer, numels, buckets, orders):
    """Task 4.1's check on a rank: feed this rank's gradients to ``make_reducer``'s ``ready`` in
    ``orders[rank]``; returns (shards, collectives issued after each arrival, (op, bytes) of each call)."""
    grads = exercise_grads(numels, rank)
    ready, finish = make_reducer(numels, buckets, rank, world_size)
    issued = []
    with comm.recording() as log:
        for i in orders[rank]:
            ready(i, grads[i].clone())
            issued.append(len(log.records))
        shards = [s.clone() for s in finish()]
    return shards, issued, [(r.op, r.bytes) for r in log.records]


def zero2_exercise(rank, world_size, reduce_into_partition, cfg, bucket_size, micro_steps, micro, seed=7):
    """Task 4.2's check on a rank: ``micro_steps`` backwards of the course GPT on this rank's micro-batches,
    each bucket of each reduced by ``reduce_into_partition`` into this rank's partitions, in bucket order;
    returns (partitions, per micro-step the (op, bytes) of each collective)."""
    torch.manual_seed(0)
    net = GPT(cfg)
    params = list(net.parameters())
    buckets = make_buckets(params, bucket_size, world_size, rank)
    partitions = [torch.zeros(b.layout.shard_numel) for b in buckets]
    idx, targets = make_batch(cfg, micro * world_size * micro_steps, seed=seed)
    calls = []
    for k in range(micro_steps):
        start = (k * world_size + rank) * micro
        loss = net(idx[start:start + micro], targets[start:start + micro])[1]
        grads = dict(zip(map(id, params), torch.autograd.grad(loss, params)))
        with comm.recording() as log:
            for b, part in zip(buckets, partitions):
                reduce_into_partition(b.layout.flatten([grads[id(p)] for p in b.params]), part, world_size)
        calls.append([(r.op, r.bytes) for r in log.records])
    return partitions, calls


def summed_gradients(cfg, micro_batches, micro, seed=7):
    """The course GPT's gradient summed over ``micro_batches`` micro-batches of ``micro`` samples, in one
    process: (parameters, {id(parameter): summed gradient})."""
    torch.manual_seed(0)
    net = GPT(cfg)
    params = list(net.parameters())
    total = {id(p): torch.zeros_like(p) for p in params}
    idx, targets = make_batch(cfg, micro * micro_batches, seed=seed)
    for k in range(micro_batches):
        loss = net(idx[k * micro:(k + 1) * micro], targets[k * micro:(k + 1) * micro])[1]
        for p, g in zip(params, torch.autograd.grad(loss, params)):
            total[id(p)] += g
    return params, total
