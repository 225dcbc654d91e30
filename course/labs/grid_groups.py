"""Task 21.1's check: on a rank, the library's own group construction refuses, so the student's builds the groups."""


def library_groups_off(task: str = "Task 21.1") -> None:
    """Make ``Topology``'s rank arithmetic and ``build_groups`` raise in this process."""
    from zero_ref.parallel import groups, topology

    def switched_off(*args, **kwargs):
        raise RuntimeError(f"{task}: build the groups from the rank numbers, without Topology or build_groups")

    for name in ("groups", "group_of", "coords", "coord", "rank", "node_of"):
        setattr(topology.Topology, name, switched_off)
    setattr(groups, "build_groups", switched_off)
