"""Chapter 25's experiments: the MoE GPT on expert-parallel ranks and in one process, DeepSpeed's MoE layer
(zero_ref.ds.moe.layer.MoE), the harnesses of Tasks 25.1 and 25.2's checks, and DeepSeek-V3's price.

Rank functions take what they need as arguments, so ``zero_ref.launch`` ships them by name.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from zero_ref import comm
from zero_ref.models import GPTConfig, make_batch
from zero_ref.parallel import moe


@dataclass(frozen=True)
class MoERun:
    """The MoE GPT (every MLP an MoE layer), its data per rank and its training: one experiment, two ways to run it."""
    cfg: GPTConfig
    experts: int
    k: int
    capacity_factor: float
    aux_coef: float  # the weight of the load-balancing loss
    micro: int  # sequences per rank and step
    steps: int

    def build(self, ep_group=None):
        """The full model from seed 0; with an ep group, this rank's slice of its experts."""
        torch.manual_seed(0)
        full = moe.moe_gpt(self.cfg, self.experts, self.k, self.capacity_factor)
        if ep_group is None:
            return full
        model = moe.moe_gpt(self.cfg, self.experts, self.k, self.capacity_factor, ep_group=ep_group)
        state = full.state_dict()
        model.load_state_dict({k: state[k] for k in model.state_dict()})
        return model

    def chunk(self, step, rank, world):
        """Rank ``rank``'s sequences of step ``step``: one global batch, cut by rank."""
        idx, targets = make_batch(self.cfg, self.micro * world, seed=1000 + step)
        return idx[rank * self.micro:(rank + 1) * self.micro], targets[rank * self.micro:(rank + 1) * self.micro]

    def routing_of(self, model):
        """Per MoE layer: (capacity, dropped choices, tokens per expert) of its last forward."""
        return [(m.routing.capacity, m.routing.dropped, m.routing.tokens_per_expert(self.experts))
                for m in moe.moe_layers(model)]


def train_expert_parallel(rank, world, run, ep):
    """AdamW steps in ep groups of ``ep`` ranks: step 0's routing, logits, records and gradients; the end state."""
    from zero_ref.parallel.groups import build_groups
    from zero_ref.parallel.topology import Topology
    pg = build_groups(Topology.for_world(world, ep=ep), axes=("dp", "ep", "edp"))
    model = run.build(pg.ep)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-6, foreach=False)
    out = {}
    for step in range(run.steps):
        with comm.recording() as log:
            logits, loss = model(*run.chunk(step, rank, world))
            (loss + run.aux_coef * moe.aux_loss(model)).backward()
            moe.reduce_gradients(model, pg.edp, pg.dp)
        if step == 0:
            out.update(routing=run.routing_of(model), logits=logits.detach(), records=log.records,
                       grads={n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    out["state"] = {k: v.clone() for k, v in model.state_dict().items()}
    return out


def train_single_process(run, world):
    """The same training in this process: every rank's chunk routed on its own, the loss averaged over the chunks."""
    model = run.build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-6, foreach=False)
    out = {"routing": [], "logits": []}
    for step in range(run.steps):
        total = 0
        for r in range(world):
            logits, loss = model(*run.chunk(step, r, world))
            total = total + (loss + run.aux_coef * moe.aux_loss(model)) / world
            if step == 0:
                out["routing"].append(run.routing_of(model))
                out["logits"].append(logits.detach())
        total.backward()
        if step == 0:
            out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    out["state"] = {k: v.clone() for k, v in model.state_dict().items()}
    return out


def moe_forward(rank, world_size, ep_size, token_seeds):
    """DeepSpeed's MoE layer (`deepspeed.moe.layer.MoE`), here zero_ref's: 4 experts, top-2; one forward per batch
    of tokens (this rank's at ep_size 2; both ranks' batches, one after the other, in one process at ep_size 1)."""
    import torch.nn as nn

    from zero_ref.ds.moe.layer import MoE
    from zero_ref.ds.moe.utils import split_params_into_different_moe_groups_for_optimizer

    torch.manual_seed(0)
    expert = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    layer = MoE(hidden_size=8, expert=expert, num_experts=4, ep_size=ep_size, k=2, capacity_factor=1.0)
    with torch.no_grad():  # tell the experts apart: DeepSpeed copies the one expert module into every slot
        for i, e in enumerate(layer.deepspeed_moe.experts.deepspeed_experts):
            e[0].bias.add_(0.1 * (layer.ep_rank * layer.num_local_experts + i))
    results = []
    for seed in token_seeds[rank::world_size]:
        x = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(seed))
        torch.manual_seed(1)  # the routing's random draw (top-2 samples its second expert with Gumbel noise)
        out, l_aux, exp_counts = layer(x)
        results.append(dict(out=out.detach(), l_aux=l_aux.item(), counts=exp_counts.tolist()))
    groups = split_params_into_different_moe_groups_for_optimizer([{"params": list(layer.parameters()), "name": "all"}])
    return results, layer.num_local_experts, [(g["name"], sum(p.numel() for p in g["params"])) for g in groups]


