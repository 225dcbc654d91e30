"""Field checks shared by the spec dataclasses: each names the owner, the field and the bad value."""


def positive_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")


def positive_number(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{owner}.{name} must be a positive number, got {value!r}")


def one_of(owner: str, name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{owner}.{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
