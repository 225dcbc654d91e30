"""Chapter 18: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # count where a new bucket starts, walking the sizes backwards
    "18.1": '''
starts, size = 0, 0
for n in numels[::-1]:
    if starts == 0 or size + n > bucket_size:
        starts, size = starts + 1, 0
    size += n
return starts
''',
}

WRONG = {
    # a tensor of shape (n, a, b) taken as an n × a matrix: the trailing dimensions are forgotten
    "18.2": '''
total = 0
for s in shapes:
    if len(s) >= 2 and s[0] * s[1] > min_compression_rate * rank * (s[0] + s[1]):
        total += 4 * min(rank, s[0], s[1]) * (s[0] + s[1])
    else:
        total += 4 * math.prod(s)
return total
''',
}

# Task 18.3: mean |x| as the scale, padding with F.pad, one row per rank, torch.distributed's world size
RIGHT["18.3"] = '''
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
