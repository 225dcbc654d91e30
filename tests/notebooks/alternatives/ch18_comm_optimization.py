"""Chapter 18: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

# Task 18.1 (qgZ): chunks sliced by index, rows stacked, a loop for the sum; within the node integers and scales
# packed into one byte buffer (one all-to-all), across nodes the scales sent before the integers
RIGHT = {
    "18.1": '''
rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
nodes, s = world // node_size, flat.numel() // world

def send_rows(rows, group, packed):
    width = rows[0].numel()
    table = torch.stack(rows)
    q, sc = block_quant.quantize(table, bits=4, rows=len(rows), block=block)
    if packed:
        q2, s2 = q.reshape(len(rows), -1), sc.reshape(len(rows), -1)
        out = torch.cat([q2.view(torch.uint8), s2.view(torch.uint8)], dim=1).contiguous()
        got = torch.empty_like(out)
        comm.all_to_all(got, out, group=group)
        cut = q2.shape[1]
        q_out = got[:, :cut].contiguous().view(q.dtype).reshape(q.shape)
        sc_out = got[:, cut:].contiguous().view(torch.float32).reshape(sc.shape)
    else:
        q_out, sc_out = torch.empty_like(q), torch.empty_like(sc)
        comm.all_to_all(sc_out, sc, group=group)
        comm.all_to_all(q_out, q, group=group)
    back = block_quant.dequantize(q_out, sc_out, width, bits=4, rows=len(rows)).reshape(len(rows), width)
    total = torch.zeros(width)
    for row in back:
        total += row
    return total

chunk = lambda m, l: flat[(m * node_size + l) * s:(m * node_size + l + 1) * s].float()
partial = send_rows([torch.cat([chunk(m, l) for m in range(nodes)]) for l in range(node_size)], intra, True)
if nodes == 1:
    return partial
return send_rows([partial[m * s:(m + 1) * s] for m in range(nodes)], inter, False)
''',
}

_QGZ = '''
world = torch.distributed.get_world_size()
L, M = node_size, world // node_size
s = flat.numel() // world

def exchange(rows, group, bits=4, blk=block):
    n, width = rows.shape
    q, scales = block_quant.quantize(rows, bits=bits, rows=n, block=blk)
    q_in, s_in = torch.empty_like(q), torch.empty_like(scales)
    comm.all_to_all(q_in, q, group=group)
    comm.all_to_all(s_in, scales, group=group)
    return block_quant.dequantize(q_in, s_in, width, bits=bits, rows=n).reshape(n, width)

chunks = flat.float().reshape(M, L, s)
'''

MORE_WRONG = [
    # the wrong group: step 1 across nodes, step 2 within the node (links and results differ)
    {"18.1": _QGZ + '''
partial = exchange(chunks.transpose(0, 1).reshape(L, M * s), inter).sum(dim=0)
return exchange(partial.reshape(M, s), intra).sum(dim=0)
'''},
    # quantize after the sum: step 1 exchanges fp32 and sums, only step 2 is quantized (8× step 1's bytes)
    {"18.1": _QGZ + '''
rows = chunks.transpose(0, 1).reshape(L, M * s).contiguous()
got = torch.empty_like(rows)
comm.all_to_all(got, rows, group=intra)
partial = got.sum(dim=0)
return exchange(partial.reshape(M, s), inter).sum(dim=0)
'''},
    # one scale per row (per tensor chunk) instead of per block of 512: fewer scale bytes, coarser result
    {"18.1": _QGZ + '''
partial = exchange(chunks.transpose(0, 1).reshape(L, M * s), intra, blk=M * s).sum(dim=0)
return exchange(partial.reshape(M, s), inter, blk=s).sum(dim=0)
'''},
    # int8 instead of int4: twice the integer bytes
    {"18.1": _QGZ + '''
partial = exchange(chunks.transpose(0, 1).reshape(L, M * s), intra, bits=8).sum(dim=0)
return exchange(partial.reshape(M, s), inter, bits=8).sum(dim=0)
'''},
    # int4 unpacked by hand without sign extension: nibbles 8..15 read as +8..+15 instead of −8..−1
    {"18.1": '''
world = torch.distributed.get_world_size()
L, M = node_size, world // node_size
s = flat.numel() // world

def exchange(rows, group):
    n, width = rows.shape
    q, scales = block_quant.quantize(rows, bits=4, rows=n, block=block)
    q_in, s_in = torch.empty_like(q), torch.empty_like(scales)
    comm.all_to_all(q_in, q, group=group)
    comm.all_to_all(s_in, scales, group=group)
    b = q_in.to(torch.int16)
    ints = torch.stack((b & 0xF, b >> 4), dim=1).reshape(-1).float()
    values = (ints.reshape(s_in.numel(), -1) * s_in[:, None]).reshape(n, -1)[:, :width]
    return values

partial = exchange(flat.float().reshape(M, L, s).transpose(0, 1).reshape(L, M * s), intra).sum(dim=0)
return exchange(partial.reshape(M, s), inter).sum(dim=0)
'''},
]

# Task 18.2: mean |x| as the scale, padding with F.pad, one row per rank, torch.distributed's world size
RIGHT["18.2"] = '''
def __init__(self, error_feedback=True):
    self.ef, self.memory = error_feedback, {}

def __call__(self, bucket, group):
    flat = bucket.flat_grad
    world = torch.distributed.get_world_size(group)
    x = torch.nn.functional.pad(flat.float(), (0, (-flat.numel()) % 8))
    if self.ef and bucket.index in self.memory:
        x = x + self.memory[bucket.index]
    c = x.abs().mean()
    sent = torch.where(x >= 0, c, -c)
    if self.ef:
        self.memory[bucket.index] = x - sent
    packed = C.pack_signs(x)
    out = torch.empty(world, packed.numel(), dtype=torch.uint8)
    cs = torch.empty(world)
    comm.all_gather(out.view(-1), packed, group=group)
    comm.all_gather(cs, c.reshape(1), group=group)
    total = sum(C.unpack_signs(out[r]) * cs[r] for r in range(world)) / world
    flat.copy_(total[:flat.numel()])
'''

# Task 18.2: one error buffer shared by every bucket, used only when its shape fits: with two buckets of
# different sizes it never does, so no error is ever fed back
MORE_WRONG.append({"18.2": '''
def __init__(self, error_feedback=True):
    self.error_feedback, self.error = error_feedback, None

def __call__(self, bucket, group):
    g = bucket.flat_grad
    n, numel = comm.get_world_size(group), g.numel()
    x = torch.zeros(-(-numel // 8) * 8)
    x[:numel] = g.float()
    if self.error_feedback and self.error is not None and self.error.shape == x.shape:
        x += self.error
    scale = (x.norm() / x.numel() ** 0.5).reshape(1)
    signs = C.pack_signs(x)
    if self.error_feedback:
        self.error = x - scale * C.unpack_signs(signs)
    all_signs, scales = torch.empty(n * signs.numel(), dtype=torch.uint8), torch.empty(n)
    comm.all_gather(all_signs, signs, group=group)
    comm.all_gather(scales, scale, group=group)
    g.copy_((C.unpack_signs(all_signs.view(n, -1)) * scales.unsqueeze(1)).mean(0)[:numel])
'''})