def ep_moe_run(rank, world, ep_moe):
    """The student's DeepSpeed top-1 layer on this rank against DeepSpeed's MoE layer (zero_ref.ds's) holding every
    expert in one process: output, l_aux, exp_counts and the gradients of x, the gate and the rank's expert under
    (y·dy).sum() + 0.1·l_aux, the all-to-all bytes, and which of the rank's tokens each rule keeps."""
    import copy

    import torch.nn as nn

    from zero_ref.ds.moe.layer import MoE

    n, d, cf, coef = 12, 16, 1.0, 0.1                 # C = max(⌈12/4 · 1.0⌉, min_capacity 4) = 4 at E = 4
    torch.manual_seed(0)
    ref = MoE(hidden_size=d, expert=nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, d)), num_experts=world,
              k=1, capacity_factor=cf)                # DeepSpeed's defaults: min_capacity 4, use_rts True
    experts, gate = ref.deepspeed_moe.experts.deepspeed_experts, ref.deepspeed_moe.gate.wg
    with torch.no_grad():
        for i, e in enumerate(experts):               # DeepSpeed copies one expert into every slot: tell them apart
            e[0].bias.add_(0.1 * i)
        gate.weight.mul_(4.0)                         # a confident router: experts overflow, random selection matters
    xs = [torch.randn(n, d, generator=torch.Generator().manual_seed(20 + r)).requires_grad_() for r in range(world)]
    dys = [torch.randn(n, d, generator=torch.Generator().manual_seed(40 + r)) for r in range(world)]
    total = 0
    for r in range(world):                            # each rank's tokens routed on their own: C is per rank
        torch.manual_seed(100 + r)                    # the random token selection's draw
        y, l_aux, counts = ref(xs[r])
        loss = (y * dys[r]).sum() + coef * l_aux
        if r == rank:
            want = dict(y=y.detach(), l_aux=l_aux.item(), counts=counts.tolist(), kept=ref.routing.kept[:, 0].tolist(),
                        gate=torch.autograd.grad(loss, gate.weight, retain_graph=True)[0])
        total = total + loss
    total.backward()                                  # expert `rank` sums every rank's tokens
    torch.manual_seed(100 + rank)
    draw = torch.distributions.uniform.Uniform(torch.tensor(0.0), torch.tensor(1.0)).rsample((n, world))
    torch.manual_seed(rank)                           # the layer gets the draw, not the random stream behind it
    x, gate_weight = xs[rank].detach().clone().requires_grad_(), gate.weight.detach().clone().requires_grad_()
    expert = copy.deepcopy(experts[rank])
    expert.zero_grad(set_to_none=True)
    with comm.recording() as forward:
        y, l_aux, counts = ep_moe(x, gate_weight, expert, cf, draw)
    with comm.recording() as backward:
        ((y * dys[rank]).sum() + coef * l_aux).backward()
    close = lambda a, b: a is not None and torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    grads = [close(x.grad, xs[rank].grad), close(gate_weight.grad, want["gate"]),
             all(close(a.grad, b.grad) for a, b in zip(expert.parameters(), experts[rank].parameters()))]
    choice = (xs[rank].detach() @ gate.weight.detach().T).argmax(-1)
    in_order = [bool((choice[:t] == choice[t]).sum() < 4) for t in range(n)]   # the first C of each expert's queue
    a2a = [[int(r.bytes) for r in log.records if r.op == "all_to_all"] for log in (forward, backward)]
    return dict(out=close(y, want["y"]), l_aux=float(l_aux), l_aux_ref=want["l_aux"],
                counts=[int(c) for c in counts], counts_ref=want["counts"], grads=grads, a2a=a2a,
                per_call=moe.dispatch_bytes(world, 4, d), kept=sum(want["kept"]), differs=want["kept"] != in_order)


