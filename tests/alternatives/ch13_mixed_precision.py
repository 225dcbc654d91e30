"""Chapter 13: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # unpacked state, integer halving (2**k // 2), a fresh dict built at the end
    "13.1": '''
scale, left, it, last = state["scale"], state["hysteresis"], state["iter"], state["last_overflow"]
if overflow:
    last = it
    if min(hysteresis, left) > 1:
        left -= 1
    else:
        scale = max(scale // 2, min_scale)
else:
    stable = it - last - 1
    if stable > 0 and stable % window == 0:
        scale, left = scale * 2, hysteresis
return {"scale": scale, "hysteresis": left, "iter": it + 1, "last_overflow": last}
''',
}

WRONG = {
    # compares with 65504 instead of casting: misses the values that round down to 65504
    "13.2": '''
k = math.floor(math.log2(torch.finfo(torch.float16).max / grad.abs().max().item()))
return 2.0 ** k
''',
}
