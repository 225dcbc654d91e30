"""Chapter 25's DeepSeek-V3 price (course.labs.ch25.dsv3_price): the numbers its prose quotes."""
from course.labs import ch25


def test_dsv3_price_is_what_chapter_25_quotes():
    p = ch25.dsv3_price()
    ms = [f"{1e3 * p[k]:.1f}" for k in ("compute", "a2a", "routed")]
    assert ms == ["33.6", "58.1", "24.9"]
    assert [f"{p[k] / p['compute']:.2f}" for k in ("a2a", "routed")] == ["1.73", "0.74"]
    assert [f"{p[k]:,.0f}" for k in ("exposed", "published", "hidden")] == ["1,150", "1,543", "1,934"]


def test_fp8_halves_two_of_the_four_all_to_alls():
    # forward dispatch and the backward's gradient dispatch in FP8, both combines in bf16: × (2·½ + 2)/4
    p = ch25.dsv3_price()
    c = ch25.DSV3
    copies = c["k"] * (c["ep"] - c["gpus_per_node"]) / c["ep"]
    assert abs(p["routed"] / (p["a2a"] * c["max_nodes"] / copies) - 3 / 4) < 1e-12