def counts_first_run(rank, world, counts_first_moe):
    """The student's dropless layer on this rank against zero_ref's single-process MoE with room for every token."""
    import copy

    cfg, n = GPTConfig(vocab_size=8, seq_len=16, d_model=16, n_heads=2, n_layers=1), 16
    torch.manual_seed(0)
    ref = moe.MoE(cfg, num_experts=world, k=1, capacity_factor=float(world))   # C = N: no token is ever dropped
    with torch.no_grad():
        ref.gate.weight.mul_(4.0)                                  # a confident router: uneven counts
    xs = [torch.randn(n, cfg.d_model, generator=torch.Generator().manual_seed(10 + r)) for r in range(world)]
    with torch.no_grad():
        y_ref = ref(xs[rank])
        assert ref.routing.dropped == 0
        choices = [(x @ ref.gate.weight.T).argmax(-1) for x in xs]
        expert = copy.deepcopy(ref.experts[str(rank)])
        with comm.recording() as log:
            y = counts_first_moe(xs[rank].clone(), ref.gate.weight.clone(), expert)
    received = sum(int((c == rank).sum()) for c in choices)      # every rank's tokens that chose expert `rank`
    return dict(out=torch.allclose(y, y_ref, rtol=1e-5, atol=1e-5), calls=[(r.op, int(r.bytes)) for r in log.records],
                counts=torch.bincount(choices[rank], minlength=world).tolist(), received=received,
                dispatch=n * cfg.d_model * 4, combine=received * cfg.d_model * 4,
                fixed_slots=moe.dispatch_bytes(world, n, cfg.d_model))


# DeepSeek-V3 (arXiv 2412.19437): the configuration of §4.2, the cluster and parallelism of §3.1–3.2
# (2,048 H800s, 8 per node, NVLink 160 GB/s, InfiniBand 50 GB/s per GPU; PP 16, EP 64 over 8 nodes, ZeRO-1
# data parallelism; each token sent to at most 4 nodes) and the cost of §1 (180K H800 GPU hours per trillion tokens).
DSV3 = dict(layers=61, dense_layers=3, hidden=7168, heads=128, vocab=129280, seq=4096, experts=256, shared=1, k=8,
            expert_ffn=2048, dense_ffn=18432, q_rank=1536, kv_rank=512, qk_nope=128, qk_rope=64, v_head=128,
            gpus=2048, gpus_per_node=8, pp=16, ep=64, nvlink=160e9, ib=50e9, max_nodes=4,
            gpu_hours_per_trillion=180e3)


def dsv3_params(c=DSV3):
    """(total, active per token, active per MoE layer) parameters of DeepSeek-V3 (the MTP module left out)."""
    h, a = c["hidden"], c["heads"]
    mla = (h * c["q_rank"] + c["q_rank"] * a * (c["qk_nope"] + c["qk_rope"])           # queries, low-rank
           + h * (c["kv_rank"] + c["qk_rope"]) + c["kv_rank"] * a * (c["qk_nope"] + c["v_head"])   # keys, values
           + a * c["v_head"] * h)                                                      # output projection
    expert, router = 3 * h * c["expert_ffn"], h * c["experts"]
    moe_layers = c["layers"] - c["dense_layers"]
    dense = c["dense_layers"] * (mla + 3 * h * c["dense_ffn"]) + 2 * c["vocab"] * h
    layer_active = mla + (c["k"] + c["shared"]) * expert + router
    total = dense + moe_layers * (mla + (c["experts"] + c["shared"]) * expert + router)
    return total, dense + moe_layers * layer_active, layer_active


