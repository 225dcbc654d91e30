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