def dsv3_sim(c=DSV3):
    """(model of the 58 MoE layers, H800 cluster, plan, MoE) for ``sim.cost.moe``: an H800 is an H100's
    989 TFLOP/s with NVLink at 160 GB/s; one 4,096-token sequence per micro-batch."""
    import sim
    from sim.cost.moe import MoE
    model = sim.Model("DeepSeek-V3 MoE layers", layers=c["layers"] - c["dense_layers"], hidden=c["hidden"],
                      heads=c["heads"], vocab=c["vocab"], seq=c["seq"], ffn=c["expert_ffn"], gated=True, bias=False,
                      tied=False, norm="rmsnorm", positions="rotary", dropout=False)
    cluster = sim.Cluster.preset("H100-80GB", nodes=c["gpus"] // c["gpus_per_node"], nvlink_bw=c["nvlink"],
                                 ib_bw=c["gpus_per_node"] * c["ib"])
    plan = sim.Plan(pp=c["pp"], dp=c["gpus"] // c["pp"], zero_stage=1)
    return model, cluster, plan, MoE(num_experts=c["experts"], k=c["k"], capacity_factor=1.0, ep=c["ep"])


def dsv3_attention_flops(c=DSV3) -> float:
    """Forward FLOPs of one layer's causal attention core on one sequence: s²/2 · heads · 2·(d_qk + d_v)."""
    return c["seq"] ** 2 * c["heads"] * (c["qk_nope"] + c["qk_rope"] + c["v_head"])


def dsv3_price(c=DSV3) -> dict:
    """One MoE layer of DeepSeek-V3, one sequence, per GPU, priced as the simulator prices it (seconds).

    compute   the active parameters' GEMMs forward + backward (3 × 2·N·s) at the GEMM rate, plus the causal
              attention core as ``sim.cost.flops.layer_flops`` books FlashAttention: forward, and 2.5 × it in
              backward, at FlashAttention's efficiency
    a2a       ``sim.cost.moe``'s four all-to-alls, every copy of a token sent in bf16 to its expert's GPU
    routed    a2a with DeepSeek's routing and FP8 (§3.3–3.4): one InfiniBand copy per node and at most
              ``max_nodes`` nodes where the simulator sends (ep − 8)/ep of the k copies across; the forward
              dispatch and the backward's activation gradients to the experts in FP8, both combines in bf16
              (2 of the 4 all-to-alls at half the bytes: × 3/4)
    and tokens per GPU per second: published (180K GPU hours per trillion tokens), and simulated with every
    all-to-all exposed or all hidden."""
    import sim
    from sim.cost.cost_model import CostModel
    from sim.cost.moe import moe_cost
    model, h800, plan, experts = dsv3_sim(c)
    cost = moe_cost(model, h800, plan, experts)
    gemm_rate = CostModel(h800, plan).flops_rate
    attention_rate = h800.gpu.peak_flops * sim.Costs().attention_efficiency
    _, active, layer_active = dsv3_params(c)
    attention = (1 + 2.5) * dsv3_attention_flops(c) / attention_rate          # forward + FlashAttention's backward
    compute = 3 * 2 * layer_active * c["seq"] / gemm_rate + attention
    a2a = cost.all_to_all["forward"] + cost.all_to_all["backward"]
    routed = a2a * c["max_nodes"] / (c["k"] * (c["ep"] - c["gpus_per_node"]) / c["ep"]) * 3 / 4
    per_token = 6 * active / gemm_rate + (c["layers"] * attention) / c["seq"]
    moe_layers = c["layers"] - c["dense_layers"]
    return dict(compute=compute, a2a=a2a, routed=routed, mfu_peak=h800.gpu.peak_flops,
                published=1e12 / (c["gpu_hours_per_trillion"] * 3600),
                exposed=1 / (per_token + moe_layers * routed / c["seq"]), hidden=1 / per_token, active=active)
